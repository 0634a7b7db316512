"""Liveness for load balancers and operators."""

from __future__ import annotations

from .base import JSONHandler


class HealthHandler(JSONHandler):
    public = True  # load balancers probe without a token

    async def get(self) -> None:
        manager = self.manager
        pool = {name: stats["ready"] for name, stats in manager.pool.stats().items()}
        self.send({"status": "ok", "sessions": len(manager.sessions), "pool_ready": pool})


routes = [(r"/healthz", HealthHandler)]
