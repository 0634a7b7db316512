"""The one async face of a session's workspace, on this host or on a Swarm node.

``Workspace`` and ``RemoteWorkspace`` block: the first is shipped into Swarm
sandboxes and run there by the agent, so it stays plain synchronous code, and
the second answers each call with a round trip to that agent (through
``AgentClient.call_sync``, which only works off the event loop). Handlers and
the session manager use ``AsyncWorkspace`` instead; it alone decides what runs
in a worker thread, so nothing that blocks, or needs the loop free, runs on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import IO, Any, TypeVar

from ..errors import FileTooLarge
from ..limits import format_size
from .rules import CHUNK, INLINE, Archive, Bounds, Upload, Walk, Workspace

log = logging.getLogger(__name__)

T = TypeVar("T")

# Archives are made on threads of their own, a few pieces at a time: however many are
# downloaded at once, the threads every session's file calls wait on stay free.
ARCHIVE_THREADS = 2
_archives = ThreadPoolExecutor(ARCHIVE_THREADS, thread_name_prefix="sbx-archive")

# Uploads being discarded for a closed connection; held so the loop does not drop them.
_discarding: set[asyncio.Task] = set()


async def _blocking(call: Callable[..., T], *args: Any, executor: Executor | None = None) -> T:
    """Run a workspace call in a worker thread: the one way this module blocks.

    On ``executor``'s threads if given (archives', watchers'), else on the
    default executor's, which request-path file calls and engine calls share.
    """
    if executor is None:
        return await asyncio.to_thread(call, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, call, *args)


class AsyncWorkspace:
    """A session's files, awaitable; wraps a ``Workspace`` or a ``RemoteWorkspace``."""

    def __init__(self, workspace: Workspace) -> None:
        self.sync = workspace

    async def list(self, path: str) -> dict[str, Any]:
        return await _blocking(self.sync.list, path)

    async def tree(self, path: str, depth: int) -> dict[str, Any]:
        return await _blocking(self.sync.tree, path, depth)

    async def stat(self, path: str) -> dict[str, Any]:
        return await _blocking(self.sync.stat, path)

    async def walk(
        self, parts: list[str], bounds: Bounds, recurse: bool = True, on: Executor | None = None
    ) -> Walk:
        """Every entry under ``parts`` with its stat, within ``bounds`` (``Workspace.walk``);
        background walks (a watcher's) run ``on`` threads of their own."""
        return await _blocking(self.sync.walk, parts, bounds, recurse, executor=on)

    async def make_dir(self, path: str) -> bool:
        return await _blocking(self.sync.make_dir, path)

    async def move(self, source: str, destination: str) -> dict[str, Any]:
        return await _blocking(self.sync.move, source, destination)

    async def free_bytes(self) -> int:
        return await _blocking(self.sync.free_bytes)

    async def usage(self) -> int:
        """Bytes in the workspace's files (a bounded walk)."""
        return await _blocking(self.sync.usage)

    async def remove(self, path: str) -> None:
        await _blocking(self.sync.remove, path)

    async def open_read(self, path: str) -> tuple[AsyncReader, os.stat_result]:
        file, info = await _blocking(self.sync.open_read, path)
        return AsyncReader(file), info

    async def archive(self, path: str, fmt: str, max_size: int) -> AsyncReader:
        """A directory as a tar.gz or zip, made as it is read; refused up front past ``max_size``.

        ``max_size`` bounds the files' apparent sizes (a sparse file counts
        whole), so no archive costs more than that much reading and compressing.
        """
        archive = await _blocking(self.sync.archive, path, fmt, executor=_archives)
        if archive.size > max_size:
            await _blocking(archive.close, executor=_archives)
            where = f"directory {path!r}" if path.strip("/") else "the workspace"
            raise FileTooLarge(
                f"{where} holds {format_size(archive.size)} in {archive.files} files (a sparse "
                f"file counts at its full size), over the archive limit of "
                f"{format_size(max_size)}; download a smaller directory, or its files one by one"
            )
        return AsyncReader(archive, _archives)

    async def open_write(self, path: str) -> AsyncUpload:
        return AsyncUpload(await _blocking(self.sync.open_write, path))

    async def save(self, path: str, data: bytes) -> AsyncUpload:
        """Write a whole file (renamed into place only once complete); its size and hash."""
        upload = await self.open_write(path)
        try:
            await upload.write(data)
        except BaseException:
            await upload.finish(False)
            raise
        await upload.finish(True)
        return upload

    async def baseline(self) -> None:
        """Remember the files before an execution, unless the last one's end still holds."""
        if self.sync.seen is None:
            await _blocking(self.sync.baseline)

    async def changes(self) -> tuple[list[dict[str, Any]], bool]:
        """What an execution created, changed or deleted, hashed, and whether the walk was cut.

        A small workspace is walked right here: a few directory entries cost
        less than a trip to a worker thread, which would add to every
        execute's round trip. That walk has tight bounds (the kernel may have
        grown the tree since): cut short, it is redone in a thread, as a larger
        workspace (or a remote one, never small) always is. Hashing reads
        files, so it runs in a thread, and only when something changed.
        """
        changes, cut = None, False
        if self.sync.small:
            walk = self.sync.walk([], INLINE)
            if walk.truncated is None:
                changes = self.sync.changes(walk)
        if changes is None:
            changes = await _blocking(self.sync.changes)
            cut = self.sync.cut is not None
        if changes:
            await _blocking(self.sync.hash, changes)
        return changes, cut


class AsyncReader:
    """A file or archive being downloaded, read a chunk at a time."""

    def __init__(self, file: IO[bytes] | Archive, executor: Executor | None = None) -> None:
        self._file = file
        self._executor = executor  # None: the default one
        self._digest = hashlib.sha256()  # of what was read, for the record of a download
        self.size = 0

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    async def read(self, size: int = CHUNK) -> bytes:
        return await self._run(self._read, size)

    def _read(self, size: int) -> bytes:
        chunk = self._file.read(size)
        self._digest.update(chunk)
        self.size += len(chunk)
        return chunk

    async def aclose(self) -> None:
        # A remote download cut short tells the agent to close its end: a round trip.
        await self._run(self._file.close)

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, *args)

    async def __aenter__(self) -> AsyncReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncUpload:
    """A file being uploaded: written, then renamed into place or discarded, exactly once.

    Each step waits for the one before, so a discard never races a chunk
    still being written in a thread.
    """

    def __init__(self, upload: Upload) -> None:
        self._upload = upload
        self._lock = asyncio.Lock()
        self._finished = False
        self._digest = hashlib.sha256()  # of what was received, for the upload's record

    @property
    def size(self) -> int:
        return self._upload.size

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    async def write(self, chunk: bytes) -> None:
        async with self._lock:
            await _blocking(self._write, chunk)

    def _write(self, chunk: bytes) -> None:
        self._upload.write(chunk)
        self._digest.update(chunk)

    async def finish(self, ok: bool) -> None:
        """Rename into place (``ok``) or discard; later calls do nothing."""
        async with self._lock:
            if self._finished:
                return
            self._finished = True
            await _blocking(self._upload.finish, ok)

    def discard(self) -> None:
        """Discard in the background, for callbacks that cannot wait (a closed connection)."""
        task = asyncio.get_running_loop().create_task(self.finish(False))
        _discarding.add(task)
        task.add_done_callback(_discarded)


def _discarded(task: asyncio.Task) -> None:
    _discarding.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not discard an unfinished upload: %s", task.exception())
