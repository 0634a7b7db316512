"""The kernels the gateway offers, read from ``kernels/*/kernel.json``.

Each kernelspec names, under ``metadata.sandbox``, the image directory (in
``images/``) its container is built from and the user it runs as.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel

from .errors import KernelNotFound


class KernelSpecs:
    """Lookup of offered kernelspecs; only the gateway's own directory counts."""

    def __init__(self, kernels_dir: Path) -> None:
        self.manager = KernelSpecManager(kernel_dirs=[str(kernels_dir)], ensure_native_kernel=False)

    def names(self) -> list[str]:
        return sorted(self.manager.find_kernel_specs())

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
