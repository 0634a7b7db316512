"""The container a kernel runs in: locked down, and gone when the session is."""

from __future__ import annotations

import pytest
from helpers import SCHEDULING_CLASSES, run, text_of, wait_for

pytestmark = pytest.mark.docker


def test_kernel_cannot_open_a_network_connection(api, session):
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('refused', type(e).__name__)\n"
        "print(sorted(n for _, n in socket.if_nameindex()))"
    )
    out = text_of(run(api, session["id"], code))
    assert out.startswith("refused"), f"the sandbox reached the network: {out}"
    assert "['lo']" in out, f"the sandbox has network interfaces besides loopback: {out}"


def test_container_is_hardened(api, session, engine):
    code = (
        "import os\n"
        "print(os.getuid(), os.getgid())\n"
        "status = open('/proc/self/status').read()\n"
        "print([l for l in status.splitlines() if l.startswith(('CapEff', 'NoNewPrivs'))])\n"
        "try:\n"
        "    open('/etc/evil', 'w')\n"
        "except OSError as e:\n"
        "    print('rootfs', e.strerror)\n"
        "open('/tmp/ok', 'w').write('x'); open('ok.txt', 'w').write('x'); print(os.getcwd())"
    )
    out = text_of(run(api, session["id"], code)).splitlines()
    assert out[0] == "1000 1000", "the kernel must not run as root"
    assert "CapEff:\\t0000000000000000" in out[1] and "NoNewPrivs:\\t1" in out[1], out[1]
    assert out[2] == "rootfs Read-only file system"
    assert out[3] == "/workspace"

    info = engine.api.inspect_container(f"sbx-{session['id']}")
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] and host["Init"] and host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == session["limits"]["memory"] == host["MemorySwap"]
    assert host["PidsLimit"] == session["limits"]["pids"]
    assert host["NanoCpus"] == int(session["limits"]["cpus"] * 1e9)
    assert info["Config"]["Labels"]["sbx.session"] == session["id"]
    assert "sbx.gateway" in info["Config"]["Labels"]


def test_every_thread_of_the_kernel_runs_as_batch_work(api, session, engine):
    """A kernel's threads never preempt the gateway when they wake (SCHED_BATCH).

    Under the default class each kernel thread that woke (a reply, an output)
    took the CPU from the one gateway process serving every session.
    """
    out = text_of(run(api, session["id"], SCHEDULING_CLASSES)).strip()
    assert out == "[3]", f"scheduling classes of the kernel's threads: {out} (3 is SCHED_BATCH)"
    top = engine.api.top(f"sbx-{session['id']}", ps_args="-eLo pid,cls,comm")["Processes"]
    kernel = [cls for _, cls, command in top if command != "docker-init"]
    assert kernel and set(kernel) == {"B"}, f"the engine's view of the sandbox's threads: {top}"


def test_delete_removes_the_container(api, new_session, engine):
    sid = new_session()["id"]
    assert engine.containers.get(f"sbx-{sid}").status == "running"
    assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    gone = wait_for(lambda: not engine.containers.list(all=True, filters={"name": f"sbx-{sid}"}))
    assert gone, "the session's container still exists after DELETE"
    record = api.get(f"/v1/sessions/{sid}").json()
    assert record["state"] == "deleted" and record["reason"] == "deleted by client"
    r = api.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"


def test_env_reaches_the_kernel_but_the_gateway_env_does_not(api, new_session):
    sid = new_session(env={"GREETING": "hello"})["id"]
    out = text_of(
        run(api, sid, "import os; print(os.environ.get('GREETING'), 'PATH' in os.environ)")
    )
    assert out == "hello True\n"
    leaked = text_of(run(api, sid, "import os; print(sorted(k for k in os.environ if 'SBX' in k))"))
    assert leaked == "[]\n"
