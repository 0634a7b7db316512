"""Who an MCP call acts for: over HTTP, the caller's own gateway token.

``sbx mcp --http`` may be shared by many people. It holds no token of its
own for them: each request carries ``Authorization: Bearer <gateway token>``,
checked against the gateway, and every tool call is made with that same
token, so the gateway's tenants keep one caller's sessions from another's.
Over stdio the one user's configured client is used.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from ..client import AsyncClient, Unauthorized

# Clients kept for recent callers; the least recently used is closed past this many.
MAX_CLIENTS = 256
# How long a token the gateway accepted is believed without asking again (the gateway
# itself still checks it on every call).
VERIFIED_FOR = 60.0


class GatewayClients:
    """An SDK client per caller: the caller's token over HTTP, else ``default``."""

    def __init__(self, url: str, default: AsyncClient | None) -> None:
        self.url = url
        self.default = default
        self._clients: OrderedDict[str, AsyncClient] = OrderedDict()
        self._verified: dict[str, float] = {}  # token -> when it was last accepted

    async def current(self) -> AsyncClient:
        """The client for this request's caller; tools call it for each request."""
        token = get_access_token()
        if token is None:
            if self.default is None:  # the HTTP transport lets no unauthenticated call through
                raise RuntimeError("no caller token and no default client")
            return self.default
        return await self._client_for(token.token)

    async def _client_for(self, token: str) -> AsyncClient:
        client = self._clients.pop(token, None) or AsyncClient(self.url, token)
        self._clients[token] = client
        while len(self._clients) > MAX_CLIENTS:
            _, oldest = self._clients.popitem(last=False)
            await oldest.aclose()
        return client

    async def verify_token(self, token: str) -> AccessToken | None:
        """The MCP SDK's TokenVerifier hook: accept a token the gateway accepts."""
        now = time.monotonic()
        if now - self._verified.get(token, -VERIFIED_FOR) >= VERIFIED_FOR:
            try:
                await (await self._client_for(token)).list_sessions(state="starting")
            except Unauthorized:
                self._verified.pop(token, None)
                return None
            self._verified[token] = now
        caller = hashlib.sha256(token.encode()).hexdigest()[:12]
        return AccessToken(token=token, client_id=caller, scopes=[])

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
