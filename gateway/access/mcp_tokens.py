"""Each sandbox's MCP token: what opens its MCP URL (E2B's ``get_mcp_token()``) and nothing else.

The stock SDK makes the token itself (a random UUID) and hands it to the
``mcp-gateway`` command it runs in the sandbox right after create; the E2B
edge takes that command as the token's registration (by a caller holding the
sandbox's own access token). The registration is kept in the session's
record: an HMAC of the token under the sandbox-token key, and the API token
it was registered under. A restarted gateway, or another on the shared store
that takes the session over, checks the token as the first did; the token
itself is in no memory, record or log, and a reader of the store cannot test
guesses without the key. It lives as long as its session: a later session of
the same id has no registration, or another.

A ``connect``ed SDK reads the token from a file (``issue``); the UUID being
kept nowhere, the gateway answers a token of its own, ``<holder>.<HMAC>`` of
the sandbox, its registration and the reader's API token id: it ends with
the registration too, and no sandbox or volume token passes for one.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from .sandbox_tokens import SandboxTokens

MIN_LENGTH = 32  # characters: the SDK's UUID is 36; a guessable token is refused

Registration = Mapping[str, str]  # {"digest": HMAC of the token, "holder": API token id}


class McpTokens:
    """The MCP tokens of each sandbox that registered one.

    ``registered``: a live sandbox's registration (its session's), None if none.
    """

    def __init__(
        self, tokens: SandboxTokens, registered: Callable[[str], Registration | None]
    ) -> None:
        self.tokens = tokens
        self.registered = registered

    def registration(self, sandbox_id: str, token: str, holder: str) -> dict[str, str]:
        """What the session keeps so that ``token`` opens ``sandbox_id``'s MCP URL, acting
        for ``holder``."""
        if len(token) < MIN_LENGTH:
            raise ValueError(f"an MCP token is at least {MIN_LENGTH} characters")
        return {"digest": self._digest(sandbox_id, token), "holder": holder}

    def holder(self, sandbox_id: str, token: str | None) -> str | None:
        """Whose token ``token`` is, if it is one of ``sandbox_id``'s MCP tokens; else None."""
        kept = self.registered(sandbox_id)
        if kept is None or not token:
            return None
        if hmac.compare_digest(self._digest(sandbox_id, token).encode(), kept["digest"].encode()):
            return kept["holder"]
        return self.tokens.holder(_subject(sandbox_id, kept), token)

    def issue(self, sandbox_id: str, holder: str) -> str | None:
        """A token of ``sandbox_id``'s MCP URL for ``holder`` (None: it registered none)."""
        kept = self.registered(sandbox_id)
        return None if kept is None else self.tokens.issue(_subject(sandbox_id, kept), holder)

    def _digest(self, sandbox_id: str, token: str) -> str:
        return self.tokens.mac(f"mcp-registered\0{sandbox_id}", token)


def _subject(sandbox_id: str, kept: Registration) -> str:
    return f"mcp\0{sandbox_id}\0{kept['digest']}"
