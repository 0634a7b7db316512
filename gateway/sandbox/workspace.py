"""Host-side access to a session's workspace that sandboxed code cannot subvert.

The sandbox controls every name in its workspace, so the gateway resolves
paths one component at a time from a directory descriptor with
``O_NOFOLLOW``: a symlink anywhere in a path is refused, never followed, and
nothing but regular files and directories is ever opened (a FIFO or device
would block or leak). Relative names only; ``..``, absolute paths and NUL
bytes are refused before any system call. The workspace is its own
filesystem, so no hard link can reach outside it either.
"""

from __future__ import annotations

import contextlib
import errno
import mimetypes
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import IO, Any

from ..errors import BadRequest, FileNotFound, GatewayError, NotAFile, PathForbidden

CHUNK = 256 * 1024
UPLOAD_PREFIX = ".sbx-upload-"
# Artifact scans stop here so a workspace of millions of files cannot stall executes.
MAX_SCAN_ENTRIES = 10_000
# Up to this many entries, a workspace is walked on the event loop (see files.AsyncWorkspace).
SMALL_WORKSPACE = 64


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


def iso(ts: float | None) -> str | None:
    """Render an epoch time as the API's UTC ISO 8601 form."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    """The epoch time of an ``iso()`` string."""
    return datetime.fromisoformat(text).timestamp()


@dataclass
class Workspace:
    """One session's workspace directory on the host."""

    root: str
    uid: int
    gid: int
    # The files as of the last execution's end: (mtime, size) by path.
    seen: dict[str, tuple[int, int]] | None = field(default=None, repr=False)
    walked: int = field(default=0, repr=False)  # entries the last full walk went through

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

    def list(self, path: str) -> list[dict[str, Any]]:
        """Entries of a directory: name, path, type, size, modification time."""
        parts = clean_path(path, allow_root=True)
        fd = self._open_dir(parts)
        prefix = "/".join(parts)
        try:
            with os.scandir(fd) as entries:
                rows = [_entry(e, f"{prefix}/{e.name}" if prefix else e.name) for e in entries]
        finally:
            os.close(fd)
        return sorted((r for r in rows if not r["name"].startswith(UPLOAD_PREFIX)), key=_by_path)

    def remove(self, path: str) -> None:
        """Delete a file, link or directory tree (links are removed, never followed)."""
        self.seen = None
        parts = clean_path(path)
        dir_fd = self._open_dir(parts[:-1])
        try:
            info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(parts[-1], dir_fd=dir_fd)
            else:
                os.unlink(parts[-1], dir_fd=dir_fd)
        except FileNotFoundError:
            raise FileNotFound(f"{path!r} does not exist in the workspace") from None
        finally:
            os.close(dir_fd)

    def walk(self, parts: list[str], limit: int = MAX_SCAN_ENTRIES) -> Iterator[tuple[str, Any]]:
        """Regular files under ``parts`` as (relative path, stat), links skipped."""
        stack = [parts]
        seen = 0
        while stack and seen < limit:
            current = stack.pop()
            try:
                fd = self._open_dir(current)
            except (GatewayError, OSError):
                continue  # replaced by a link or removed meanwhile: skip it
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        seen += 1
                        info = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(info.st_mode):
                            stack.append([*current, entry.name])
                        elif stat.S_ISREG(info.st_mode) and not entry.name.startswith(
                            UPLOAD_PREFIX
                        ):
                            yield "/".join([*current, entry.name]), info
            finally:
                os.close(fd)
        if not parts:  # a subdirectory's count (an archive's) says nothing of the workspace
            self.walked = seen

    # -- archives and artifacts ------------------------------------------------------------

    def archive(self, path: str, fmt: str) -> IO[bytes]:
        """A tar or zip of a directory, spooled to disk beyond a few MB."""
        parts = clean_path(path, allow_root=True)
        os.close(self._open_dir(parts))  # 404 / 403 before any work
        spool = tempfile.SpooledTemporaryFile(max_size=8 * 2**20)
        base = len(parts)
        if fmt == "zip":
            with zipfile.ZipFile(spool, "w", zipfile.ZIP_DEFLATED) as zf:
                for rel, _ in self.walk(parts):
                    file, _info = self.open_read(rel)
                    with file, zf.open("/".join(rel.split("/")[base:]), "w") as dest:
                        shutil.copyfileobj(file, dest, CHUNK)
        elif fmt == "tar":
            with tarfile.open(fileobj=spool, mode="w:gz") as tar:
                for rel, info in self.walk(parts):
                    member = tarfile.TarInfo("/".join(rel.split("/")[base:]))
                    member.size, member.mtime, member.mode = info.st_size, info.st_mtime, 0o644
                    file, _info = self.open_read(rel)
                    with file:
                        tar.addfile(member, file)
        else:
            raise BadRequest("format must be 'tar' or 'zip'")
        spool.seek(0)
        return spool

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """(mtime, size) of every file, to tell what an execution changed."""
        return {rel: (info.st_mtime_ns, info.st_size) for rel, info in self.walk([])}

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

    def changes(self) -> list[dict[str, Any]]:
        """Files created or modified since the baseline, as artifacts."""
        before = self.seen or {}
        self.seen = after = self.snapshot()
        artifacts = [
            {
                "path": rel,
                "size": size,
                "mime_type": mimetypes.guess_type(rel)[0] or "application/octet-stream",
                "change": "modified" if rel in before else "created",
            }
            for rel, (mtime, size) in after.items()
            if before.get(rel) != (mtime, size)
        ]
        return sorted(artifacts, key=_by_path)


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


def _by_path(row: dict[str, Any]) -> str:
    return row["path"]


_KINDS = {stat.S_IFDIR: "directory", stat.S_IFREG: "file", stat.S_IFLNK: "symlink"}


def _entry(entry: os.DirEntry, path: str) -> dict[str, Any]:
    info = entry.stat(follow_symlinks=False)
    kind = _KINDS.get(stat.S_IFMT(info.st_mode), "other")
    return {
        "name": entry.name,
        "path": path,
        "type": kind,
        "size": info.st_size if kind == "file" else None,
        "modified": iso(info.st_mtime),
    }
