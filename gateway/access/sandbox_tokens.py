"""Per-sandbox access tokens: what the E2B edge hands out at create and checks on sandbox traffic.

A token is ``<holder>.<HMAC of the sandbox id and the holder>`` under a key
kept in the data directory, so it survives restarts, needs no store, and one
sandbox's token says nothing of another's. The holder is the id of the API
token it was handed to (create, connect, get_info): the caller acts as the
sandbox's tenant with no rights of that token (admin, approver), and what it
asks for (a held execute) is its holder's.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path


class SandboxTokens:
    """Issues and checks the access token of each sandbox."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> SandboxTokens:
        """The tokens under the key in ``<data_dir>/sandbox-token.key`` (made once, mode 0600)."""
        path = data_dir / "sandbox-token.key"
        if not path.is_file():
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another gateway on this data dir made it meanwhile
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32) + "\n")
        return cls(bytes.fromhex(path.read_text().strip()))

    def issue(self, sandbox_id: str, holder: str) -> str:
        """The token for ``holder`` (an API token's id) to reach ``sandbox_id``."""
        return f"{holder}.{self.mac(sandbox_id, holder)}"

    def holder(self, sandbox_id: str, token: str | None) -> str | None:
        """Whose token ``token`` is, if it was issued for ``sandbox_id``; else None."""
        holder, _, mac = (token or "").rpartition(".")
        if holder and hmac.compare_digest(self.mac(sandbox_id, holder).encode(), mac.encode()):
            return holder
        return None

    def mac(self, sandbox_id: str, holder: str) -> str:
        """The HMAC of ``sandbox_id`` (or another subject) and ``holder`` under the key."""
        message = f"{sandbox_id}\0{holder}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
