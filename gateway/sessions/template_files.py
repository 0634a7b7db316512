"""E2B's uploaded COPY file sets: on disk, bounded per tenant, until their build starts.

E2B's builder uploads each ``copy()``'s files (a tar) before it asks for the
build, and may never ask. So a set waits in a directory of the data dir, not
in memory: a file named from the tenant's key, the template's name and the
set's hash (each checked by the caller; the name is checked again here), made
new without following a link, written off the loop as the body streams in and
renamed into place once whole. A tenant's sets together are bounded by the
build context's bound (past it, a 413 to that tenant alone). All tenants'
together are bounded by ``total`` bytes: a set that would pass it first makes
room by removing the oldest sets of the tenant holding the most, so a tenant
within its own bound is never refused for what others left waiting; only the
biggest holder loses sets, and only once ``total`` is full. Sets go when their
build is asked for (started or refused), an hour after their upload, and at
start (the directory is emptied: nothing waits across a restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import os
import re
import time
from pathlib import Path

from ..errors import Conflict, PayloadTooLarge, Unavailable
from ..limits import format_size
from ..workspace.files import AsyncUpload
from ..workspace.rules import Upload, remove_tree

KEPT = 3600.0  # seconds a set waits for its build
# seconds a set's upload may take (64 MiB at 110 KB/s): a stalled one, never evicted while
# under way, would hold its reservation (the tenant's bound, the gateway's) for good
UPLOAD_TIME = 600.0
BLOCK = 4096  # what a set costs at least (a file on disk): empty sets are not free
_FILE = re.compile(r"[0-9a-f]{16}-[a-z0-9]+(?:[_-][a-z0-9]+)*-[0-9a-f]{64}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclasses.dataclass
class _Set:
    cost: int  # reserved while it uploads, then what it holds on disk
    when: float
    done: bool = False


class SetUpload(AsyncUpload):
    """A set being uploaded: its bytes reserved (``room``, the most it may send) until it
    is in place, or discarded (its reservation then released)."""

    def __init__(self, upload: Upload, sets: UploadedSets, key: tuple[str, str, str], room: int):
        super().__init__(upload)
        self.sets, self.key, self.room = sets, key, room
        self.slot = sets.held[key]

    async def finish(self, ok: bool) -> None:
        placed = False
        try:
            await super().finish(ok)
            placed = ok
        finally:
            self.sets.settle(self, placed)


class UploadedSets:
    """The file sets waiting for their builds, by (tenant key, template name, hash)."""

    def __init__(self, root: Path, total: int) -> None:
        self.root = root
        self.total = total  # bytes of disk all tenants' sets may take together
        self.held: dict[tuple[str, str, str], _Set] = {}
        self.clock = time.time
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Empty the directory: a set left by a stopped gateway waits for no build."""
        await asyncio.to_thread(self._reset)

    def _reset(self) -> None:
        self.root.parent.mkdir(parents=True, exist_ok=True)
        parent = os.open(self.root.parent, _DIR_FLAGS)
        try:
            with contextlib.suppress(FileNotFoundError):
                remove_tree(parent, self.root.name)
            os.mkdir(self.root.name, 0o700, dir_fd=parent)
        finally:
            os.close(parent)

    def present(self, tenant_key: str, name: str, files_hash: str) -> bool:
        held = self.held.get((tenant_key, name, files_hash))
        return held is not None and held.done and self.clock() - held.when <= KEPT

    async def open(
        self, tenant_key: str, name: str, files_hash: str, declared: int | None, bound: int
    ) -> SetUpload:
        """Start a set's upload of ``declared`` bytes (None: up to the tenant's room)."""
        key = (tenant_key, name, files_hash)
        file = _file_name(key)
        async with self._lock:  # counted and reserved at once: uploads racing count each other
            await self._expire()
            held = self.held.get(key)
            if held is not None and not held.done:
                raise Conflict("this file set is being uploaded already; wait for that upload")
            await self._remove([(key, held)] if held else [])  # the new one replaces it
            room = bound - sum(s.cost for k, s in self.held.items() if k[0] == tenant_key)
            need = max(BLOCK, room if declared is None else declared)
            if need > room:
                raise PayloadTooLarge(
                    f"your templates' uploaded files would pass {format_size(bound)} together "
                    f"({format_size(bound - room)} wait for their builds); build the templates "
                    "waiting first (their files go once a build is asked for), or copy less"
                )
            await self._make_room(need)
            self.held[key] = _Set(need, self.clock())
        try:
            upload = await asyncio.to_thread(self._open_file, file)
        except BaseException:
            del self.held[key]
            raise
        return SetUpload(upload, self, key, need)

    def _open_file(self, final: str) -> Upload:
        dir_fd = os.open(self.root, _DIR_FLAGS)
        temp = f".part-{os.urandom(6).hex()}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise
        return Upload(os.fdopen(fd, "wb"), dir_fd, temp, final)

    def settle(self, upload: SetUpload, placed: bool) -> None:
        """An upload ended: its set holds what it wrote, or its reservation goes."""
        if self.held.get(upload.key) is not upload.slot:
            return  # replaced or removed meanwhile
        if placed:
            upload.slot.cost, upload.slot.done = max(BLOCK, upload.size), True
        else:
            del self.held[upload.key]

    async def _make_room(self, need: int) -> None:
        """Remove the oldest sets of the tenant holding the most until ``need`` fits.

        Chosen in one pass (a heap of holders) and removed together: a tenant's
        thousands of block-sized sets are not recounted on the loop for each one.
        If the most held is in uploads under way, nothing goes: a smaller holder's
        sets are never taken for it (503 until those uploads end, within UPLOAD_TIME).
        """
        excess = sum(s.cost for s in self.held.values()) + need - self.total
        if excess <= 0:
            return
        holding: dict[str, int] = {}
        done: dict[str, list[tuple[float, tuple[str, str, str]]]] = {}
        for k, s in self.held.items():
            holding[k[0]] = holding.get(k[0], 0) + s.cost
            if s.done:
                done.setdefault(k[0], []).append((s.when, k))
        for sets in done.values():
            sets.sort(reverse=True)  # the oldest last, popped first
        holders = [(-held, tenant) for tenant, held in holding.items()]
        heapq.heapify(holders)
        gone = []
        while excess > 0:
            most, tenant = heapq.heappop(holders) if holders else (0, "")
            if not done.get(tenant):  # the most held is in uploads under way: none goes
                raise Unavailable(
                    "the gateway's disk for template files is taken by uploads under way; "
                    "retry in a minute"
                )
            _, oldest = done[tenant].pop()
            cost = self.held[oldest].cost
            gone.append((oldest, self.held[oldest]))
            excess -= cost
            heapq.heappush(holders, (most + cost, tenant))
        await self._remove(gone)

    async def _expire(self) -> None:
        now = self.clock()
        await self._remove([(k, s) for k, s in self.held.items() if s.done and now - s.when > KEPT])

    async def _remove(self, sets: list[tuple[tuple[str, str, str], _Set]]) -> None:
        """Remove these sets (each only if still the one held: not one uploaded since)."""
        gone = [k for k, s in sets if self.held.get(k) is s]
        for k in gone:
            del self.held[k]
        if gone:
            await asyncio.to_thread(self._unlink, [_file_name(k) for k in gone])

    def _unlink(self, files: list[str]) -> None:
        dir_fd = os.open(self.root, _DIR_FLAGS)
        try:
            for file in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(file, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    async def take(self, tenant_key: str, name: str, hashes: list[str]) -> dict[str, bytes]:
        """The sets ``hashes`` name (those missing left out); every set of the template goes.

        A build asked for reads its sets once, started or refused: none waits on.
        """
        await self._expire()
        mine = [(k, s) for k, s in self.held.items() if k[:2] == (tenant_key, name) and s.done]
        files = {k[2]: _file_name(k) for k, _ in mine if k[2] in hashes}
        try:
            return await asyncio.to_thread(self._read, files)
        finally:
            await self._remove(mine)

    def _read(self, files: dict[str, str]) -> dict[str, bytes]:
        dir_fd = os.open(self.root, _DIR_FLAGS)
        try:
            parts = {}
            for files_hash, file in files.items():
                fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as f:
                    parts[files_hash] = f.read()
            return parts
        finally:
            os.close(dir_fd)


def _file_name(key: tuple[str, str, str]) -> str:
    """A set's file: tenant key, template name, hash; never anything else (a ValueError)."""
    file = "-".join(key)
    if not _FILE.fullmatch(file) or len(file) > 255:
        raise ValueError(f"not a file set's name: {file[:100]!r}")
    return file
