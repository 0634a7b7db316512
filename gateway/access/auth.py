"""Who is calling: API tokens, the tenants they belong to, and the admin role.

Tokens come from a TOML file and, for a single-token setup, from the
``token`` setting (``SBX_TOKEN``). Only their SHA-256 digests are kept: in
memory, and in logs and the audit trail as a short id. Clients send
``Authorization: Bearer <t>``; Jupyter clients send ``Authorization: token
<t>``; WebSockets may pass ``?token=<t>``, since browsers cannot set headers
on them. The tokens file::

    [[tokens]]
    tenant = "acme"
    sha256 = "<hex digest of the token>"   # or: token = "<the token>"

    [[tokens]]
    tenant = "ops"
    token = "..."
    admin = true                           # sees every tenant, reads the audit log

    [[tokens]]
    tenant = "acme"
    token = "..."
    approver = true                        # decides acme's held executes (docs/approvals.md)

    [tenants.acme]                         # quotas; defaults come from settings
    max_sessions = 10
    max_memory = "8g"
    max_disk = "40g"                       # the sum of its sessions' workspace sizes and volumes
    max_cpus = 16                          # the sum of its sessions' CPU quotas
    creates_per_minute = 60                # sessions it may create a minute (0: any number)
    package_allow = ["numpy", "pandas==2.2.3"]   # from the package cache; empty: any
    package_deny = ["evil-pkg"]
    max_snapshots = 20                     # snapshots it keeps
    max_snapshot_bytes = "10g"             # their sizes on disk, added up
    max_volumes = 8                        # named volumes it keeps (docs/volumes.md)

    [[tenants.acme.webhooks]]              # lifecycle webhooks (sessions/webhooks.py reads them)
    url = "https://hooks.acme.example/in"
    secret = "..."
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import secrets
import tomllib
from pathlib import Path

from ..config import ConfigError, Settings
from ..errors import Unauthorized
from ..limits import parse_size

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Principal:
    """The caller behind a request."""

    tenant: str
    admin: bool = False
    token_id: str = ""  # a prefix of the token's digest: names it in logs, reveals nothing
    approver: bool = False  # may approve or deny its tenant's held executes
    acting_for: str = ""  # a sandbox or volume token's: the token id it was handed to

    def owns(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant

    @property
    def answerable(self) -> str:
        """Whose request this is: a sandbox token's is its holder's, so a held execute asked
        for through one is never approved by the token it was handed to."""
        return self.acting_for or self.token_id


# Every caller when authentication is switched off: one tenant, all rights.
ANONYMOUS = Principal(tenant="default", admin=True, token_id="anonymous")


@dataclasses.dataclass(frozen=True)
class Quota:
    """What one tenant may hold at once, across all its live sessions."""

    max_sessions: int
    max_memory: int
    max_disk: int  # workspaces are real disk on the host, so their sizes add up too
    max_cpus: float = 64.0  # sessions' CPU quotas, added up
    creates_per_minute: int = 0  # 0: no limit
    package_allow: tuple[str, ...] = ()  # what its sessions may install (empty: any)
    package_deny: tuple[str, ...] = ()
    max_snapshots: int = 64  # snapshots it keeps (they outlive sessions)
    max_snapshot_bytes: int = 16 * 2**30  # their sizes on disk, added up
    max_volumes: int = 16  # named volumes it keeps (their sizes count in max_disk)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """Turns a presented token into a Principal; holds only digests."""

    def __init__(
        self,
        principals: dict[str, Principal] | None,
        quotas: dict[str, Quota],
        default_quota: Quota,
    ) -> None:
        self._principals = principals  # None: authentication is off
        self._quotas = quotas
        self._default_quota = default_quota

    @property
    def enabled(self) -> bool:
        return self._principals is not None

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        """Load the tokens; generate one in the data dir when none is configured."""
        default_quota = Quota(
            max_sessions=settings.tenant_max_sessions,
            max_memory=settings.tenant_max_memory,
            max_disk=settings.tenant_max_disk,
            max_cpus=settings.tenant_max_cpus,
            creates_per_minute=settings.tenant_creates_per_minute,
            package_allow=settings.package_allow,
            package_deny=settings.package_deny,
            max_snapshots=settings.tenant_max_snapshots,
            max_snapshot_bytes=settings.tenant_max_snapshot_bytes,
            max_volumes=settings.tenant_max_volumes,
        )
        if settings.auth == "none":
            return cls(None, {}, default_quota)
        principals: dict[str, Principal] = {}
        quotas: dict[str, Quota] = {}
        if settings.tokens_file:
            principals, quotas = _read_tokens_file(Path(settings.tokens_file), default_quota)
        if settings.token:
            principals[digest(settings.token)] = _principal(
                digest(settings.token), settings.token_tenant, admin=True
            )
        if not principals:
            token = _generated_token(Path(settings.data_dir))
            principals[digest(token)] = _principal(digest(token), settings.token_tenant, True)
        return cls(principals, quotas, default_quota)

    def authenticate(self, token: str | None) -> Principal:
        """The principal of ``token``; raise Unauthorized (401) for a missing or unknown one."""
        if self._principals is None:
            return ANONYMOUS
        if not token:
            raise Unauthorized(
                "this gateway needs an API token: send 'Authorization: Bearer <token>' "
                "(or ?token=<token> on a WebSocket)"
            )
        # The lookup is on a SHA-256 of the token, so its timing reveals nothing of the token.
        principal = self._principals.get(digest(token))
        if principal is not None:
            return principal
        raise Unauthorized("the API token is not valid; check it, or ask for a new one")

    def quota(self, tenant: str) -> Quota:
        return self._quotas.get(tenant, self._default_quota)

    def holders(self, tenant: str) -> tuple[str, ...]:
        """The ids of the tokens that may act for ``tenant`` (its own, and admins')."""
        if self._principals is None:
            return (ANONYMOUS.token_id,)
        return tuple(p.token_id for p in self._principals.values() if p.owns(tenant))

    def principal_of(self, token_id: str) -> Principal | None:
        """The principal of the token with id ``token_id`` (a scoped token's holder), while that
        token is still configured; None once it is gone."""
        if self._principals is None:
            return ANONYMOUS if token_id == ANONYMOUS.token_id else None
        return next((p for p in self._principals.values() if p.token_id == token_id), None)


def token_id(token: str) -> str:
    """What may be logged of a token: a short prefix of its digest."""
    return digest(token)[:12]


def presented_token(authorization: str | None, query_token: str | None) -> str | None:
    """The token a request carries: ``Bearer``/``token`` header, else ``?token=``."""
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() in ("bearer", "token") and value.strip():
            return value.strip()
        return None
    return query_token or None


def _principal(token_digest: str, tenant: str, admin: bool, approver: bool = False) -> Principal:
    return Principal(tenant=tenant, admin=admin, token_id=token_digest[:12], approver=approver)


def _read_tokens_file(path: Path, default: Quota) -> tuple[dict[str, Principal], dict[str, Quota]]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read tokens file {path}: {e}") from e
    principals = {}
    for n, entry in enumerate(data.get("tokens", []), start=1):
        tenant = entry.get("tenant")
        if not isinstance(tenant, str) or not tenant:
            raise ConfigError(f"{path}: token #{n} needs a tenant")
        if "sha256" in entry:
            token_digest = str(entry["sha256"]).lower()
        elif "token" in entry:
            token_digest = digest(str(entry["token"]))
        else:
            raise ConfigError(f"{path}: token #{n} needs sha256 (preferred) or token")
        principals[token_digest] = _principal(
            token_digest, tenant, bool(entry.get("admin")), bool(entry.get("approver"))
        )
    quotas = {}
    for tenant, values in data.get("tenants", {}).items():
        quotas[tenant] = Quota(
            max_sessions=int(values.get("max_sessions", default.max_sessions)),
            max_memory=parse_size(values.get("max_memory", default.max_memory), "max_memory"),
            max_disk=parse_size(values.get("max_disk", default.max_disk), "max_disk"),
            max_cpus=float(values.get("max_cpus", default.max_cpus)),
            creates_per_minute=int(values.get("creates_per_minute", default.creates_per_minute)),
            package_allow=_names(values, "package_allow", default.package_allow, path),
            package_deny=_names(values, "package_deny", default.package_deny, path),
            max_snapshots=int(values.get("max_snapshots", default.max_snapshots)),
            max_snapshot_bytes=parse_size(
                values.get("max_snapshot_bytes", default.max_snapshot_bytes), "max_snapshot_bytes"
            ),
            max_volumes=int(values.get("max_volumes", default.max_volumes)),
        )
    return principals, quotas


def _names(values: dict, key: str, default: tuple[str, ...], path: Path) -> tuple[str, ...]:
    found = values.get(key, default)
    if not isinstance(found, list | tuple) or not all(isinstance(v, str) for v in found):
        raise ConfigError(f'{path}: {key} must be a list of package names, e.g. ["numpy"]')
    return tuple(found)


def _generated_token(data_dir: Path) -> str:
    """A token made once per data dir, kept in ``<data_dir>/token`` (mode 0600).

    It survives restarts, so clients keep working across them; the file is
    where operators and local clients read it, and it is never logged.
    """
    path = data_dir / "token"
    if path.is_file():
        return path.read_text().strip()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_hex(32)  # never starts with "-", which a --token flag would misread
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.warning(
        "no API token configured: generated one in %s; clients send it as "
        "'Authorization: Bearer <token>' (set SBX_TOKEN or --tokens-file to choose your own)",
        path,
    )
    return token
