"""A sandbox racing the gateway's root calls in its run directory never reaches a host file.

The run directory is the sandbox's (its kernel binds its sockets there), and
the gateway, as root, serves the package socket in it again at every start of
a session's kernel and of the gateway itself. A process in each sandbox waits
for any fresh entry there and swaps it at once for a symbolic link to a host
file the test owns; the gateway is restarted several times over the running
sandboxes, so the race is run again each time. The host file must keep its
mode, owner and content, while a canary session keeps answering.
"""

from __future__ import annotations

import time

import pytest
from helpers import SWAPPER, Canary, file_facts, host_file, run, text_of, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

ATTACKERS = 4
RESTARTS = 2  # each brings the package cache back up (seconds): two show the race across restarts

START = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True,\n"
    "                 stdout=subprocess.DEVNULL, stderr=open('/workspace/.swapper.log', 'w'))\n"
)
SWAPS = (
    "import os\n"
    "print(open('/workspace/.swaps').read() if os.path.exists('/workspace/.swaps') else 0)"
)


def test_a_sandbox_swapping_fresh_run_dir_entries_for_links_never_reaches_a_host_file(
    start_gateway, tmp_path
):
    victim = host_file(tmp_path)
    before = file_facts(victim)
    gw = start_gateway("--package-cache", "true", keep_sessions=True)
    sids = [gw.client.post("/v1/sessions", json={}).json()["id"] for _ in range(ATTACKERS + 1)]
    canary, attackers = sids[0], sids[1:]
    run(gw.client, canary, "alive = 42")
    for sid in attackers:
        code = SWAPPER.format(run="/run/sbx", victim=str(victim), count="/workspace/.swaps")
        assert run(gw.client, sid, START.format(code=code))["status"] == "ok"
    time.sleep(1)  # the swappers watch before the first restart

    def swaps(client) -> int:
        return sum(int(text_of(run(client, sid, SWAPS)).strip()) for sid in attackers)

    for round_ in range(1, RESTARTS + 1):
        data_dir = gw.data_dir
        gw.stop()
        gw = start_gateway("--package-cache", "true", keep_sessions=True, data_dir=data_dir)
        with Canary(gw, canary) as watch:
            # Each session's socket was made again as the gateway took it back.
            swapped = wait_for(lambda c=gw.client, r=round_: swaps(c) >= r * ATTACKERS, 30)
        print(f"round {round_}: {swaps(gw.client)} swaps; {watch}")
        assert swapped, "the sandboxes never swapped the gateway's fresh entries: no race was run"
        assert file_facts(victim) == before, (
            f"after {swaps(gw.client)} swaps the gateway, as root, changed a host file through "
            f"a link the sandbox planted: mode {oct(before[0])} is now {oct(file_facts(victim)[0])}"
        )
    for sid in sids:
        gw.client.delete(f"/v1/sessions/{sid}")
