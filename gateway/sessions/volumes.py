"""Named volumes: a tenant's files that outlive its sessions (docs/volumes.md).

A volume is a size-limited, loop-mounted ext4 image made as a workspace is
(``sandbox/volume.py``), in a directory named by a random id (a name never
reaches the filesystem), so a full volume is a clean ENOSPC to whoever
writes, the kernel or an upload. Its record and its share of the tenant's
disk quota are taken in one step under the claims lock (``store/volumes.py``);
another tenant's name answers as a missing one. Its files are read and
written through the workspace path rules without a session; a session mounts
it at create, read-write alone or read-only beside other readers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..access.auth import Principal, Quota
from ..errors import (
    Conflict,
    LimitExceeded,
    QuotaExceeded,
    Unavailable,
    VolumeInUse,
    VolumeNotFound,
)
from ..limits import format_size
from ..policy.gate import Gate
from ..sandbox import volume
from ..sandbox.base import VolumeMount
from ..store.base import Store
from ..timestamps import iso
from ..workspace.files import AsyncWorkspace
from ..workspace.rules import Workspace
from .requests import CreateVolume, MountVolume, volume_name

log = logging.getLogger(__name__)

MIN_SIZE = 16 * 2**20  # ext4 needs room for its journal and tables
_VOLUME_ID = re.compile(r"[0-9a-f]{32}")  # a volume's directory under the root: uuid4().hex


@dataclasses.dataclass(frozen=True)
class VolumeOptions:
    """Where volumes live on this host, their default and largest sizes, who owns their files."""

    root: Path
    default_size: int = 2**30
    max_size: int = 64 * 2**30
    host: str = ""  # a volume's files are on the host that made it
    owner: tuple[int, int] = (1000, 1000)  # the sandbox user every kernelspec runs as


class Volumes:
    """Create, find, delete and mount a tenant's volumes; their files without a session."""

    def __init__(
        self, store: Store, quota: Callable[[str], Quota], gate: Gate, options: VolumeOptions
    ) -> None:
        self.store = store
        self.quota = quota
        self.gate = gate
        self.options = options

    async def create(self, who: Principal, request: CreateVolume) -> dict[str, Any]:
        """Record the volume against the tenant's quota, then make its filesystem."""
        size = self.options.default_size if request.size is None else request.size
        if not MIN_SIZE <= size <= self.options.max_size:
            raise LimitExceeded(
                f"a volume's size must be between {format_size(MIN_SIZE)} and "
                f"{format_size(self.options.max_size)}, not {format_size(size)}"
            )
        volume_id = uuid.uuid4().hex
        doc = {"id": volume_id, "tenant": who.tenant, "name": request.name, "size_bytes": size,
               "created_at": iso(time.time()), "host": self.options.host,
               "where": str((self.options.root / volume_id).resolve())}  # fmt: skip
        quota = self.quota(who.tenant)
        refused = await self.store.add_volume(
            doc, {"volumes": quota.max_volumes, "disk": quota.max_disk}
        )
        if refused is not None:
            raise _refusal(who.tenant, request.name, size, refused)
        try:
            uid, gid = self.options.owner
            await asyncio.to_thread(volume.create, Path(doc["where"]), size, uid, gid)
        except BaseException as e:
            await asyncio.shield(self._forget(doc))
            if isinstance(e, OSError):
                raise Unavailable(f"volume {request.name!r} could not be made: {e}") from e
            raise
        return doc

    async def _forget(self, doc: dict[str, Any]) -> None:
        await self.store.delete_volume(doc["id"])
        await asyncio.to_thread(volume.destroy, Path(doc["where"]))

    async def list(self, who: Principal) -> list[dict[str, Any]]:
        return await self.store.volumes_of_tenant(who.tenant)

    async def get(self, who: Principal, ref: str) -> dict[str, Any]:
        """The caller's tenant's volume named (or with the id) ``ref``; no other tenant's."""
        doc = await self.store.get_volume(who.tenant, volume_name(ref))
        if doc is None:
            raise VolumeNotFound(ref)
        return doc

    async def inspect(self, who: Principal, ref: str) -> dict[str, Any]:
        """A volume with its bytes in use and the sessions that mount it."""
        doc = await self.get(who, ref)
        files = await self._files(doc)
        free = await files.free_bytes()
        holders = await self.store.volume_holders(doc["id"])
        return {**public(doc), "used_bytes": max(doc["size_bytes"] - free, 0),
                "mounted_by": holders}  # fmt: skip

    async def delete(self, who: Principal, ref: str) -> dict[str, Any]:
        """Delete a volume and its files, unless a session mounts it (409 naming them)."""
        doc = await self.get(who, ref)
        holders = await self.store.delete_volume(doc["id"])
        if holders:
            raise VolumeInUse(
                f"volume {doc['name']!r} is mounted by session(s) {_listed(holders)}; "
                "delete them (or wait for them to end), then delete the volume"
            )
        await asyncio.to_thread(volume.destroy, Path(doc["where"]))
        return doc

    async def sweep(self) -> None:
        """Remove the filesystems no volume names: a delete's record goes first, so a gateway
        killed before the unmount left the image mounted, its bytes counted by nothing."""
        root = self.options.root
        names = await asyncio.to_thread(lambda: os.listdir(root) if root.is_dir() else [])
        known = await self.store.volume_ids()  # after: a create records before it makes
        for name in sorted(set(names) - known):
            if not _VOLUME_ID.fullmatch(name):
                continue  # not one a create made: never the gateway's to remove
            log.warning("volume %s: removing its filesystem, left by a delete cut short", name)
            await asyncio.to_thread(volume.destroy, root / name)

    async def files(self, who: Principal, ref: str) -> AsyncWorkspace:
        """The volume's files, through the workspace path rules, without a session."""
        return await self._files(await self.get(who, ref))

    async def files_with_id(self, who: Principal, volume_id: str) -> AsyncWorkspace:
        """``files`` of the volume with the id ``volume_id`` only, never one named so (a name
        wins in ``get``): a per-volume token must not reach another volume of its tenant."""
        doc = await self.get(who, volume_id)
        if doc["id"] != volume_id:
            doc = next((d for d in await self.list(who) if d["id"] == volume_id), None)
            if doc is None:
                raise VolumeNotFound(volume_id)
        return await self._files(doc)

    def check_file(self, who: Principal, op: str, size: int = 0) -> int:
        """Refuse a files ``op`` the tenant's policy forbids, as in a session; its download cap."""
        return self.gate.check_file(who.tenant, None, op, size)

    async def _files(self, doc: dict[str, Any]) -> AsyncWorkspace:
        where = Path(doc["where"])
        if doc.get("host", "") != self.options.host:
            raise Unavailable(
                f"volume {doc['name']!r} is on host {doc.get('host')!r}, not this gateway's; "
                "reach it through a gateway there"
            )
        try:
            await asyncio.to_thread(volume.mount_again, where)  # a host reboot unmounted it
        except OSError as e:  # an image a create cut short before formatting it
            log.warning("volume %s: %s", doc["id"], e)  # not to the client: it names host paths
            raise _no_filesystem(doc["name"], "its image does not mount") from e
        # Else files would land in the bare mount point on the host's disk, past any cap.
        if volume.loop_mounts_available() and not await asyncio.to_thread(
            os.path.ismount, where / "workspace"
        ):
            raise _no_filesystem(doc["name"], "its image is missing")
        return AsyncWorkspace(Workspace(str(where / "workspace"), *self.options.owner))

    async def mount(
        self, session_id: str, who: Principal, mounts: tuple[MountVolume, ...]
    ) -> tuple[VolumeMount, ...]:
        """Take the session's mounts (its quota claim holds them); the sandbox's values."""
        docs = [await self.get(who, m.name) for m in mounts]
        for doc in docs:
            await self._files(doc)  # on this host, and mounted
        taken = [(doc["id"], m.read_only) for doc, m in zip(docs, mounts, strict=True)]
        conflict = await self.store.mount_volumes(session_id, taken)
        if conflict is not None:
            name = next(d["name"] for d in docs if d["id"] == conflict["volume_id"])
            if conflict.get("gone"):
                raise VolumeNotFound(name)
            raise VolumeInUse(
                f"volume {name!r} is mounted by session(s) {_listed(conflict['holders'])}; "
                "any number of sessions may mount a volume read-only, or one alone read-write"
            )
        return tuple(
            [VolumeMount(doc["id"], doc["name"], await self._source(doc, m), m.path, m.read_only)
             for doc, m in zip(docs, mounts, strict=True)]
        )  # fmt: skip

    @staticmethod
    async def _source(doc: dict[str, Any], mount: MountVolume) -> str:
        """What the sandbox binds: the volume's filesystem, or its read-only view."""
        where = Path(doc["where"])
        if mount.read_only:
            return str(await asyncio.to_thread(volume.read_only_view, where))
        return str(where / "workspace")


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """What a client sees of a volume (not where it lives on the host)."""
    return {k: doc[k] for k in ("id", "name", "size_bytes", "created_at")}


def _no_filesystem(name: str, why: str) -> Conflict:
    """A 409, not a 503: the volume is there, in a state its files cannot be used in yet."""
    return Conflict(
        f"volume {name!r} has no filesystem to use ({why}): its create is still running, or "
        "was cut short; then delete the volume and create it again"
    )


def _listed(holders: list[dict[str, Any]]) -> str:
    shown = [f"{h['session_id']} ({'read-only' if h['read_only'] else 'read-write'})"
             for h in holders[:10]]  # fmt: skip
    return ", ".join(shown) + (f" and {len(holders) - 10} more" if len(holders) > 10 else "")


def _refusal(tenant: str, name: str, size: int, refused: dict[str, Any]) -> Exception:
    what, used, cap = refused["what"], refused["used"], refused["cap"]
    if what == "name":
        return Conflict(f"tenant {tenant!r} already has a volume named {name!r}; pick another")
    if what == "volumes":
        return QuotaExceeded(
            f"tenant {tenant!r} keeps {used} volumes, its quota of {cap}; delete one it no "
            "longer needs (DELETE /v1/volumes/{name})"
        )
    return QuotaExceeded(
        f"tenant {tenant!r}'s sessions' workspaces and volumes would take "
        f"{format_size(used + size)}, over its disk quota of {format_size(cap)} "
        f"({format_size(used)} in use); ask for a smaller volume or delete one"
    )
