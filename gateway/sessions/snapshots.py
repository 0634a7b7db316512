"""Snapshots: a session's kernel state and workspace, kept to fork new sessions from.

A snapshot is a directory ``<data_dir>/snapshots/<id>``: the saved namespace
(``namespace`` strategy; ``replay`` keeps none, its cells are the history up
to the snapshot) and the workspace as a gzipped tar made by the workspace's
own archiver (regular files only, never read through a link). Its record is
in the store. It belongs to the session's tenant, counts toward the tenant's
quota (count and bytes) and outlives the session. It names the sealed secrets
the session held (never their values; such a session's state is kept by
replay, see ``state``), for a fork to ask for them too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..access.auth import Principal, Quota
from ..errors import QuotaExceeded, SnapshotNotFound, StateNotRestored, StateNotSaved
from ..limits import format_size
from ..store.base import Store
from ..timestamps import iso
from .model import Session
from .state import STATE_FILE, KernelState, SavedState

WORKSPACE_ARCHIVE = "workspace.tar.gz"


class Snapshots:
    """Takes, lists, deletes and restores snapshots; each one its tenant's."""

    def __init__(
        self,
        directory: Path,
        store: Store,
        state: KernelState,
        quota: Callable[[str], Quota],
        max_archive: int,
    ) -> None:
        """``max_archive`` bounds a workspace archive (the files' apparent sizes)."""
        self.directory = directory
        self.store = store
        self.state = state
        self.quota = quota
        self.max_archive = max_archive

    async def take(
        self, session: Session, name: str | None, strategy: str | None, timeout: float
    ) -> dict[str, Any]:
        """Save an idle session's kernel state and workspace; the session keeps running.

        A paused session's saved state is copied instead (its kernel is not running).
        """
        await self._check_quota(session.tenant, 0)
        snapshot_id = str(uuid.uuid4())
        where = self.directory / snapshot_id
        await asyncio.to_thread(where.mkdir, 0o700, True)
        try:
            if session.paused is not None:
                saved = await self.state.copy_paused(session, strategy, where / STATE_FILE)
            else:
                strategy = self.state.choose(session, strategy)
                saved = await self.state.save(session, strategy, timeout, where / STATE_FILE)
            await self._archive(session, where / WORKSPACE_ARCHIVE)
            size = await asyncio.to_thread(_size_of, where)
            await self._check_quota(session.tenant, size)
            doc = {
                "id": snapshot_id,
                "session_id": session.id,
                "tenant": session.tenant,
                "name": name,
                "created_at": iso(time.time()),
                "size_bytes": size,
                "strategy": saved.strategy,
                "lost": saved.lost,
                "kernel": session.kernel_name,
                "image": session.image,
                "secrets": list(session.secret_names),
                # a fork gets these too: a brokered secret's value never enters its sandbox
                "credentials": [c.to_json() for c in session.credentials],
                "network": session.network.to_json(),
                # the mounts, not their files: a fork mounts the same volumes read-only
                "volumes": [
                    {"name": v.name, "path": v.target, "read_only": v.read_only}
                    for v in session.volumes
                ],
                "saved": saved.to_json(),
                "last_execution": await self.store.last_execution(session.id),
                # Its files stay in this gateway's data dir: another gateway of the
                # deployment on this host forks or deletes it from there.
                "where": str(where.resolve()),
            }
            await self.store.add_snapshot(doc)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, where, True)
            raise
        return doc

    async def _archive(self, session: Session, target: Path) -> None:
        assert session.workspace is not None
        reader = await session.workspace.archive(".", "tar", self.max_archive)
        try:
            file = await asyncio.to_thread(open, target, "xb")
            try:
                while chunk := await reader.read():
                    await asyncio.to_thread(file.write, chunk)
            finally:
                await asyncio.to_thread(file.close)
        except OSError as e:
            raise StateNotSaved(
                f"the snapshot's workspace archive could not be written ({e.strerror or e}); "
                "the session keeps running: free disk on the gateway's host, or delete snapshots"
            ) from e
        finally:
            await reader.aclose()

    async def _check_quota(self, tenant: str, adding: int) -> None:
        quota = self.quota(tenant)
        count, used = await self.store.snapshot_usage(tenant)
        if not adding and count >= quota.max_snapshots:
            raise QuotaExceeded(
                f"tenant {tenant!r} keeps {count} snapshots, its quota of {quota.max_snapshots}; "
                "delete one it no longer needs (DELETE /v1/snapshots/{id})"
            )
        if used + adding > quota.max_snapshot_bytes:
            raise QuotaExceeded(
                f"tenant {tenant!r}'s snapshots would take {format_size(used + adding)}, over "
                f"its quota of {format_size(quota.max_snapshot_bytes)}; delete snapshots it "
                "no longer needs"
            )

    async def get(self, snapshot_id: str, who: Principal) -> dict[str, Any]:
        """A snapshot ``who`` may use; someone else's answers as a missing one does."""
        doc = await self.store.get_snapshot(snapshot_id)
        if doc is None or not who.owns(doc["tenant"]):
            raise SnapshotNotFound(snapshot_id)
        return doc

    async def of_session(self, session_id: str) -> list[dict[str, Any]]:
        return await self.store.snapshots_of(session_id)

    async def of_tenant(self, who: Principal) -> list[dict[str, Any]]:
        """The caller's tenant's snapshots, oldest first."""
        return await self.store.snapshots_of_tenant(who.tenant)

    async def delete(self, snapshot_id: str, who: Principal) -> None:
        doc = await self.get(snapshot_id, who)
        await self.store.delete_snapshot(snapshot_id)
        await asyncio.to_thread(shutil.rmtree, self._files(doc), True)

    async def restore_into(self, session: Session, doc: dict[str, Any]) -> dict[str, Any]:
        """Give a new session (its kernel fresh, no user code run) a snapshot's files and state.

        Raises ``StateNotRestored`` when the snapshot's files are damaged or
        gone; the caller ends the half-made session.
        """
        where = self._files(doc)
        assert session.workspace is not None
        try:
            await asyncio.to_thread(_unpack, where / WORKSPACE_ARCHIVE, session.workspace.sync)
        except (OSError, tarfile.TarError, EOFError) as e:
            raise StateNotRestored(
                f"snapshot {doc['id']}'s workspace archive is damaged or missing ({e}); "
                "delete the snapshot, or take a new one"
            ) from e

        async def running() -> None:
            """The fork's kernel is already up."""

        saved = SavedState.from_json(doc["saved"])
        return await self.state.restore(session, saved, running, where / STATE_FILE)

    def _files(self, doc: dict[str, Any]) -> Path:
        """Where a snapshot's files are: the data dir of the gateway that took it."""
        return Path(doc.get("where") or self.directory / doc["id"])

    async def sweep(self) -> None:
        """Remove snapshot directories the store has no record of (a crash mid-snapshot)."""
        await asyncio.to_thread(self.directory.mkdir, 0o700, True, True)
        names = await asyncio.to_thread(os.listdir, self.directory)
        for name in names:
            if await self.store.get_snapshot(name) is None:
                await asyncio.to_thread(shutil.rmtree, self.directory / name, True)


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as the API shows it: without what only restoring it needs."""
    return {
        k: v for k, v in doc.items() if k not in ("saved", "last_execution", "secrets", "where")
    }


def _size_of(directory: Path) -> int:
    return sum(entry.stat().st_size for entry in directory.iterdir() if entry.is_file())


def _unpack(archive: Path, workspace: Any) -> None:
    """Write an archive's regular files into a workspace through its own no-follow writes."""
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            source = tar.extractfile(member)
            assert source is not None
            upload = workspace.open_write(member.name)
            try:
                while chunk := source.read(1 << 20):
                    upload.write(chunk)
            except BaseException:
                upload.finish(False)
                raise
            upload.finish(True)
