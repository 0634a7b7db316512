"""Per-sandbox access tokens: what the E2B edge hands out at create and checks on sandbox traffic.

A token is an HMAC of the sandbox (session) id under a key kept in the data
directory, so it survives restarts, needs no store, and one sandbox's token
says nothing of another's. It only proves the holder was given that sandbox:
the caller acts as the sandbox's tenant, as the API token that created it did.
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

    def issue(self, sandbox_id: str) -> str:
        return hmac.new(self._key, sandbox_id.encode(), hashlib.sha256).hexdigest()

    def valid(self, sandbox_id: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.issue(sandbox_id), token or "")
