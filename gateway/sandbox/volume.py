"""A session's workspace: a size-limited, disk-backed filesystem on the host.

A tmpfs workspace would count against the container's memory, turning a full
disk into an out-of-memory kill. A loop-mounted ext4 image gives the sandbox a
real ENOSPC at exactly its disk limit, costs no memory, stays readable on the
host after the kernel dies, and, being its own filesystem, cannot hold a hard
link to any host file. It needs root; elsewhere the workspace is a plain
directory and the disk limit is not enforced (the gateway warns at start).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .workspace import remove_tree


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
    if loop_mounts_available() and image.is_file() and not os.path.ismount(mountpoint):
        _mount(image, mountpoint)


def _mount(image: Path, mountpoint: Path) -> None:
    _run("mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint))


def destroy(session_dir: Path) -> None:
    """Unmount and delete a workspace made by ``create`` (safe to call twice).

    A loop-mounted workspace goes with its image, whatever tree it holds. The
    rest (a plain workspace, the run directory the kernel can write) is removed
    from directory descriptors, never following a link, iteratively however deep.
    """
    mountpoint = session_dir / "workspace"
    if os.path.ismount(mountpoint):
        _run("umount", "-l", str(mountpoint))
    parent = os.open(session_dir.parent, os.O_RDONLY | os.O_DIRECTORY)
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
