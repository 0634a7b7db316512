"""Each sandbox's MCP token: what opens its MCP URL (E2B's ``get_mcp_token()``) and nothing else.

The stock SDK makes the token itself (a random UUID) and hands it to the
``mcp-gateway`` command it runs in the sandbox right after create; the E2B
edge takes that command as the token's registration (by a caller holding the
sandbox's own access token). Only a digest is kept, with the API token it
was registered under, so the token itself is in no memory, record or log.
Kept in memory: a restarted gateway forgets it (the MCP URL then answers 401).
"""

from __future__ import annotations

import hashlib
import hmac

MIN_LENGTH = 32  # characters: the SDK's UUID is 36; a guessable token is refused


class McpTokens:
    """The one MCP token of each sandbox that has one."""

    def __init__(self) -> None:
        self._digests: dict[str, tuple[bytes, str]] = {}  # sandbox id -> (digest, holder)

    def register(self, sandbox_id: str, token: str, holder: str) -> None:
        """``token`` opens ``sandbox_id``'s MCP URL from now on, acting for ``holder``."""
        if len(token) < MIN_LENGTH:
            raise ValueError(f"an MCP token is at least {MIN_LENGTH} characters")
        self._digests[sandbox_id] = (_digest(token), holder)

    def holder(self, sandbox_id: str, token: str | None) -> str | None:
        """Whose token ``token`` is, if it is ``sandbox_id``'s MCP token; else None."""
        kept = self._digests.get(sandbox_id)
        if kept is None or not token or not hmac.compare_digest(kept[0], _digest(token)):
            return None
        return kept[1]

    def forget(self, sandbox_id: str) -> None:
        self._digests.pop(sandbox_id, None)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
