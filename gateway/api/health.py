"""Liveness for load balancers and operators."""

from __future__ import annotations

from .base import JSONHandler


class HealthHandler(JSONHandler):
    public = True  # load balancers probe without a token

    async def get(self) -> None:
        self.send({"status": "ok", "sessions": len(self.manager.sessions)})


routes = [(r"/healthz", HealthHandler)]
