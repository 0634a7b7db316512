"""One gateway per data directory: a lock held for the process's life.

A data directory is a gateway's identity (its id labels its kernels'
containers and its leases), its store and its sessions' directories. Two
gateways on one would both claim every session and each end what the other
serves. So a gateway takes ``<data_dir>/gateway.lock`` with ``flock`` before
anything else and keeps it open until it stops; the kernel lets go of it
when the process ends, a crash included. The file is opened without
following a link (``O_NOFOLLOW``) and holds the holder's pid, for the
refusal to name it. ``sbx serve --workers N`` takes its own directory's lock
and gives each worker a directory of its own (``worker-<n>``); gateways that
share a PostgreSQL store each have their own as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from ..errors import ConfigError


class DataDirLock:
    """The lock on one data directory, held until ``release`` or the process's end."""

    NAME = "gateway.lock"

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def take(cls, data_dir: Path) -> DataDirLock:
        """Lock ``data_dir`` (made if missing); ConfigError if another process holds it."""
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = data_dir / cls.NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise ConfigError(
                f"cannot open {path} ({e.strerror}): it is not a plain file this process may "
                "write; remove it, or give the gateway another --data-dir"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError(f"{path} is not a plain file; remove it")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                who = f" (pid {holder})" if holder.isdigit() else ""
                raise ConfigError(
                    f"the data directory {data_dir} is in use by another gateway{who}: stop it "
                    "first, or give this one a --data-dir of its own (gateways that share a "
                    "--database-url each need their own)"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def release(self) -> None:
        """Let go of the directory (closing the file ends the lock); again is a no-op."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
