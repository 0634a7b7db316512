"""Every tenant's policy, read from a directory of files, reloadable and replaceable.

``<dir>/<tenant>.toml`` (or ``.yaml`` / ``.yml``) is that tenant's policy;
``default.*`` is every other tenant's; without either the built-in policy
applies (``default.toml``). A reload reads every file before changing
anything, so a malformed file leaves the policies in force as they were. A
policy replaced through the API is written to its file first, so it
survives a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import tempfile
from pathlib import Path

from ..errors import BadRequest, PolicyInvalid
from .model import Policy, default_policy

log = logging.getLogger(__name__)

FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}
DEFAULT = "default"
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class PolicyBook:
    """The policies in force, by tenant."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._builtin = default_policy()
        self._policies: dict[str, Policy] = {}

    def load(self) -> None:
        """Read every policy file; raise PolicyInvalid (naming file and line) and change nothing."""
        policies: dict[str, Policy] = {}
        if self.directory.is_dir():
            for path in sorted(self.directory.iterdir()):
                fmt = FORMATS.get(path.suffix)
                if fmt is None or not path.is_file():
                    continue
                if path.stem in policies:
                    raise PolicyInvalid(f"{path}: tenant {path.stem!r} has two policy files")
                policies[path.stem] = Policy.parse(path.read_text(), fmt, str(path))
        self._policies = policies
        log.info("policies loaded for %s", ", ".join(sorted(policies)) or "no tenant (built-in)")

    async def reload(self) -> list[str]:
        """Read the files again (off the loop); the tenants that now have a policy of their own."""
        await asyncio.to_thread(self.load)
        return sorted(self._policies)

    def policy(self, tenant: str) -> Policy:
        """The policy a tenant's executes answer to."""
        return self._policies.get(tenant) or self._policies.get(DEFAULT) or self._builtin

    async def replace(self, tenant: str, text: str, fmt: str) -> Policy:
        """Check a new policy for ``tenant``, write its file, and put it in force."""
        if not _TENANT.match(tenant):
            raise BadRequest(f"{tenant!r} is not a tenant name")
        policy = Policy.parse(text, fmt, f"the policy for {tenant!r}")
        await asyncio.to_thread(self._write, tenant, text, fmt)
        self._policies[tenant] = policy
        log.info("policy for tenant %s replaced (%s mode)", tenant, policy.mode)
        return policy

    def _write(self, tenant: str, text: str, fmt: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".policy-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.directory / f"{tenant}.{fmt}")
        for suffix in FORMATS:  # one file per tenant: the new one only
            if suffix != f".{fmt}":
                (self.directory / f"{tenant}{suffix}").unlink(missing_ok=True)
