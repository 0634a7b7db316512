"""Sealed secrets: values a tenant stores once, sessions receive by name, nobody reads back.

Values are sealed with AES-GCM (``cryptography``) under a 256-bit key kept in
a file outside the database (``secrets_key_file``; made on first use when
missing, mode 0600). Each ciphertext is bound to its tenant and name as
associated data, so a row copied to another tenant or name in the database
does not open. No API returns a value: they leave the vault only for a
session's sandbox, and the session's ``Masker`` keeps them out of what it
produces. docs/secrets.md draws the threat model.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import time
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import BadRequest, ConfigError, Conflict, NotFound, PayloadTooLarge
from ..limits import format_size
from ..store.base import Store
from ..timestamps import iso
from .auth import Principal

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_NONCE = 12


def load_key(path: Path) -> bytes:
    """The vault's key from ``path`` (base64 of 32 bytes); made there, 0600, when missing."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode())
    try:
        key = base64.urlsafe_b64decode(path.read_text().strip())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the secrets key file {path}: {e}") from e
    if len(key) != 32:
        raise ConfigError(
            f"the secrets key file {path} must hold the base64 of 32 random bytes "
            "(delete it to have a new one made, which makes stored secrets unreadable)"
        )
    return key


def secret_name(value: Any) -> str:
    """A secret's name: an environment variable name, as the sandbox will see it."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise BadRequest(
            "a secret's name must be an environment variable name (letters, digits and _, "
            f"not starting with a digit, at most 128 characters), not {value!r}"
        )
    return value


def secret_names(value: Any) -> tuple[str, ...]:
    """A create request's ``secrets``: a list of names, each once."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest('secrets must be a list of secret names, e.g. ["WAREHOUSE_KEY"]')
    return tuple(dict.fromkeys(secret_name(name) for name in value))


class SecretVault:
    """Seals, stores and unseals tenants' secrets."""

    def __init__(self, store: Store, key: bytes, max_size: int) -> None:
        self.store = store
        self.cipher = AESGCM(key)
        self.max_size = max_size

    @staticmethod
    def _bound(tenant: str, name: str) -> bytes:
        return f"{tenant}\0{name}".encode()

    def _value(self, value: Any) -> bytes:
        if not isinstance(value, str) or not value or "\0" in value:
            raise BadRequest("value must be a non-empty string without NUL characters")
        data = value.encode(errors="surrogatepass")
        if len(data) > self.max_size:
            raise PayloadTooLarge(
                f"the secret's value is {len(data)} bytes, over the limit of "
                f"{format_size(self.max_size)}; store a key to the data, not the data"
            )
        return data

    async def put(
        self, who: Principal, name: Any, value: Any, overwrite: bool
    ) -> tuple[dict[str, str], bool]:
        """Seal and store a value; (its name and dates, whether it is new).

        ``overwrite`` false (a POST) refuses a name in use: rotating is a PUT.
        """
        name = secret_name(name)
        nonce = os.urandom(_NONCE)
        bound = self._bound(who.tenant, name)
        sealed = nonce + self.cipher.encrypt(nonce, self._value(value), bound)
        stored = await self.store.put_secret(who.tenant, name, sealed, iso(time.time()), overwrite)
        if stored is None:
            raise Conflict(
                f"tenant {who.tenant!r} already has a secret {name!r}; "
                f"PUT /v1/secrets/{name} rotates it"
            )
        return stored

    async def delete(self, who: Principal, name: str) -> None:
        if not await self.store.delete_secret(who.tenant, name):
            raise NotFound(
                f"tenant {who.tenant!r} has no secret {name!r}; GET /v1/secrets lists them"
            )

    async def list(self, who: Principal) -> list[dict[str, str]]:
        """The tenant's secrets: names and dates, never values."""
        return await self.store.secret_dates(who.tenant)

    async def unseal(
        self, tenant: str, names: tuple[str, ...], strict: bool = True
    ) -> dict[str, str]:
        """The values of ``names`` for a session of ``tenant``.

        ``strict``: a name the tenant does not hold is a 400 naming it (a
        create); otherwise it is left out (a session taken over after a restart).
        """
        if not names:
            return {}
        sealed = await self.store.sealed_secrets(tenant, list(names))
        missing = [name for name in names if name not in sealed]
        if missing and strict:
            raise BadRequest(
                f"unknown secret(s) {', '.join(missing)}: tenant {tenant!r} has none of that "
                "name; POST /v1/secrets stores one, GET /v1/secrets lists them"
            )
        return await asyncio.to_thread(self._open_all, tenant, sealed)

    def _open_all(self, tenant: str, sealed: dict[str, bytes]) -> dict[str, str]:
        values = {}
        for name, blob in sealed.items():
            try:
                data = self.cipher.decrypt(blob[:_NONCE], blob[_NONCE:], self._bound(tenant, name))
            except InvalidTag:
                raise ConfigError(
                    f"secret {name!r} does not open with this gateway's key "
                    "(secrets_key_file changed?); store it again"
                ) from None
            values[name] = data.decode(errors="surrogatepass")
        return values
