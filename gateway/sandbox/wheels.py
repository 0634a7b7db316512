"""Python packages for a template build, fetched as wheels on the host's side.

A build has no network, so ``pip install`` in a RUN step reaches nothing.
The one supported form is the Dockerfile line ``# sbx: pip install SPEC...``
(E2B's ``pip_install`` becomes it): each SPEC is a requirement read strictly
(a name, extras, a version range: no option, URL or path), and the gateway
downloads the wheels with the host's own pip configuration (or through the
gateway's package cache when it runs), binary only and for the image's
Python and platform, so no package's code runs on the host. The download is
bounded in bytes and time; the build then installs from those files with
``--no-index`` and removes them. Blocking: run on a build's thread.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from ..errors import BadRequest

DIRECTIVE = "# sbx: pip install"  # the Dockerfile line a build installs packages with
DIR = ".sbx-wheels"  # where a build's wheels sit in its context
MAX_SPECS = 32
MAX_SPEC = 200  # characters of one requirement
HINT = (
    "a build has no network: install Python packages with a '# sbx: pip install NAME...' "
    "line (E2B: Template().pip_install([...])), which the gateway fetches as wheels"
)
# Run in the kernel image: what pip download must match (Python, ABI, machine, glibc).
PROBE = (
    "import platform, sys; v = sys.version_info; "
    "print(f'{v[0]}.{v[1]}', f'cp{v[0]}{v[1]}', "
    "platform.machine(), platform.libc_ver()[1] or '2.17')"
)
_NOT_FOUND = re.compile(r"No matching distribution found for (.+)")


class PipRefused(BadRequest):
    """A ``pip install`` line a template build will not run, saying what it takes."""

    code = "pip_install_refused"


@dataclasses.dataclass(frozen=True)
class PipStep:
    """One ``# sbx: pip install`` line: its requirements."""

    specs: tuple[str, ...]

    @property
    def line(self) -> str:
        return " ".join([DIRECTIVE, *self.specs])


def parse_pip(args: str) -> PipStep:
    """The words after ``pip install``: ``SPEC...``, each a plain requirement."""
    specs = args.split()
    if "--user" in specs:
        raise PipRefused(
            "pip install --user is not supported in a template build: the user's site is in "
            "the workspace, which each session mounts its own over; install for the image "
            "(E2B: pip_install(names) with g=True)"
        )
    if not specs:
        raise PipRefused("pip install needs at least one package name, like 'six' or 'attrs>=23'")
    if len(specs) > MAX_SPECS:
        raise PipRefused(f"pip install takes at most {MAX_SPECS} packages in one step")
    return PipStep(tuple(_spec(s) for s in specs))


def _spec(word: str) -> str:
    shown = word[:80] + ("..." if len(word) > 80 else "")
    if word.startswith("-"):
        raise PipRefused(
            f"pip option {shown!r} is not supported in a template build: name packages only "
            "(the host's package settings choose the index)"
        )
    try:
        req = Requirement(word)
    except InvalidRequirement:
        req = None
    if req is None or len(word) > MAX_SPEC or req.url or req.marker:
        raise PipRefused(
            f"{shown!r} is not a package requirement a template build installs: write a name "
            "with optional extras and versions, like 'six' or 'requests[socks]>=2.31' "
            "(no URL, path, file or VCS reference)"
        )
    return str(req)


@dataclasses.dataclass(frozen=True)
class Target:
    """What a wheel must run on: the image's Python, ABI, machine and glibc."""

    python: str  # "3.11"
    abi: str  # "cp311"
    machine: str  # "x86_64"
    glibc: str  # "2.36"

    @classmethod
    def parse(cls, probe_output: str) -> Target:
        python, abi, machine, glibc = probe_output.split()
        return cls(python, abi, machine, glibc)

    def pip_args(self) -> list[str]:
        major, _, minor = self.glibc.partition(".")
        top = int(minor) if major == "2" and minor.isdigit() else 17
        platforms = [f"manylinux_2_{y}_{self.machine}" for y in range(top, 16, -1)]
        platforms += [f"manylinux{t}_{self.machine}" for t in ("2014", "2010", "1")]
        args = ["--python-version", self.python, "--implementation", "cp"]
        for abi in (self.abi, "abi3", "none"):
            args += ["--abi", abi]
        for platform in platforms:
            args += ["--platform", platform]
        return args

    def __str__(self) -> str:
        return f"Python {self.python} on linux {self.machine}"


@dataclasses.dataclass(frozen=True)
class WheelLimits:
    bytes: int = 256 << 20  # every wheel of one build, together (its context is held in memory)
    timeout: float = 300.0  # of one build's downloads, together, within the build's own


class Wheels:
    """Downloads a step's wheels with the host's pip (``index``: the package cache's, if any)."""

    def __init__(self, limits: WheelLimits = WheelLimits(), index: str | None = None) -> None:
        self.limits = limits
        self.index = index
        self.stopping = False  # the gateway is stopping: downloads under way end

    def cancel(self) -> None:
        """End every download under way (its pip is killed at its next look)."""
        self.stopping = True

    def fetch(
        self,
        step: PipStep,
        target: Target,
        dest: Path,
        most_bytes: int | None = None,
        seconds: float | None = None,
    ) -> list[Path]:
        """The wheels ``step`` installs, with their dependencies, saved under ``dest``.

        ``most_bytes`` and ``seconds``: what is left of the build's bounds (the
        limits' by default). Raises ``PipRefused`` (a package with no wheel,
        past a bound, pip failing).
        """
        most_bytes = self.limits.bytes if most_bytes is None else most_bytes
        seconds = self.limits.timeout if seconds is None else seconds
        with tempfile.TemporaryDirectory(prefix="sbx-wheels-") as work:
            tmp = Path(work) / "tmp"
            tmp.mkdir()
            argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
                    "--dest", str(dest), "--no-cache-dir", "--progress-bar", "off",
                    "--no-input", "--disable-pip-version-check", *target.pip_args(),
                    *(["--index-url", self.index] if self.index else []),
                    "--", *step.specs]  # fmt: skip
            out = Path(work) / "pip.log"
            with out.open("wb") as log:
                env = {**os.environ, "TMPDIR": str(tmp)}
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
                verdict = self._watch(proc, (dest, tmp), most_bytes, seconds)
            said = out.read_text(errors="replace")[-4000:]
        if verdict:
            raise PipRefused(verdict)
        if proc.returncode != 0:
            missing = _NOT_FOUND.search(said)
            if missing:
                raise PipRefused(
                    f"{missing.group(1).strip()[:200]} has no wheel for {target} on this host's "
                    "package index (or no such package): a template build installs binary "
                    "packages only; build the wheel yourself and COPY it into the image"
                )
            last = [line for line in said.splitlines() if line.strip()][-1:] or ["no output"]
            raise PipRefused(f"fetching the wheels failed: {last[0][:500]}")
        return sorted(dest.glob("*.whl"))

    def _watch(
        self, proc: subprocess.Popen, dirs: tuple[Path, ...], most_bytes: int, seconds: float
    ) -> str | None:
        """Wait for pip; kill it past the time or byte bound and say which.

        The bytes are counted once more after pip ends: a wheel copied from a
        local index can land whole between two looks.
        """
        deadline = time.monotonic() + seconds
        while True:
            ended = proc.poll() is not None
            verdict = None
            if self.stopping and not ended:
                verdict = "the gateway stopped during the build"
            elif time.monotonic() > deadline and not ended:
                verdict = (
                    f"fetching the wheels took longer than the {self.limits.timeout:g} s "
                    "a build's downloads (and the build itself) may take"
                )
            elif sum(_size(d) for d in dirs) > most_bytes:
                verdict = (
                    f"the wheels are larger than the {self.limits.bytes >> 20} MiB a build's "
                    "packages may take together"
                )
            if verdict:
                proc.kill()
                proc.wait()
                return verdict
            if ended:
                return None
            time.sleep(0.1)


def install_lines(step: PipStep, index: int) -> list[str]:
    """The lines installing ``step`` from its wheels (``DIR/index``), then dropping them."""
    where = f"/tmp/{DIR}-{index}"
    pip = ["pip", "install", "--no-index", "--find-links", where, "--", *step.specs]
    script = f"{shlex.join(pip)}; s=$?; rm -rf {where} 2>/dev/null; exit $s"
    return [
        f"COPY {json.dumps([f'{DIR}/{index}/', where + '/'])}",
        f"RUN {json.dumps(['/bin/sh', '-c', script])}",
    ]


def _size(root: Path) -> int:
    total = 0
    for top, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total
