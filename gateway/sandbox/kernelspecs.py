"""The kernels the gateway offers, read from ``kernels/*/kernel.json``.

Each kernelspec names, under ``metadata.sandbox``, the image directory (in
``images/``) its container is built from and the user it runs as.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel

from ..errors import KernelNotFound
from .images import ImageBuilder


class KernelSpecs:
    """Lookup of offered kernelspecs; only the gateway's own directory counts."""

    def __init__(self, kernels_dir: Path) -> None:
        self.manager = KernelSpecManager(kernel_dirs=[str(kernels_dir)], ensure_native_kernel=False)

    def names(self) -> list[str]:
        return sorted(self.manager.find_kernel_specs())

    @property
    def default(self) -> str:
        """The kernel a client gets when it names none."""
        names = self.names()
        return "python3" if "python3" in names else (names[0] if names else "")

    def get(self, name: str) -> KernelSpec:
        try:
            return self.manager.get_kernel_spec(name)
        except NoSuchKernel:
            raise KernelNotFound(
                f"no kernel {name!r}; available kernels: {', '.join(self.names()) or 'none'}"
            ) from None

    def sandbox(self, name: str) -> dict[str, Any]:
        """The ``metadata.sandbox`` section: image directory, user."""
        return dict(self.get(name).metadata.get("sandbox", {}))

    async def catalog(self, images: ImageBuilder) -> list[dict[str, Any]]:
        """Each kernel: its names, language, image and whether that image is built."""
        # It asks the engine about every image: a thread, not the loop.
        return await asyncio.to_thread(self._catalog, images)

    def _catalog(self, images: ImageBuilder) -> list[dict[str, Any]]:
        rows = []
        for name in self.names():
            spec = self.get(name)
            image = self.sandbox(name).get("image", name)
            tag = images.tag_for(image)
            rows.append(
                {
                    "name": name,
                    "display_name": spec.display_name,
                    "language": spec.language,
                    "interrupt_mode": spec.interrupt_mode,
                    "image": image,
                    "image_tag": tag,
                    "built": images.exists(tag),
                }
            )
        return rows
