"""``GET /v1/kernels``: the kernels a session can ask for, and which are ready to start."""

from __future__ import annotations

from .base import JSONHandler


class KernelCatalogHandler(JSONHandler):
    async def get(self) -> None:
        specs = self.kernelspecs
        kernels = await specs.catalog(self.images)
        self.send({"default": specs.default, "kernels": kernels})


routes = [(r"/v1/kernels/?", KernelCatalogHandler)]
