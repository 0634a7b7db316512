"""What the benchmarks share: a gateway to measure, timing, statistics, the results page."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


class Gateway:
    """``sbx serve`` on a free port, without authentication (a benchmark on loopback
    measures the gateway, not tokens), ending its sessions when stopped (unless
    ``end_sessions`` is false: their kernels then run on, as after a restart)."""

    def __init__(
        self, data_dir: str, *flags: str, end_sessions: bool = True, tree: Path | None = None
    ) -> None:
        """``tree``: the checkout whose ``gateway`` package runs (by default the installed one)."""
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", "0"]
        cmd += ["--data-dir", data_dir, "--auth", "none"]
        cmd += ["--end-sessions-on-stop", str(end_sessions).lower(), *flags]
        self.log = Path(data_dir) / "gateway.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stderr=log, cwd=tree)
        self.url = wait_for_line(self.log, "listening on http://", 120).split("listening on ")[1]
        self.url = self.url.split()[0]
        self.client = httpx.Client(base_url=self.url, timeout=600)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(120)

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worktree(rev: str) -> Path:
    """A checkout of ``rev`` beside this one (``git worktree``), to run an earlier gateway."""
    path = Path(tempfile.mkdtemp(prefix="sbx-rev-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
                   check=True, capture_output=True)  # fmt: skip
    return path


def drop_worktree(path: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                   check=False)  # fmt: skip


def wait_for_line(path: Path, needle: str, timeout: float) -> str:
    """The first line of a growing log file that contains ``needle``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if needle in line:
                return line
        time.sleep(0.1)
    raise SystemExit(f"{needle!r} never appeared in {path}:\n{path.read_text()[-2000:]}")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], object], n: int, warmup: int = 10) -> list[float]:
    """Milliseconds of ``n`` calls of ``fn``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def session_starts(client: httpx.Client, n: int, body: dict) -> tuple[list[float], list[float]]:
    """For ``n`` fresh sessions: ms until 201, and until the first execute's result."""
    creates, starts = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post("/v1/sessions", json=body)
        r.raise_for_status()
        creates.append((time.perf_counter() - t0) * 1000)
        sid = r.json()["id"]
        client.post(f"/v1/sessions/{sid}/execute", json={"code": "1 + 1"}).raise_for_status()
        starts.append((time.perf_counter() - t0) * 1000)
        client.delete(f"/v1/sessions/{sid}")
    return creates, starts


def round_trips(client: httpx.Client, sid: str, n: int) -> list[float]:
    """Ms of ``n`` trivial executes on ``sid``, after a warm-up."""
    return timed(
        lambda: client.post(
            f"/v1/sessions/{sid}/execute", json={"code": "1 + 1"}
        ).raise_for_status(),
        n,
    )


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def median(values: list[float]) -> float:
    return pct(values, 0.5)


def machine(note: str = "") -> str:
    """The machine a result was measured on, and how busy it was (it may be shared)."""
    load = os.getloadavg()[0]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{platform.node()}: {os.cpu_count()} cores, {memory:.0f} GiB "
        f"(load average {load:.1f} at the end{note}), {platform.platform()}, "
        f"Python {platform.python_version()}"
    )


def write_section(bench: str, title: str, about: str, body: list[str]) -> None:
    """Put a benchmark's results in docs/PERFORMANCE.md between markers of its own.

    They replace that benchmark's previous section, or are appended: each
    benchmark keeps its own part of the shared page.
    """
    begin, end = f"<!-- {bench}: begin -->", f"<!-- {bench}: end -->"
    measured = f"Measured by `bench/{bench}.py` on {datetime.now(UTC):%Y-%m-%d}, on {machine()}"
    section = f"{begin}\n## {title}\n\n{measured}; {about}\n\n" + "\n".join(body) + f"\n{end}\n"
    doc = ROOT / "docs" / "PERFORMANCE.md"
    text = doc.read_text() if doc.exists() else "# Performance\n"
    found = re.search(re.escape(begin) + ".*?" + re.escape(end) + "\n?", text, re.DOTALL)
    doc.write_text(
        text.replace(found.group(0), section) if found else f"{text.rstrip()}\n\n{section}"
    )
    print(f"\nwritten to {doc.relative_to(ROOT)}")
