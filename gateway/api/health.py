"""Liveness for load balancers and operators."""

from __future__ import annotations

from .base import JSONHandler


class HealthHandler(JSONHandler):
    async def get(self) -> None:
        self.send({"status": "ok", "sessions": len(self.manager.sessions)})


routes = [(r"/healthz", HealthHandler)]
