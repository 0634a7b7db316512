"""Signed preview links: one session's one port, for a person in a browser, until they expire.

A link carries ``sbx_preview=<expiry>.<HMAC of the session id, port and
expiry>`` under the sandbox-token key (``sandbox_tokens.py``; the message
is marked as a preview's, so no sandbox token can pass for a link nor the
reverse). It opens nothing but that port of that session, and nothing once
it has expired; a browser is given the same value once as a cookie (named
for the session and port, scoped to the preview's origin or path) so the
page's own requests carry it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import BadRequest
from .sandbox_tokens import SandboxTokens

ARGUMENT = "sbx_preview"  # the query argument a link carries
MAX_LIFETIME = 7 * 86400  # seconds: a link expires within a week
DEFAULT_LIFETIME = 3600


def cookie_name(session_id: str, port: int) -> str:
    """The cookie a browser keeps a link's signature in: one per session and port."""
    return f"sbx_preview_{session_id}_{port}"


class PreviewLinks:
    """Signs and checks preview links."""

    def __init__(self, tokens: SandboxTokens, clock: Callable[[], float] = time.time) -> None:
        self.tokens = tokens
        self.clock = clock

    def sign(
        self, session_id: str, port: int, lifetime: float = DEFAULT_LIFETIME
    ) -> tuple[str, int]:
        """A link's signature for ``port`` of ``session_id``, and when it expires (Unix time)."""
        if not 0 < lifetime <= MAX_LIFETIME:
            raise BadRequest(
                f"expires_in must be between 1 and {MAX_LIFETIME} seconds (a week); "
                "make a new link when one runs out"
            )
        expires = int(self.clock() + lifetime)
        return f"{expires}.{self._mac(session_id, port, expires)}", expires

    def valid(self, signature: str | None, session_id: str, port: int) -> bool:
        """Whether ``signature`` was made for this session and port and has not expired."""
        expires, _, mac = (signature or "").partition(".")
        if (
            not (expires.isascii() and expires.isdigit())
            or len(expires) > 12
            or int(expires) <= self.clock()
        ):
            return False
        issued = self.tokens.holder(self._subject(session_id, port, int(expires)), f"link.{mac}")
        return issued == "link"

    def _mac(self, session_id: str, port: int, expires: int) -> str:
        token = self.tokens.issue(self._subject(session_id, port, expires), "link")
        return token.rpartition(".")[2]

    @staticmethod
    def _subject(session_id: str, port: int, expires: int) -> str:
        return f"preview\0{session_id}\0{port}\0{expires}"
