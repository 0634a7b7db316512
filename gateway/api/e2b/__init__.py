"""The E2B-compatible edge: the stock ``e2b`` / ``e2b-code-interpreter`` SDKs, unmodified.

A thin translation onto the gateway's sessions, execution, files and auth
(docs/e2b.md has the whole table). ``control`` is E2B's control API;
``interpreter`` the code interpreter's port (49999); ``envd`` and ``rpc``
envd's port (49983): its HTTP file endpoint and its Connect RPC services
(``filesystem``, ``process``), run by ``connect``'s ASGI bridge.
``base`` says which sandbox a request is for and checks its credentials.
"""

from __future__ import annotations

from . import builds, control, envd, interpreter, mcp, rpc, secrets, volume_content, volumes
from .base import Credentials

__all__ = ["Credentials", "routes"]

routes = [
    *builds.routes,  # its /templates/tags before control's /templates/{snapshot}
    *control.routes,
    *secrets.routes,
    *volumes.routes,
    *volume_content.routes,
    *interpreter.routes,
    *envd.routes,
    *rpc.routes,
    *mcp.routes,
]
