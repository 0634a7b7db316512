"""``GET /metrics``: Prometheus text exposition, for admins (and their scrapers)."""

from __future__ import annotations

from ..observe.metrics import CONTENT_TYPE
from .base import JSONHandler


class MetricsHandler(JSONHandler):
    async def get(self) -> None:
        self.require_admin("the metrics endpoint")
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.settings["sbx_metrics"].exposition())


routes = [(r"/metrics", MetricsHandler)]
