"""A session's workspace: a size-limited, disk-backed filesystem on the host.

A tmpfs workspace would count against the container's memory, turning a full
disk into an out-of-memory kill. A loop-mounted ext4 image gives the sandbox a
real ENOSPC at exactly its disk limit, costs no memory, stays readable on the
host after the kernel dies, and, being its own filesystem, cannot hold a hard
link to any host file. It needs root; elsewhere the workspace is a plain
directory and the disk limit is not enforced (the gateway warns at start).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ..workspace.rules import remove_tree

READ_ONLY_VIEW = "read-only"  # beside a named volume's ``workspace`` (``read_only_view``)
COPY_DEPTH = 64  # deeper workspaces are not copied into a pooled sandbox: they resume cold
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def loop_mounts_available() -> bool:
    """Tell whether this process can make loop-mounted workspaces."""
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("mkfs.ext4", "mount", "umount"))


def create(session_dir: Path, size: int, uid: int, gid: int) -> Path:
    """Make ``session_dir/workspace``, holding at most ``size`` bytes where possible."""
    image = session_dir / "workspace.img"
    mountpoint = session_dir / "workspace"
    mountpoint.mkdir(parents=True, exist_ok=True)
    if not loop_mounts_available():
        mountpoint.chmod(0o1777)  # without root the sandbox user cannot be given it
        return mountpoint
    with _mounts_of(session_dir):  # a volume's files request waits for it whole
        with open(image, "wb") as f:
            f.truncate(size)  # sparse: only written blocks use host disk
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={uid}:{gid}", str(image))
        _mount(image, mountpoint)
        # ext4 makes lost+found; the sandbox user has no use for it.
        shutil.rmtree(mountpoint / "lost+found", ignore_errors=True)
    return mountpoint


def mount_again(session_dir: Path) -> None:
    """Remount a workspace that a host reboot left unmounted; its files are in the image."""
    image = session_dir / "workspace.img"
    mountpoint = session_dir / "workspace"
    if not loop_mounts_available():
        return
    with _mounts_of(session_dir):  # never beside a delete's unmounting: it would be kept
        if image.is_file() and not os.path.ismount(mountpoint):
            _mount(image, mountpoint)


@contextlib.contextmanager
def _mounts_of(session_dir: Path) -> Iterator[None]:
    """Hold ``session_dir``'s mounts: a flock, so every thread and gateway of the host waits.

    A named volume is remounted, given its read-only view and deleted by calls
    that run at once; each must find the others' mounts whole (a view handed
    out before it is read-only, a mount made after a delete unmounted). A
    directory gone meanwhile holds nothing to lock.
    """
    try:
        fd = os.open(session_dir, _DIR_FLAGS)
    except FileNotFoundError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _mount(image: Path, mountpoint: Path) -> None:
    _run("mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint))


def read_only_view(session_dir: Path) -> Path:
    """A read-only, nosuid, nodev view of the filesystem ``create`` made (a named volume's).

    A container's read-only bind is remounted read-only by the runtime, which
    drops the source's nosuid and nodev; a plain bind of this view keeps all
    three. Without loop mounts it is the directory itself (the runtime's
    read-only bind then stands alone).
    """
    view = session_dir / READ_ONLY_VIEW
    if not loop_mounts_available():
        return session_dir / "workspace"
    with _mounts_of(session_dir):  # not seen mounted before it is read-only
        if not os.path.ismount(view):
            view.mkdir(mode=0o755, exist_ok=True)
            _run("mount", "--bind", str(session_dir / "workspace"), str(view))
            _run("mount", "-o", "remount,bind,ro,nosuid,nodev", str(view))
    return view


def destroy(session_dir: Path) -> None:
    """Unmount and delete a workspace made by ``create`` (safe to call twice).

    A loop-mounted workspace goes with its image, whatever tree it holds. The
    rest (a plain workspace, the run directory the kernel can write) is removed
    from directory descriptors, never following a link, iteratively however deep.
    """
    with _mounts_of(session_dir):  # no remount between the unmounting and the removal
        for name in (READ_ONLY_VIEW, "workspace"):  # a view first: it holds the filesystem too
            mountpoint = session_dir / name
            for _ in range(8):  # mounts stacked by hand (or by a gateway before the lock)
                if not os.path.ismount(mountpoint):
                    break
                _run("umount", "-l", str(mountpoint))
        try:
            parent = os.open(session_dir.parent, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return  # no session ever had a directory here (one another gateway was starting)
        try:
            remove_tree(parent, session_dir.name)
        except FileNotFoundError:
            pass  # removed already
        finally:
            os.close(parent)


def _run(*cmd: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise OSError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")


def copy_tree(source: Path, target: Path) -> None:
    """Copy a workspace's tree into another, empty one, never following a link.

    Directories and regular files keep their mode, owner and times; a link is
    copied as a link. Sockets, FIFOs and devices are left out (nothing a
    paused kernel can hold open). From directory descriptors, iteratively;
    raises ``ValueError`` past ``COPY_DEPTH`` levels (the caller starts cold).
    """
    top_s = os.open(source, _DIR_FLAGS)
    top_t = os.open(target, _DIR_FLAGS)
    stack = [(top_s, top_t, os.scandir(top_s), os.fstat(top_s))]
    try:
        while stack:
            src, dst, entries, own = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.utime(dst, ns=(own.st_atime_ns, own.st_mtime_ns))
                stack.pop()
                os.close(src)
                os.close(dst)
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= COPY_DEPTH:
                    raise ValueError(f"the workspace is deeper than {COPY_DEPTH} directories")
                os.mkdir(entry.name, 0o700, dir_fd=dst)
                child_t = os.open(entry.name, _DIR_FLAGS, dir_fd=dst)
                os.fchown(child_t, st.st_uid, st.st_gid)
                os.fchmod(child_t, stat.S_IMODE(st.st_mode))
                child_s = os.open(entry.name, _DIR_FLAGS, dir_fd=src)
                stack.append((child_s, child_t, os.scandir(child_s), st))
            elif stat.S_ISREG(st.st_mode):
                _copy_file(src, dst, entry.name)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(entry.name, dir_fd=src), entry.name, dir_fd=dst)
                os.chown(entry.name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
    finally:
        for src, dst, entries, _ in stack:
            entries.close()
            os.close(src)
            os.close(dst)


def _copy_file(src_dir: int, dst_dir: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return  # changed under us: only regular files are copied
        out = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst_dir
        )
        try:
            offset = 0
            while offset < st.st_size:
                done = os.sendfile(out, fd, offset, min(st.st_size - offset, 1 << 30))
                if done == 0:
                    break  # it shrank meanwhile
                offset += done
            os.fchown(out, st.st_uid, st.st_gid)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE): never neither, never both."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, bytes(a), _AT_FDCWD, bytes(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a))
