"""``sbx serve --workers N``: N gateway processes on one port, so every core serves.

Each worker is a whole gateway (``sbx serve`` with ``--reuse-port``) with its
own data directory, ``<data_dir>/worker-<n>``: its own id, sessions and
containers, locked by it (``store/datadir.py``); this process locks
``<data_dir>`` itself, so a second ``sbx serve`` there refuses at once rather
than starting workers that refuse again and again. The kernel spreads new
connections over the workers (SO_REUSEPORT); a request for a session another
worker owns is passed on to it through the shared database
(``api/forward.py``). This process only starts the workers, passes
SIGINT/SIGTERM on, and starts again a worker that died: on the same data
directory, it reattaches to its sessions' kernels.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..config import Settings
from ..store.datadir import DataDirLock

log = logging.getLogger(__name__)

RESTART_DELAY = 0.5  # seconds before a worker that died is started again


def supervise(settings: Settings, argv: list[str]) -> int:
    """Run ``settings.workers`` gateways until SIGINT/SIGTERM; their exit status."""
    lock = DataDirLock.take(Path(settings.data_dir))  # held until this process ends
    port = settings.port
    holder = None
    if port == 0:  # pick one for all of them; held (not listening) until they have it
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((settings.host, 0))
        port = holder.getsockname()[1]

    def start(n: int) -> subprocess.Popen:
        data_dir = Path(settings.data_dir) / f"worker-{n}"
        flags = ["--workers", "1", "--reuse-port", "true", "--port", str(port)]
        cmd = [sys.executable, "-m", "gateway.cli", *argv, *flags, "--data-dir", str(data_dir)]
        return subprocess.Popen(cmd)

    workers = [start(n) for n in range(settings.workers)]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    log.info("serving with %d workers on port %d", settings.workers, port)
    while not stopping:
        time.sleep(0.2)
        for n, worker in enumerate(workers):
            if worker.poll() is not None and not stopping:
                log.warning("worker %d exited with %s; starting it again", n, worker.returncode)
                time.sleep(RESTART_DELAY)
                workers[n] = start(n)
    codes = [worker.wait() for worker in workers]
    if holder is not None:
        holder.close()
    lock.release()
    return max(codes, key=abs)
