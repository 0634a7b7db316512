"""Templates' warm pools: a tenant keeps a few sandboxes of one of its templates ready.

A create from a template otherwise starts cold (the image's kernel, about
0.8 s); a pooled one is served as a kernelspec's pool serves (``pool.py``).
The tenant sets the size (``PUT /v1/templates/NAME/pool``), bounded for all
its templates together (``template_pool_per_tenant``); the sandboxes count
against its quota while they wait, and serve its creates alone. The size is
recorded in the store, so a restarted gateway keeps the pool (it starts the
sandboxes again). The pool follows the template's newest ready version: a
new version's build replaces the old one's sandboxes, a delete removes the
pool and its record.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..errors import Conflict, LimitExceeded, NotAllowed, NotFound
from ..store.base import Store
from .pool import TemplateKey, WarmPool
from .templates import Templates, template_name

log = logging.getLogger(__name__)


class TemplatePools:
    """Sizes tenants' templates' pools, and moves each to its template's newest version."""

    def __init__(self, templates: Templates, pool: WarmPool, store: Store, per_tenant: int) -> None:
        self.templates = templates
        self.pool = pool
        self.store = store
        self.per_tenant = per_tenant
        self.sizes: dict[tuple[str, str], int] = {}  # (tenant, name) -> ready sandboxes asked
        self.keys: dict[tuple[str, str], TemplateKey] = {}  # (tenant, name) -> the version kept
        # One resize or follow at a time: each reads sizes, awaits, then writes what it read
        # (racing PUTs passed the tenant's bound; a follow revived a pool emptied meanwhile).
        self._sizing = asyncio.Lock()
        templates.moved.append(self.follow)  # a new version, a delete

    async def start(self) -> None:
        """Take up the pools recorded before a restart (their sandboxes start afresh), each
        tenant's within the bound set now (an operator may have lowered it, or set 0)."""
        if self.templates.unavailable is not None:
            return  # kept for a gateway that can run them
        for doc in await self.store.template_pools():
            tenant, name = doc["tenant"], doc["name"]
            room = self.per_tenant - sum(n for (t, _), n in self.sizes.items() if t == tenant)
            if doc["size"] > room:
                log.warning("template %s of %s: %d of %d kept ready, the tenant's bound",
                            name, tenant, max(room, 0), doc["size"])  # fmt: skip
            if room > 0:
                self.sizes[(tenant, name)] = min(doc["size"], room)
                await self.follow(tenant, name)

    async def resize(self, tenant: str, name: str, size: Any) -> dict[str, Any]:
        """Keep ``size`` sandboxes of a tenant's template ready (0: none); its pool's view."""
        template_name(name)
        if self.templates.unavailable is not None:
            raise NotAllowed(f"templates are not offered here: {self.templates.unavailable}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise LimitExceeded('size must be a whole number of sandboxes, like {"size": 2}')
        async with self._sizing:
            others = sum(n for (t, o), n in self.sizes.items() if t == tenant and o != name)
            if others + size > self.per_tenant:
                raise LimitExceeded(
                    f"your templates' pools would keep {others + size} sandboxes ready, over the "
                    f"{self.per_tenant} a tenant may keep ({others} kept for other templates); "
                    "ask for fewer, or shrink another template's pool"
                )
            if size:
                await self.templates.resolve(tenant, name)  # 404 or 409 without a ready version
            elif (tenant, name) not in self.sizes:
                await self.templates.versions(tenant, name)  # 404 for a name the tenant lacks
            await self.store.set_template_pool(tenant, name, size)
            self._set_size(tenant, name, size)
            await self._follow(tenant, name)
        return self.view(tenant, name)

    def _set_size(self, tenant: str, name: str, size: int) -> None:
        if size:
            self.sizes[(tenant, name)] = size
        else:
            self.sizes.pop((tenant, name), None)

    async def follow(self, tenant: str, name: str) -> None:
        """Keep the pool on the template's newest ready version (none once it is deleted)."""
        async with self._sizing:
            await self._follow(tenant, name)

    async def _follow(self, tenant: str, name: str) -> None:
        size = self.sizes.get((tenant, name), 0)
        doc = None
        if size:
            try:
                doc = await self.templates.resolve(tenant, name)
            except Conflict:  # no ready version yet: the pool waits for one
                pass
            except NotFound:  # deleted: its pool goes with it
                await self.store.set_template_pool(tenant, name, 0)
                self._set_size(tenant, name, 0)
        new = (
            None
            if doc is None
            else TemplateKey(tenant, doc["image"], doc["kernel"], name, doc["version"])
        )
        old = self.keys.pop((tenant, name), None)
        if old is not None and old != new:
            self.pool.resize(old, 0)  # the old version's ready sandboxes are removed
        if new is not None:
            self.keys[(tenant, name)] = new
            self.pool.resize(new, size)
            log.info("template %s:%d of %s: %d kept ready", name, new.version, tenant, size)

    def view(self, tenant: str, name: str) -> dict[str, Any]:
        """A template's pool as its tenant sees it: size, the version kept, ready, served."""
        key = self.keys.get((tenant, name))
        stats = self.pool.stats_of(key) if key is not None else {}
        return {
            "size": self.sizes.get((tenant, name), 0),
            "version": key.version if key is not None else None,
            "ready": stats.get("ready", 0),
            "starting": stats.get("starting", 0),
            "served": stats.get("hits", 0),
            "waiting": self.pool.short.get(key) if key is not None else None,
        }
