"""Resource limits hold against hostile cells, and the gateway stays healthy."""

from __future__ import annotations

import time

import docker.errors
import pytest
from helpers import run, text_of, wait_for

from gateway.errors import EngineUnavailable
from gateway.limits import Limits
from gateway.sandbox.docker.provisioner import engine_post, update_limits

pytestmark = pytest.mark.docker


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_memory_bomb_kills_only_its_own_session(api, new_session):
    bystander = new_session()["id"]
    run(api, bystander, "kept = 'still here'")
    sid = new_session(limits={"memory": "256m"})["id"]
    reply = run(api, sid, "hog = []\nwhile True: hog.append(bytearray(16 * 2**20))")
    assert reply["status"] == "dead", reply
    assert "out of memory: limit 256 MiB" in reply["error"]["evalue"]
    state = api.get(f"/v1/sessions/{sid}").json()
    assert state["state"] == "dead" and state["reason"] == "out of memory: limit 256 MiB"
    assert text_of(run(api, bystander, "print(kept)")) == "still here\n"
    assert api.post(f"/v1/sessions/{sid}/restart").json()["state"] == "idle"


def test_fork_bomb_hits_the_pids_limit_and_the_host_stays_responsive(api, new_session, engine):
    bystander = new_session()["id"]
    sid = new_session(limits={"pids": 64})["id"]
    code = (
        "import subprocess\n"
        "try:\n"
        "    subprocess.run('f() { f | f & }; f', shell=True, timeout=4)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)"
    )
    reply = run(api, sid, code, timeout=20)
    pids = engine.containers.get(f"sbx-{sid}").stats(stream=False)["pids_stats"]["current"]
    assert pids <= 64, f"the sandbox holds {pids} processes, above its limit of 64"
    started = time.monotonic()
    assert api.get("/healthz").status_code == 200
    assert run(api, bystander, "print(6 * 7)")["outputs"][0]["text"] == "42\n"
    assert time.monotonic() - started < 5, "the gateway became slow during a fork bomb"
    assert reply["status"] in ("ok", "error", "timeout"), reply


def test_huge_output_is_truncated_and_gateway_memory_stays_bounded(gateway, new_session):
    api = gateway.client
    sid = new_session(limits={"output_bytes": "1m", "memory": "1g"})["id"]
    run(api, sid, "print('warm up')")
    before = rss_bytes(gateway.pid)
    code = "for _ in range(2_000_000):\n    print('x' * 99)"  # 200 MB, line by line
    reply = run(api, sid, code, timeout=120)
    grown = rss_bytes(gateway.pid) - before
    assert reply["status"] == "ok", reply["error"]
    assert reply["truncated"] is True
    kept = sum(len(o.get("text", "")) for o in reply["outputs"])
    assert kept < 1_100_000, f"{kept} characters came back despite a 1 MB cap"
    marker = reply["outputs"][-1]
    assert marker["name"] == "stderr" and "output truncated" in marker["text"]
    assert grown < 50 * 2**20, f"gateway RSS grew by {grown / 2**20:.0f} MiB for 200 MB of output"


def test_filling_the_workspace_fails_with_enospc(api, new_session):
    sid = new_session(limits={"disk": "64m"})["id"]
    code = (
        "import errno\n"
        "try:\n"
        "    with open('big', 'wb') as f:\n"
        "        for _ in range(200): f.write(b'x' * 2**20)\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])"
    )
    reply = run(api, sid, code)
    assert text_of(reply) == "ENOSPC\n", reply
    assert api.get(f"/v1/sessions/{sid}").json()["state"] == "idle"


def test_cpu_limit_is_applied(api, new_session, engine):
    sid = new_session(limits={"cpus": 0.5})["id"]
    host = engine.api.inspect_container(f"sbx-{sid}")["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert wait_for(lambda: api.get(f"/v1/sessions/{sid}").json()["state"] == "idle")


def test_limits_the_engine_refuses_say_what_the_engine_said(engine):
    limits = Limits(
        memory=256 * 2**20, cpus=1.0, pids=64, disk=64 * 2**20, timeout=30, output_bytes=2**20
    )
    with pytest.raises(
        EngineUnavailable, match=r"the engine refused new limits: .*No such container"
    ):
        update_limits(engine, "sbx-no-such-container", limits)
    with pytest.raises(docker.errors.APIError) as refused:
        engine_post(engine.api, "/containers/sbx-no-such-container/update", {"PidsLimit": 64})
    assert "No such container" in str(refused.value), "a refusal lost the engine's words"
