"""Signed file URLs (the E2B SDK's ``download_url`` / ``upload_url``): one file, one way, a while.

The SDK signs ``path:operation:user:token:expiration`` with SHA-256, the
token being the sandbox token it holds. A sandbox's tokens differ by holder
(``sandbox_tokens.py``), so the gateway tries the token of each API token
that may act for the sandbox's tenant (a handful), which also tells whose
link it is. A URL grants what it was signed for and nothing else: a read
(GET) or a write (POST) of its ``path``, on the file route alone (the edge
refuses a signature anywhere else). It must expire, within ``MAX_LIFETIME``,
so a link that leaks stops working by itself; before then it can be revoked:
its signature is kept until it expires (at most ``MAX_REVOKED`` at once) in
``revoked-file-urls.json`` in the data directory, so a restart keeps it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import BadRequest, Conflict, Unauthorized
from .sandbox_tokens import SandboxTokens

MAX_LIFETIME = 86400  # seconds: a signed URL expires within a day
MAX_REVOKED = 10_000  # revoked URLs kept at once (each until it expires)
OPERATIONS = {"GET": "read", "POST": "write"}


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a valid signed URL allows: one operation on one path, for its token's holder."""

    operation: str  # "read" or "write"
    path: str
    holder: str  # the id of the API token whose sandbox token signed it


class FileUrls:
    """Checks signed file URLs against a sandbox's tokens; keeps the revoked ones."""

    def __init__(
        self,
        tokens: SandboxTokens,
        path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``path``: where revocations are kept (None: in memory only)."""
        self.tokens = tokens
        self.path = path
        self.clock = clock
        self.revoked: dict[str, float] = {}  # signature: when it expires anyway
        self._saving = asyncio.Lock()
        if path is not None and path.is_file():
            now = clock()
            kept = json.loads(path.read_text())
            self.revoked = {s: float(e) for s, e in kept.items() if float(e) > now}

    @classmethod
    def in_data_dir(cls, tokens: SandboxTokens, data_dir: Path) -> FileUrls:
        return cls(tokens, data_dir / "revoked-file-urls.json")

    def grant(self, sandbox_id: str, method: str, query: str, holders: Iterable[str]) -> Grant:
        """What the signature in ``query`` allows a ``method`` request (else Unauthorized, saying
        why); ``holders``: the ids of the API tokens that may hold the sandbox's token."""
        args = arguments(query)
        operation = OPERATIONS.get(method)
        if operation is None:
            raise Unauthorized("a signed URL is for a download (GET) or an upload (POST) only")
        expiration = args.get("signature_expiration")
        if expiration is None:
            raise Unauthorized(
                "this signed URL has no expiry; sign one that has: download_url(path, "
                f"use_signature_expiration=SECONDS) or upload_url(...), {MAX_LIFETIME} at most"
            )
        now = self.clock()
        if not (expiration.isascii() and expiration.isdigit()) or int(expiration) <= now:
            raise Unauthorized("this signed URL has expired; sign a new one")
        if int(expiration) > now + MAX_LIFETIME:
            raise Unauthorized(
                f"this signed URL expires more than a day ({MAX_LIFETIME} s) from now; "
                "sign one for a day at most"
            )
        holder = self._holder(sandbox_id, args, operation, holders)
        if holder is None:
            raise Unauthorized(
                "the URL's signature is not valid for this sandbox, path and operation "
                "(a download URL reads with GET, an upload URL writes with POST)"
            )
        if args["signature"] in self.revoked:
            raise Unauthorized("this signed URL was revoked; sign a new one")
        return Grant(operation, args.get("path", ""), holder)

    async def revoke(self, sandbox_id: str, url: object, holders: Iterable[str]) -> None:
        """Refuse ``url`` (a signed URL of the sandbox, either operation) from now on."""
        if not isinstance(url, str):
            raise BadRequest("url must be the signed URL, a string")
        args = arguments(urllib.parse.urlsplit(url).query)
        holders = tuple(holders)
        if not any(self._holder(sandbox_id, args, op, holders) for op in OPERATIONS.values()):
            raise BadRequest(
                "url must be a signed file URL of this sandbox (download_url or upload_url)"
            )
        expiration = args.get("signature_expiration", "")
        now = self.clock()
        if not (expiration.isascii() and expiration.isdigit()) or int(expiration) <= now:
            return  # refused anyway: without an expiry, or past it
        self.revoked = {s: e for s, e in self.revoked.items() if e > now}
        if len(self.revoked) >= MAX_REVOKED:
            raise Conflict(
                f"{MAX_REVOKED} revoked URLs have not expired yet; try again once some have "
                f"(within {MAX_LIFETIME} s)"
            )
        self.revoked[args["signature"]] = float(expiration)
        if self.path is not None:
            async with self._saving:
                await asyncio.to_thread(_write, self.path, dict(self.revoked))

    def _holder(
        self, sandbox_id: str, args: dict[str, str], operation: str, holders: Iterable[str]
    ) -> str | None:
        """Whose sandbox token signed ``args`` for ``operation``, if any of ``holders``'s did."""
        signature = args.get("signature")
        if not signature:
            return None
        expiration = args.get("signature_expiration")
        signed = f"{args.get('path', '')}:{operation}:{args.get('username', '')}"
        for holder in holders:
            raw = f"{signed}:{self.tokens.issue(sandbox_id, holder)}"
            raw += f":{expiration}" if expiration is not None else ""
            digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=")
            if hmac.compare_digest(signature.encode(), b"v1_" + digest):
                return holder
        return None


def arguments(query: str) -> dict[str, str]:
    """A signed URL's query arguments; each may be named once (a second ``path`` would let
    the handler read another value than the one signed)."""
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    args = dict(pairs)
    if len(args) != len(pairs):
        raise BadRequest("a signed URL names each query argument once")
    return args


def signed(query: str) -> bool:
    """Whether a request's query carries a file-URL signature."""
    return "signature" in urllib.parse.parse_qs(query, keep_blank_values=True)


def _write(path: Path, revoked: dict[str, float]) -> None:
    """Replace the file of revocations whole (written aside, then renamed over it)."""
    aside = path.with_name(path.name + ".new")
    aside.write_text(json.dumps(revoked))
    os.replace(aside, path)
