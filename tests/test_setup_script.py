"""scripts/setup says what it will change on the host before changing it, and changes
nothing there with --no-host-changes (or SBX_NO_HOST_CHANGES=1).

Only --dry-run is run here, with dockerd's daemon.json pointed at a file of the
test's own (SBX_DAEMON_JSON): the running engine, its config and the venv are
only looked at, never touched.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers import ROOT

SETUP = str(ROOT / "scripts" / "setup")
GVISOR_LINE = "write the runtimes runsc and runsc-net into {}"


def setup(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")} | env
    return subprocess.run([SETUP, *args], capture_output=True, text=True, env=environ, timeout=120)


@pytest.mark.skipif(os.geteuid() != 0, reason="host changes are announced as root only")
def test_a_dry_run_lists_the_host_changes_and_makes_none(tmp_path):
    config = tmp_path / "daemon.json"  # no runtimes registered there yet
    result = setup("--dry-run", SBX_DAEMON_JSON=str(config))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    about = next(i for i, line in enumerate(lines) if "about to change this host" in line)
    assert "(--no-host-changes or SBX_NO_HOST_CHANGES=1 to make none)" in lines[about]
    assert f"  - {GVISOR_LINE.format(config)} (the rest of it is kept)" in lines[about:]
    if subprocess.run(["pidof", "dockerd"], capture_output=True).returncode == 0:
        assert any("with SIGHUP" in line and "not a restart" in line for line in lines)
    assert lines[-1] == "setup: --dry-run: nothing was changed"
    assert not config.exists(), "a dry run wrote daemon.json"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_no_host_changes_says_what_is_missing_instead(tmp_path, how):
    config = tmp_path / "daemon.json"
    if how == "flag":
        result = setup("--no-host-changes", "--dry-run", SBX_DAEMON_JSON=str(config))
    else:
        result = setup("--dry-run", SBX_DAEMON_JSON=str(config), SBX_NO_HOST_CHANGES="1")
    assert result.returncode == 0, result.stderr
    assert "about to change this host" not in result.stderr
    assert "this host lacks what follows; nothing there is changed" in result.stderr
    assert GVISOR_LINE.format(config) in result.stderr
    assert not config.exists()


def test_a_host_that_has_everything_needs_no_change(tmp_path):
    config = tmp_path / "daemon.json"
    runtimes = {"runsc": {"path": "/usr/bin/runsc"}, "runsc-net": {"path": "/usr/bin/runsc"}}
    config.write_text(json.dumps({"runtimes": runtimes, "log-level": "warn"}))
    result = setup("--dry-run", SBX_DAEMON_JSON=str(config))
    assert result.returncode == 0, result.stderr
    assert GVISOR_LINE.format(config) not in result.stderr
    assert json.loads(config.read_text())["log-level"] == "warn"


def test_bad_options_say_what_is_accepted():
    result = setup("--yes-please")
    assert result.returncode == 2
    assert (
        "unknown option '--yes-please': --no-host-changes, --dry-run, --venv-only or --help"
        in result.stderr
    )
    result = setup("--dry-run", SBX_NO_HOST_CHANGES="maybe")
    assert result.returncode == 2 and "SBX_NO_HOST_CHANGES must be 1" in result.stderr
    assert "--no-host-changes" in setup("--help").stdout


def test_venv_only_sets_up_the_venv_and_looks_at_nothing_on_the_host():
    """What scripts/test --unit runs: no host checks, no engine, no images."""
    result = setup("--venv-only", "--dry-run", DOCKER_HOST="unix:///nonexistent.sock")
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "setup: --venv-only --dry-run: would set up the venv in .venv "
        "(pip install -e '.[test,packages]')\n"
    )
