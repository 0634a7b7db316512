"""A Docker engine of the tests' own, to stop, crash and restart at will.

The machine's main engine serves every other test (and other people's runs):
it is never stopped or reconfigured. ``OwnEngine`` is a second dockerd with
its own socket, data root, exec root, pid file and cgroup parent, no bridge
and no iptables rules, holding only the kernel image the tests need. Gateways
under test reach it through ``DOCKER_HOST``. Everything it made is removed at
the end: containers, shims, mounts, cgroups, directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from gateway.config import Settings
from gateway.sandbox.images import ImageBuilder


def pytest_collection_modifyitems(config, items):
    """Run fault tests last: they start engines and gateways the others need not wait for."""
    items.sort(key=lambda item: item.get_closest_marker("faults") is not None)


class OwnEngine:
    """A dockerd for fault tests: ``stop``, ``crash`` and ``start`` it freely."""

    def __init__(self) -> None:
        self.name = f"sbxf-{os.getpid()}"
        self.data_root = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir="/var/tmp"))
        self.run_dir = Path("/run") / self.name  # short: socket paths are capped
        self.run_dir.mkdir(mode=0o700)
        self.socket = self.run_dir / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log_path = self.data_root / "dockerd.log"
        self.proc: subprocess.Popen | None = None
        config = self.run_dir / "daemon.json"
        # Its own config: the host's /etc/docker/daemon.json belongs to the main engine.
        config.write_text(json.dumps({"log-level": "warn", "cgroup-parent": self.name}))
        self.cmd = [
            "dockerd", "--config-file", str(config), "--host", self.host,
            "--data-root", str(self.data_root / "root"), "--exec-root", str(self.run_dir / "x"),
            "--pidfile", str(self.run_dir / "docker.pid"),
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
        ]  # fmt: skip

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=30)

    @property
    def running(self) -> bool:
        # The CLI, not the SDK: docker-py leaks a socket per refused connection.
        return (
            subprocess.run(["docker", "-H", self.host, "info"], capture_output=True).returncode == 0
        )

    def docker(self, *args: str) -> str:
        """Run the docker CLI against this engine; its output."""
        done = subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True)
        return done.stdout

    def start(self) -> None:
        """Start dockerd and wait until it answers."""
        assert self.proc is None or self.proc.poll() is not None, "the engine already runs"
        # A crash leaves pid files; the dead containerd's pid may be an unreaped zombie
        # (pid 1 here need not reap), which the engine would take for a live one.
        (self.run_dir / "docker.pid").unlink(missing_ok=True)
        (self.run_dir / "x" / "containerd" / "containerd.pid").unlink(missing_ok=True)
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # The CLI, not the SDK: docker-py leaks a socket per refused connection.
            if self.running:
                return
            time.sleep(0.2)
        pytest.fail(f"the test engine did not start:\n{self.log_path.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop dockerd (SIGKILL: crash it, leaving its containers' shims running)."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(60)

    def load(self, image: str) -> None:
        """Copy one image from the main engine into this one."""
        with subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE) as save:
            subprocess.run(
                ["docker", "-H", self.host, "load", "-q"], stdin=save.stdout, check=True,
                capture_output=True, timeout=300,
            )  # fmt: skip
        assert save.returncode == 0, f"docker save {image} failed"

    def remove(self) -> None:
        """Remove all of it: containers, the engine, its shims, mounts, cgroups, directories."""
        if self.proc is not None and self.proc.poll() is None:
            ids = self.docker("ps", "-aq").split()
            if ids:
                self.docker("rm", "-f", *ids)
            self.stop()
        # Shims of a crashed engine name its exec root in their arguments.
        shims = subprocess.run(
            ["pgrep", "-f", f"{self.run_dir}/"], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        for cgroup in Path("/sys/fs/cgroup").glob(f"*/{self.name}"):
            for proc_file in cgroup.rglob("cgroup.procs"):
                for pid in proc_file.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        unmount_under(self.run_dir, self.data_root)
        for cgroup in Path("/sys/fs/cgroup").glob(f"*/{self.name}"):
            for directory in sorted(cgroup.rglob("*"), key=lambda p: -len(p.parts)):
                if directory.is_dir():
                    with contextlib.suppress(OSError):
                        directory.rmdir()
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.data_root, ignore_errors=True)


def unmount_under(*prefixes: Path) -> None:
    """Lazily unmount every mount below ``prefixes``, deepest first."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted(mounts, key=len, reverse=True):
        if any(mount.startswith(f"{prefix}/") or mount == str(prefix) for prefix in prefixes):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


@pytest.fixture(scope="session")
def python_image() -> str:
    """The python kernel's image tag, built on the main engine."""
    settings = Settings()
    with contextlib.closing(docker.from_env()) as main:
        tag = ImageBuilder(main, Path(settings.images_dir), base=settings.base_image).tag_for(
            "python"
        )
        if not main.images.list(name=tag):
            pytest.fail(f"{tag} is not built on the main engine; run `sbx images build python`")
    return tag


@pytest.fixture(scope="session")
def own_engine(python_image: str) -> Iterator[OwnEngine]:
    if os.geteuid() != 0:
        pytest.fail("the fault tests need root: they start a Docker engine of their own")
    engine = OwnEngine()
    try:
        engine.start()
        engine.load(python_image)
        yield engine
    finally:
        engine.remove()
