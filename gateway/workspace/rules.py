"""Host-side access to a session's workspace that sandboxed code cannot subvert.

The sandbox controls every name in its workspace, so the gateway resolves
paths one component at a time from a directory descriptor with
``O_NOFOLLOW``: a symlink anywhere in a path is refused, never followed, and
nothing but regular files and directories is ever opened (a FIFO or device
would block or leak). Relative names only; ``..``, absolute paths and NUL
bytes are refused before any system call. The workspace is its own
filesystem, so no hard link can reach outside it either.

The sandbox also shapes the tree: a chain ten thousand directories deep, a
directory of a million names, a sparse terabyte file. Every walk (listing,
artifacts, usage, archives) goes through one walker bounded in depth, entries
and time, which says when it stopped early; removal is iterative and bounded
in time, so no tree shape can hold the gateway up (issue 18).

Over 500 lines on purpose: the Swarm agent runs this very file inside each
sandbox (``inside/agent.py``), shipped alone beside ``errors.py`` and
``timestamps.py``, so the path rules, the walker and the archive writer stay
in one standard-library module.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mimetypes
import os
import stat
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, Any

from ..errors import BadRequest, Conflict, FileNotFound, GatewayError, NotAFile, PathForbidden
from ..timestamps import iso

CHUNK = 256 * 1024
UPLOAD_PREFIX = ".sbx-upload-"
REMOVE_PREFIX = ".sbx-remove-"  # directories too deep to hold open are moved up under this
# Up to this many entries, a workspace is walked on the event loop (see files.AsyncWorkspace).
SMALL_WORKSPACE = 64
# Bytes of changed files one execution's record hashes; files past it get sha256 None.
HASH_BUDGET = 256 * 2**20
# A DELETE stops after this long; what is left, the next one removes.
REMOVE_SECONDS = 10.0
# Directories held open at once while removing; deeper ones are moved up first.
REMOVE_DEPTH = 32


@dataclass(frozen=True)
class Bounds:
    """How far one walk may go: levels below its start, entries met, seconds spent."""

    depth: int = 64
    entries: int = 10_000
    seconds: float = 5.0


WALK = Bounds()
# The walk that tells what an execution changed: a workspace of 10,000 files (in
# a few hundred directories) is seen whole (docs/PERFORMANCE.md, "Recording file changes").
SNAPSHOT = Bounds(entries=20_000)
# A walk on the event loop (the workspace was small at the last one); cut short, it
# is redone in a thread.
INLINE = Bounds(entries=4 * SMALL_WORKSPACE, seconds=0.02)


@dataclass
class Walk:
    """What one bounded walk met, in walk order, and why it stopped early (``None``: it did not)."""

    entries: list[tuple[str, os.stat_result]] = field(default_factory=list)
    truncated: str | None = None

    @property
    def files(self) -> list[tuple[str, os.stat_result]]:
        """The regular files met (links, FIFOs and devices are never followed or opened)."""
        return [(rel, info) for rel, info in self.entries if stat.S_ISREG(info.st_mode)]


# The times a zip entry can carry: 1980-01-01 to 2107-12-31 (UTC).
_ZIP_EPOCH, _ZIP_END = 315532800, 4354819199


def clean_path(path: str, allow_root: bool = False) -> list[str]:
    """Split a client path into safe components, or refuse it with a 400."""
    if "\x00" in path:
        raise BadRequest("path contains a NUL byte")
    if path.startswith("/"):
        raise BadRequest(f"path {path!r} is absolute; paths are relative to the workspace")
    parts = [p for p in PurePosixPath(path).parts if p not in ("", ".")]
    if ".." in parts:
        raise BadRequest(f"path {path!r} contains '..'; paths must stay inside the workspace")
    if not parts and not allow_root:
        raise BadRequest("a file path is required")
    return parts


@dataclass
class Workspace:
    """One session's workspace directory on the host."""

    root: str
    uid: int
    gid: int
    # The files as of the last execution's end: (mtime, size) by path.
    seen: dict[str, tuple[int, int]] | None = field(default=None, repr=False)
    walked: int = field(default=0, repr=False)  # entries the last full walk went through
    cut: str | None = field(default=None, repr=False)  # why the last snapshot stopped early
    # sha256 of files hashed before, by path, with the (mtime, size) they had then.
    digests: dict[str, tuple[tuple[int, int], str]] = field(default_factory=dict, repr=False)

    # -- resolving --------------------------------------------------------------------

    def _open_dir(self, parts: list[str], create: bool = False) -> int:
        """An fd for the directory ``parts``, walked without following links."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o755, dir_fd=fd)
                        os.chown(name, self.uid, self.gid, dir_fd=fd, follow_symlinks=False)
                next_fd = self._open_at(fd, name, os.O_RDONLY | os.O_DIRECTORY, "/".join(parts))
                os.close(fd)
                fd = next_fd
            return fd
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _open_at(dir_fd: int, name: str, flags: int, shown: str, mode: int = 0o644) -> int:
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except FileNotFoundError:
            raise FileNotFound(f"{shown!r} does not exist in the workspace") from None
        except OSError as e:
            # O_NOFOLLOW reports a link as ELOOP, or as ENOTDIR with O_DIRECTORY.
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise PathForbidden(
                    f"{shown!r} is or goes through a symbolic link; the gateway never follows links"
                ) from None
            raise NotAFile(f"{shown!r}: a part of this path is not a directory") from None

    def open_read(self, path: str) -> tuple[IO[bytes], os.stat_result]:
        """Open a regular file for reading; refuse links, devices, FIFOs."""
        parts = clean_path(path)
        dir_fd = self._open_dir(parts[:-1])
        try:
            fd = self._open_at(dir_fd, parts[-1], os.O_RDONLY | os.O_NONBLOCK, path)
        finally:
            os.close(dir_fd)
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            os.close(fd)
            raise NotAFile(f"{path!r} is a directory; list it, or download it with ?format=tar")
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise PathForbidden(f"{path!r} is not a regular file; only files can be downloaded")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), info

    def open_write(self, path: str) -> Upload:
        """Start an upload to ``path``; parent directories are created as needed."""
        self.seen = None
        parts = clean_path(path)
        dir_fd = self._open_dir(parts[:-1], create=True)
        temp = f"{UPLOAD_PREFIX}{os.urandom(6).hex()}"
        try:
            fd = self._open_at(dir_fd, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, path)
            os.fchown(fd, self.uid, self.gid)
        except BaseException:
            os.close(dir_fd)
            raise
        return Upload(os.fdopen(fd, "wb"), dir_fd, temp, parts[-1])

    def free_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    # -- listing, removing ---------------------------------------------------------------

    def list(self, path: str, bounds: Bounds = WALK) -> dict[str, Any]:
        """A directory's entries (name, path, type, size, modified); ``truncated`` past bounds."""
        parts = clean_path(path, allow_root=True)
        walk = self.walk(parts, bounds, recurse=False)
        rows = [_entry(rel, info) for rel, info in walk.entries]
        return {"entries": sorted(rows, key=_by_path), "truncated": walk.truncated is not None}

    def tree(self, path: str, depth: int) -> dict[str, Any]:
        """Entries down to ``depth`` levels below ``path`` (1: its own), as ``list`` shows them."""
        parts = clean_path(path, allow_root=True)
        walk = self.walk(parts, Bounds(depth=depth), recurse=depth > 1)
        rows = [_entry(rel, info) for rel, info in walk.entries]
        cut = walk.truncated is not None and not walk.truncated.startswith("deeper")
        return {"entries": sorted(rows, key=_by_path), "truncated": cut}

    def stat(self, path: str) -> dict[str, Any]:
        """One entry (the workspace itself for ``""``); links are reported, never followed."""
        parts = clean_path(path, allow_root=True)
        if not parts:
            return _entry("", os.stat(self.root))
        dir_fd = self._open_dir(parts[:-1])
        try:
            info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileNotFound(f"{path!r} does not exist in the workspace") from None
        finally:
            os.close(dir_fd)
        return _entry("/".join(parts), info)

    def make_dir(self, path: str) -> bool:
        """Create a directory and its parents; False if it was there already."""
        self.seen = None
        parts = clean_path(path)
        dir_fd = self._open_dir(parts[:-1], create=True)
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=dir_fd)
            os.chown(parts[-1], self.uid, self.gid, dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            return False
        finally:
            os.close(dir_fd)
        return True

    def move(self, source: str, destination: str) -> dict[str, Any]:
        """Rename a file or directory (parents of the destination made as needed)."""
        self.seen = None
        src, dst = clean_path(source), clean_path(destination)
        src_fd = self._open_dir(src[:-1])
        try:
            dst_fd = self._open_dir(dst[:-1], create=True)
            try:
                os.rename(src[-1], dst[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except FileNotFoundError:
                raise FileNotFound(f"{source!r} does not exist in the workspace") from None
            except OSError as e:
                raise Conflict(f"cannot move {source!r} to {destination!r}: {e.strerror}") from None
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)
        return self.stat(destination)

    def remove(self, path: str, seconds: float = REMOVE_SECONDS) -> None:
        """Delete a file, link or directory tree (links are removed, never followed)."""
        self.seen = None
        parts = clean_path(path)
        dir_fd = self._open_dir(parts[:-1])
        try:
            info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                remove_tree(dir_fd, parts[-1], seconds)
            else:
                os.unlink(parts[-1], dir_fd=dir_fd)
        except FileNotFoundError:
            raise FileNotFound(f"{path!r} does not exist in the workspace") from None
        except TimeoutError:
            raise Conflict(
                f"{path!r} holds too many entries to delete in {seconds:g} s; part of it is "
                "gone: send the DELETE again to remove the rest"
            ) from None
        finally:
            os.close(dir_fd)

    def walk(self, parts: list[str], bounds: Bounds = WALK, recurse: bool = True) -> Walk:
        """Every entry under ``parts`` with its stat, links never followed, within ``bounds``.

        Directories are opened from their parent's descriptor, never by path,
        and at most ``bounds.depth`` are held open at once. Past the entry or
        time bound the walk stops; a directory past the depth bound is skipped.
        """
        walk = Walk()
        deadline = time.monotonic() + bounds.seconds
        top = self._open_dir(parts)  # 404 / 403 for the start itself
        stack = [(top, parts, os.scandir(top))]
        try:
            while stack:
                _fd, here, entries = stack[-1]
                entry = next(entries, None)
                if entry is None:
                    _close(stack.pop())
                elif entry.name.startswith(UPLOAD_PREFIX):
                    continue
                elif len(walk.entries) >= bounds.entries:
                    walk.truncated = f"more than {bounds.entries} entries"
                    break
                elif time.monotonic() > deadline:
                    walk.truncated = f"more than {bounds.seconds:g} s"
                    break
                else:
                    below = bounds.depth - len(here) + len(parts) if recurse else 0
                    self._meet(walk, stack, entry, [*here, entry.name], below, bounds.depth)
        finally:
            for level in stack:
                _close(level)
        if not parts:  # a subdirectory's count (an archive's) says nothing of the workspace
            self.walked = len(walk.entries)
        return walk

    @staticmethod
    def _meet(
        walk: Walk, stack: list, entry: os.DirEntry, rel: list[str], below: int, depth: int
    ) -> None:
        """Record one entry; go down into a directory if ``below`` > 1 levels may follow."""
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return  # removed meanwhile
        walk.entries.append(("/".join(rel), info))
        if not stat.S_ISDIR(info.st_mode) or not below:
            return
        if below <= 1:
            walk.truncated = walk.truncated or f"deeper than {depth} levels"
            return
        try:
            fd = os.open(entry.name, _DIR_FLAGS, dir_fd=stack[-1][0])
        except OSError:
            return  # replaced by a link or removed meanwhile: skip it
        stack.append((fd, rel, os.scandir(fd)))

    def usage(self) -> int:
        """Bytes in the workspace's files, as far as a bounded walk sees."""
        return sum(info.st_size for _, info in self.walk([]).files)

    # -- archives and artifacts ------------------------------------------------------------

    def archive(self, path: str, fmt: str) -> Archive:
        """A directory as a tar.gz or zip, made piece by piece as it is read: nothing is spooled.

        The files are listed first, so the caller learns the archive's size
        (the files' apparent sizes: a sparse file counts whole) before a byte
        is sent, and can refuse it while a status code still can. Each file
        then gives exactly the size listed (cut if it grew since, padded with
        zeros if it shrank, as tar does), so the archive never outgrows that.

        Refused, before any work, past the walk's bounds; a caller refuses a
        ``size`` past its cap (sparse files count whole).
        """
        if fmt not in ("tar", "zip"):
            raise BadRequest("format must be 'tar' or 'zip'")
        parts = clean_path(path, allow_root=True)
        members = [
            ("/".join(rel.split("/")[len(parts) :]), rel, info)
            for rel, info in self._archivable(parts, path)
        ]
        size = sum(info.st_size for _, _, info in members)
        pieces = self._tar_gz(members) if fmt == "tar" else self._zip(members)
        return Archive(pieces, size, len(members), pieces.close)

    def _member(self, rel: str, size: int) -> Iterator[bytes] | None:
        """Exactly ``size`` bytes of a listed file, or None if it is gone or no longer a file."""
        try:
            file, _ = self.open_read(rel)
        except (GatewayError, OSError):
            return None

        def chunks() -> Iterator[bytes]:
            left = size
            with file:
                while left and (chunk := file.read(min(CHUNK, left))):
                    left -= len(chunk)
                    yield chunk
            while left:
                pad = min(CHUNK, left)
                left -= pad
                yield bytes(pad)

        return chunks()

    def _tar_gz(self, members: list[tuple[str, str, os.stat_result]]) -> Generator[bytes]:
        """The tar format written block by block (tarfile would copy a whole file per call)."""
        gz = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # a gzip stream
        offset = 0
        for name, rel, info in members:
            chunks = self._member(rel, info.st_size)
            if chunks is None:
                continue
            header = tarfile.TarInfo(name)
            header.size, header.mtime, header.mode = info.st_size, info.st_mtime, 0o644
            block = header.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            pad = bytes(-info.st_size % tarfile.BLOCKSIZE)  # data fills whole blocks
            offset += len(block) + info.st_size + len(pad)
            yield gz.compress(block)
            for chunk in chunks:
                yield gz.compress(chunk)
            yield gz.compress(pad)
        end = tarfile.BLOCKSIZE * 2
        end += -(offset + end) % tarfile.RECORDSIZE
        yield gz.compress(bytes(end)) + gz.flush()

    def _zip(self, members: list[tuple[str, str, os.stat_result]]) -> Generator[bytes]:
        """A zip written to a sink that cannot seek: each entry streams, sizes after its data."""
        sink = _Sink()
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, rel, info in members:
                chunks = self._member(rel, info.st_size)
                if chunks is None:
                    continue
                # Zip names are UTF-8 and its times 1980..2107, whatever the sandbox chose.
                entry = zipfile.ZipInfo(
                    name.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                    time.gmtime(min(max(info.st_mtime, _ZIP_EPOCH), _ZIP_END))[:6],
                )
                entry.compress_type = zipfile.ZIP_DEFLATED
                entry.file_size = info.st_size  # lets zipfile choose zip64 up front
                with zf.open(entry, "w") as dest:
                    for chunk in chunks:
                        dest.write(chunk)
                        yield sink.take()
                yield sink.take()
        yield sink.take()

    def _archivable(self, parts: list[str], path: str) -> list[tuple[str, os.stat_result]]:
        """The files an archive of ``parts`` would hold, or a 409 saying why it is refused."""
        walk = self.walk(parts)
        shown = path or "the workspace"
        if walk.truncated is not None:
            raise Conflict(
                f"{shown!r} is too large to archive ({walk.truncated}); "
                "download its subdirectories or files one by one"
            )
        return walk.files

    def snapshot(self, walk: Walk | None = None) -> dict[str, tuple[int, int]]:
        """(mtime, size) of every file, to tell what an execution changed."""
        walk = walk or self.walk([], SNAPSHOT)
        self.cut = walk.truncated
        return {rel: (info.st_mtime_ns, info.st_size) for rel, info in walk.files}

    def baseline(self) -> None:
        """Remember the files as they are now, before an execution.

        The walk that ended the last execution serves as the next one's
        baseline, so an execute usually costs one walk; the gateway's own
        writes (uploads, removals) drop it, so that what a client put there is
        never reported as the code's doing.
        """
        if self.seen is None:
            self.seen = self.snapshot()

    @property
    def small(self) -> bool:
        """Whether a walk of the workspace is known to be quick (few files at the last one)."""
        return self.seen is not None and self.walked <= SMALL_WORKSPACE

    def changes(self, walk: Walk | None = None) -> list[dict[str, Any]]:
        """Files created, modified or deleted since the baseline (``walk``: done already).

        A walk cut short leaves ``cut`` saying why: the changes are then those
        of the part it saw, and no file is called deleted (it may be unseen).
        Created and modified files carry their MIME type; ``hash`` adds digests.
        """
        before = self.seen or {}
        complete = self.seen is not None and self.cut is None
        self.seen = after = self.snapshot(walk)
        changes = [
            {
                "path": rel,
                "size": size,
                "mime_type": mimetypes.guess_type(rel)[0] or "application/octet-stream",
                "change": "modified" if rel in before else "created",
            }
            for rel, (mtime, size) in after.items()
            if before.get(rel) != (mtime, size)
        ]
        if complete and self.cut is None:
            changes += [
                {"path": rel, "size": size, "change": "deleted"}
                for rel, (_, size) in before.items()
                if rel not in after
            ]
        return sorted(changes, key=_by_path)

    def hash(self, changes: list[dict[str, Any]], budget: int = HASH_BUDGET) -> None:
        """Give each change its file's sha256, reading at most ``budget`` bytes in all.

        A deleted file has the digest it had when last hashed here, if it was;
        a file past the budget, or gone or replaced meanwhile, has None.
        """
        for change in changes:
            rel = change["path"]
            if change["change"] == "deleted":
                known = self.digests.pop(rel, None)
                change["sha256"] = known[1] if known else None
                continue
            change["sha256"] = None
            if change["size"] > budget:
                continue
            budget -= change["size"]
            with contextlib.suppress(GatewayError, OSError):
                change["sha256"] = self.digest(rel)

    def digest(self, path: str) -> str:
        """The sha256 of a file, opened as a download is (no links, no devices)."""
        file, info = self.open_read(path)
        digest = hashlib.sha256()
        with file:
            while chunk := file.read(CHUNK):
                digest.update(chunk)
        sha = digest.hexdigest()
        self.digests.pop(path, None)
        self.digests[path] = ((info.st_mtime_ns, info.st_size), sha)
        while len(self.digests) > SNAPSHOT.entries:  # bounded: the oldest go first
            del self.digests[next(iter(self.digests))]
        return sha


class Archive:
    """An archive being made as it is read: each ``read`` makes the next piece.

    ``size`` is the bytes of the files it holds (their apparent sizes),
    known before the first read; ``close`` stops it and closes its files.
    """

    def __init__(
        self, pieces: Iterator[bytes], size: int, files: int, close: Callable[[], None]
    ) -> None:
        self._pieces = pieces
        self._buffer = b""
        self.size, self.files = size, files
        self.close = close

    def read(self, size: int = CHUNK) -> bytes:
        """Up to ``size`` bytes, empty only at the end; one file chunk of work at most."""
        while not self._buffer:
            piece = next(self._pieces, None)
            if piece is None:
                return b""
            self._buffer = piece
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Sink:
    """Where zipfile writes: no seek or tell, so it streams; the caller takes what it wrote."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


class Upload:
    """A file being uploaded under a hidden name, renamed into place on success.

    A failed or cancelled upload thus never leaves half a file under the real name.
    """

    def __init__(self, file: IO[bytes], dir_fd: int, temp: str, final: str) -> None:
        self.file, self.dir_fd, self.temp, self.final = file, dir_fd, temp, final
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.size += len(chunk)

    def finish(self, ok: bool) -> None:
        """Rename into place (or discard) and release the descriptors; call once."""
        try:
            self.file.close()
            if ok:
                with contextlib.suppress(FileNotFoundError):
                    existing = os.stat(self.final, dir_fd=self.dir_fd, follow_symlinks=False)
                    if stat.S_ISDIR(existing.st_mode):
                        raise NotAFile(f"{self.final!r} is a directory; choose another name")
                os.rename(self.temp, self.final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.temp, dir_fd=self.dir_fd)
            os.close(self.dir_fd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _close(level: tuple[int, Any, Any]) -> None:
    """Close one level of a walk: its scandir iterator (a copy of the fd) and the fd."""
    fd, _, entries = level
    entries.close()
    os.close(fd)


def remove_tree(parent_fd: int, name: str, seconds: float | None = None) -> None:
    """Delete directory ``name`` under ``parent_fd`` and all below it, never following a link.

    Iterative, from directory descriptors: no path is resolved twice, depth
    costs no recursion, and at most ``REMOVE_DEPTH`` directories are open at
    once (deeper ones are moved up under the top first, a rename each).
    Past ``seconds`` it raises ``TimeoutError``; what is left can be removed
    by calling again. Entries removed meanwhile by someone else are skipped.
    """
    deadline = None if seconds is None else time.monotonic() + seconds
    top = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    stack = [(top, name, os.scandir(top))]
    try:
        while stack:
            fd, own, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                if len(stack) == 1 and _has_entries(fd):
                    stack[0] = (fd, own, os.scandir(fd))  # directories moved up meanwhile
                    continue
                stack.pop()
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(own, dir_fd=stack[-1][0] if stack else parent_fd)
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{name!r} is not yet removed")
            with contextlib.suppress(FileNotFoundError):
                _remove_entry(stack, entry, top)
    finally:
        for level in stack:
            _close(level)


def _has_entries(fd: int) -> bool:
    with os.scandir(fd) as entries:
        return next(entries, None) is not None


def _remove_entry(stack: list, entry: os.DirEntry, top: int) -> None:
    fd = stack[-1][0]
    if not entry.is_dir(follow_symlinks=False):
        os.unlink(entry.name, dir_fd=fd)
    elif len(stack) < REMOVE_DEPTH:
        child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
        stack.append((child, entry.name, os.scandir(child)))
    else:
        moved = f"{REMOVE_PREFIX}{os.urandom(8).hex()}"
        os.rename(entry.name, moved, src_dir_fd=fd, dst_dir_fd=top)


def _by_path(row: dict[str, Any]) -> str:
    return row["path"]


_KINDS = {stat.S_IFDIR: "directory", stat.S_IFREG: "file", stat.S_IFLNK: "symlink"}


def _entry(path: str, info: os.stat_result) -> dict[str, Any]:
    kind = _KINDS.get(stat.S_IFMT(info.st_mode), "other")
    return {
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "type": kind,
        "size": info.st_size if kind == "file" else None,
        "modified": iso(info.st_mtime),
    }
