"""The gateway's root calls in a directory a sandbox can write, raced by a process swapping links.

No engine: a process like the one a sandbox would run (``helpers.SWAPPER``)
watches a run directory and swaps every fresh entry for a symbolic link to a
host file the test owns, while the gateway's code makes its entries there.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from helpers import SWAPPER, file_facts, host_file, wait_for

from gateway.egress.packages import PackageGate
from gateway.sandbox.base import write_secret_files

ROUNDS = 30


def swaps(count: Path) -> int:
    return int(count.read_text()) if count.exists() else 0


def test_the_package_gate_serving_a_socket_again_never_changes_a_host_file(tmp_path):
    victim = host_file(tmp_path)
    run_dir = tmp_path / "session" / "run"
    run_dir.mkdir(parents=True)
    count = tmp_path / "swaps"
    before = file_facts(victim)
    code = SWAPPER.format(run=str(run_dir), victim=str(victim), count=str(count))
    swapper = subprocess.Popen([sys.executable, "-c", code])
    gate = PackageGate(types.SimpleNamespace(socket_name="pkg.sock"), lambda _: None)

    async def serve_again_and_again() -> None:
        for done in range(1, ROUNDS + 1):
            await gate.open("s1", run_dir)
            await asyncio.to_thread(wait_for, lambda d=done: swaps(count) >= d, 5, 0.005)
        gate.stop()

    try:
        time.sleep(0.5)  # it watches
        asyncio.run(serve_again_and_again())
    finally:
        swapper.kill()
        swapper.wait()
    assert swaps(count) == ROUNDS, "the swapper missed the gateway's sockets: no race was run"
    assert file_facts(victim) == before, (
        f"the gateway changed a host file through a swapped link: mode {oct(before[0])} is now "
        f"{oct(file_facts(victim)[0])}"
    )
    assert not [p.name for p in run_dir.parent.iterdir() if p.name != "run"], "a socket was left"


def test_secret_files_are_never_written_through_a_link_in_the_directorys_place(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "s1").symlink_to(elsewhere)
    with pytest.raises(OSError):
        write_secret_files(secrets / "s1", {"TOKEN": "hunter2"}, os.getuid(), os.getgid())
    assert not list(elsewhere.iterdir()), "a secret was written through the link"


def test_a_link_left_in_the_secrets_directory_is_replaced_never_followed(tmp_path):
    victim = host_file(tmp_path)
    directory = tmp_path / "secrets" / "s1"
    before = file_facts(victim)
    write_secret_files(directory, {"TOKEN": "first"}, os.getuid(), os.getgid())
    os.chmod(directory, 0o700)
    (directory / "TOKEN").unlink()
    (directory / "TOKEN").symlink_to(victim)
    write_secret_files(directory, {"TOKEN": "second"}, os.getuid(), os.getgid())
    assert file_facts(victim) == before
    assert (directory / "TOKEN").read_text() == "second" and not (directory / "TOKEN").is_symlink()
