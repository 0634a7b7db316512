"""The API's contract, ``GET /v1/openapi.json``: the checked-in OpenAPI document, as is.

``gateway/openapi.json`` is the one source; tests check every route and real
response against it (docs/api.md).
"""

from __future__ import annotations

from pathlib import Path

from .base import JSONHandler

DOCUMENT = Path(__file__).resolve().parent.parent / "openapi.json"
# Read once at import, before the loop serves anything; it never changes while running.
_BODY = DOCUMENT.read_bytes()


class OpenAPIHandler(JSONHandler):
    public = True  # clients and tools read the contract before they have a token

    async def get(self) -> None:
        self.finish(_BODY)


routes = [(r"/v1/openapi\.json", OpenAPIHandler)]
