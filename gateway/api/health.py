"""Liveness for load balancers and operators.

The gateway answers 200 while its engine is down (its running sessions keep
working); ``engine`` says so, and creates answer 503 until it is back.
"""

from __future__ import annotations

from .base import JSONHandler


class HealthHandler(JSONHandler):
    public = True  # load balancers probe without a token

    async def get(self) -> None:
        self.send({"status": "ok", **self.reports.health()})


routes = [(r"/healthz", HealthHandler)]
