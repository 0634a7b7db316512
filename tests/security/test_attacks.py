"""Attacks as session code against the real engine: each must fail, and nothing else notice.

Each test runs under runc and gVisor (see conftest). Expectations that differ
by runtime say why; docs/SECURITY.md has the table of results.
"""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest
from helpers import text_of, wait_for

from . import syscalls
from .conftest import HOST_SECRET

pytestmark = pytest.mark.docker

ERRNO = "import errno\ndef err(e): return errno.errorcode.get(e.errno, str(e.errno))\n"


def host_processes_mentioning(*needles: str) -> list[str]:
    """Command lines of host processes that contain any of ``needles``."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if any(n in cmdline for n in needles):
                found.append(f"{pid}: {cmdline}")
    return found


def container_gone(engine, sid: str) -> bool:
    return not engine.containers.list(all=True, filters={"name": f"sbx-{sid}"})


def test_fork_bomb(attack, engine):
    limit = 128 if attack.gvisor else 64  # gVisor's own threads need room (runtimes.py)
    sid = attack.session(limits={"pids": limit})
    code = ERRNO + (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 5000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    print('forked', n)\n"
        "except OSError as e:\n"
        "    print('stopped', n, err(e))"
    )
    reply = attack.run(sid, code, timeout=30)
    if attack.gvisor:
        # gVisor's host threads hit the pids limit first, and the sandbox stops: the
        # bomb takes down its own session only.
        assert reply["status"] == "dead", reply
        return
    words = text_of(reply).split()
    assert words[0] == "stopped" and words[2] == "EAGAIN", reply
    assert int(words[1]) < limit, f"{words[1]} processes forked despite a limit of {limit}"
    pids = engine.containers.get(f"sbx-{sid}").stats(stream=False)["pids_stats"]["current"]
    assert pids <= limit, f"the sandbox holds {pids} processes, above its limit"


def test_memory_bomb(attack):
    sid = attack.session(limits={"memory": "256m"})
    reply = attack.run(sid, "hog = []\nwhile True: hog.append(bytearray(16 * 2**20))")
    assert reply["status"] == "dead", f"a memory bomb outlived its limit: {reply}"
    # The engine's OOM flag can trail the container's death on a loaded host; then the
    # reason names the SIGKILL the OOM killer sent.
    reason = reply["error"]["evalue"]
    assert "out of memory: limit 256 MiB" in reason or "killed by signal 9" in reason, reason
    assert attack.api.post(f"/v1/sessions/{sid}/restart").json()["state"] == "idle"
    assert attack.out(sid, "print('back')") == "back\n"


def test_disk_fill(attack):
    sid = attack.session(limits={"disk": "64m", "memory": "512m"})
    fill = ERRNO + (
        "def fill(path):\n"
        "    try:\n"
        "        with open(path, 'wb') as f:\n"
        "            for _ in range(1024):\n"
        "                f.write(b'x' * 2**20)\n"
        "                f.flush()\n"
        "        return 'filled'\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        "print(fill('big'), fill('/tmp/big'))"
    )
    assert attack.out(sid, fill, timeout=60) == "ENOSPC ENOSPC\n"
    state = attack.api.get(f"/v1/sessions/{sid}").json()["state"]
    assert state == "idle", f"a full disk broke the session: {state}"


def test_output_flood(attack):
    sid = attack.session(limits={"output_bytes": "1m"})
    code = "import sys\nfor _ in range(64):\n    sys.stdout.write('x' * 2**20)"
    reply = attack.run(sid, code, timeout=120)
    assert reply["status"] == "ok" and reply["truncated"] is True, reply["status"]
    kept = sum(len(o.get("text", "")) for o in reply["outputs"])
    assert kept < 1_100_000, f"{kept} characters came back despite a 1 MiB cap"


def test_cpu_spin_past_the_timeout(attack):
    sid = attack.session()
    attack.run(sid, "kept = 'state'")
    reply = attack.run(sid, "while True: pass", timeout=2)
    assert reply["status"] == "timeout" and not reply["error"]["kernel_restarted"], reply
    assert attack.out(sid, "print(kept)") == "state\n"
    stubborn = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
    reply = attack.run(sid, stubborn, timeout=2)
    assert reply["status"] == "timeout" and reply["error"]["kernel_restarted"], reply
    assert attack.out(sid, "print('usable')") == "usable\n"


def test_background_processes_do_not_survive_the_session(attack, engine):
    sid = attack.session()
    marker = "3599.25"  # a sleep length nothing else on the host uses
    code = (
        "import os, subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execvp('sleep', ['sleep', '{marker}'])\n"
        "    os._exit(0)\n"
        "print('detached')"
    )
    assert attack.out(sid, code) == "detached\n"
    container_id = engine.containers.get(f"sbx-{sid}").id
    if not attack.gvisor:  # under gVisor the sandbox's processes are not host processes
        assert wait_for(lambda: host_processes_mentioning(marker)), (
            "the background sleeps never ran"
        )
    assert attack.out(sid, "print('after the cell')") == "after the cell\n"
    attack.delete_all()
    assert wait_for(lambda: container_gone(engine, sid)), "the container outlived its session"
    left = wait_for(lambda: not host_processes_mentioning(marker, container_id), timeout=10)
    assert left, (
        f"processes outlived the session: {host_processes_mentioning(marker, container_id)}"
    )


def test_no_way_out_with_network_none(attack):
    sid = attack.session()
    code = ERRNO + (
        "import socket\n"
        "def tcp():\n"
        "    try:\n"
        "        socket.create_connection(('192.0.2.1', 80), timeout=3)\n"
        "        return 'connected'\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        "def udp():\n"
        "    try:\n"
        "        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('192.0.2.1', 53))\n"
        "        return 'sent'\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        "def dns():\n"
        "    try:\n"
        "        return str(socket.getaddrinfo('example.com', 80))\n"
        "    except OSError:\n"
        "        return 'no-dns'\n"
        "print(tcp(), udp(), dns(), sorted(n for _, n in socket.if_nameindex()))"
    )
    tcp, udp, dns, interfaces = attack.out(sid, code).split(" ", 3)
    # runc: no route at all; gVisor's network stack says the host is unreachable.
    assert tcp in ("ENETUNREACH", "EHOSTUNREACH") and udp == tcp, f"{tcp} {udp}"
    assert dns == "no-dns" and interfaces == "['lo']\n", (dns, interfaces)


def test_host_files_and_the_docker_socket_are_out_of_reach(attack, hostile_gateway):
    secret = Path(hostile_gateway.data_dir) / "host-secret.txt"
    secret.write_text(HOST_SECRET)
    sid = attack.session()
    code = ERRNO + (
        "import os, socket\n"
        "def read(path):\n"
        "    try:\n"
        "        return open(path).read()[:40]\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        "def dial(path):\n"
        "    try:\n"
        "        socket.socket(socket.AF_UNIX).connect(path)\n"
        "        return 'connected'\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        f"print(read({str(secret)!r}))\n"
        f"print(read('/proc/1/root' + {str(secret)!r}))\n"
        "print(read('/etc/shadow'))\n"
        "print(dial('/var/run/docker.sock'), dial('/run/docker.sock'),\n"
        "      dial('/run/containerd/containerd.sock'))\n"
        "print(os.path.exists('/var/lib/docker'))"
    )
    out = attack.out(sid, code).splitlines()
    assert out[0] == "ENOENT", f"a host file was readable from the sandbox: {out}"
    assert out[1] in ("ENOENT", "EACCES"), f"a host file was readable via /proc/1/root: {out}"
    assert out[2] == "EACCES", out
    assert out[3] == "ENOENT ENOENT ENOENT", f"an engine socket is reachable: {out}"
    assert out[4] == "False"


def test_other_sessions_workspaces_are_invisible(attack, hostile_gateway):
    victim = attack.session()
    attack.out(victim, "open('secret.txt', 'w').write('victim data'); print('ok')")
    sid = attack.session()
    sessions = Path(hostile_gateway.data_dir) / "sessions"
    # The session's own run directory is mounted at /run/sbx: no host path shows.
    code = (
        "import os, glob\n"
        f"print(os.path.exists({str(sessions)!r}), os.listdir('/run/sbx') != [])\n"
        f"print(os.path.exists({str(sessions / victim / 'workspace' / 'secret.txt')!r}))\n"
        "print(glob.glob('/proc/*/root/workspace/secret.txt')\n"
        "      + glob.glob('/proc/*/cwd/secret.txt'))"
    )
    out = attack.out(sid, code).splitlines()
    assert out[0] == "False True", f"the sandbox sees the gateway's session directories: {out}"
    assert out[1] == "False" and out[2] == "[]", out


def test_proc_environ_holds_no_gateway_secrets(attack):
    sid = attack.session(env={"MINE": "visible"})
    code = (
        "import glob\n"
        "found, readable = [], 0\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        data = open(path, 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    readable += 1\n"
        f"    if {HOST_SECRET.encode()!r} in data or b'SBX_' in data:\n"
        "        found.append(path)\n"
        "print(readable > 0, found, b'MINE=visible' in open('/proc/self/environ', 'rb').read())"
    )
    assert attack.out(sid, code) == "True [] True\n"


def test_kill_everything(attack, engine):
    bystander = attack.session()
    attack.run(bystander, "kept = 'still here'")
    sid = attack.session()
    code = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import os; os.kill(-1, 9)'])"
    )
    reply = attack.run(sid, code)
    assert reply["status"] in ("dead", "ok"), reply
    assert attack.out(bystander, "print(kept)") == "still here\n"
    assert attack.api.post(f"/v1/sessions/{sid}/restart").json()["state"] == "idle"
    assert attack.out(sid, "print('restarted')") == "restarted\n"


def test_privilege_escalation_is_refused(attack):
    sid = attack.session()
    code = ERRNO + (
        "import ctypes, os, socket, subprocess\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(name, *args):\n"
        "    failed = getattr(libc, name)(*args) != 0\n"
        "    return errno.errorcode[ctypes.get_errno()] if failed else 'ok'\n"
        "def sock(family, kind, proto):\n"
        "    try:\n"
        "        socket.socket(family, kind, proto).close()\n"
        "        return 'ok'\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        "def setid(fn):\n"
        "    try:\n"
        "        fn(0)\n"
        "        return 'ok'\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        "r = {}\n"
        "r['mount'] = call('mount', b'none', b'/tmp', b'tmpfs', 0, None)\n"
        "r['raw'] = sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n"
        "r['packet'] = sock(socket.AF_PACKET, socket.SOCK_RAW, 0)\n"
        "r['setuid'] = setid(os.setuid)\n"
        "r['setgid'] = setid(os.setgid)\n"
        "su = subprocess.run(['su', '-c', 'id -u', 'root'], stdin=subprocess.DEVNULL, "
        "capture_output=True, text=True)\n"
        "r['su'] = 'root' if su.stdout.strip() == '0' else 'refused'\n"
        "r['unshare_user'] = call('unshare', 0x10000000)\n"
        "r['unshare_mount'] = call('unshare', 0x00020000)\n"
        "print(sorted(r.items()))"
    )
    got = dict(ast.literal_eval(attack.out(sid, code)))
    # Each must fail; gVisor reports its own errno for some (EINVAL for an unmapped uid).
    for name in ("mount", "raw", "packet", "setuid", "setgid"):
        assert got[name] in ("EPERM", "EACCES", "EINVAL"), f"{name} succeeded: {got}"
    assert got["su"] == "refused", got
    if attack.gvisor:
        # gVisor lets a process make namespaces inside its own kernel (never the host's).
        assert {got["unshare_user"], got["unshare_mount"]} <= {"ok", "EPERM", "EINVAL"}, got
    else:
        assert got["unshare_user"] == got["unshare_mount"] == "EPERM", got


def test_ptrace_reaches_nothing_outside_the_sandbox(attack):
    """No process outside is visible, so none can be traced; see docs/SECURITY.md for ptrace."""
    sid = attack.session()
    code = (
        "import ctypes, errno, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"outside = {os.getpid()}  # the test process, on the host\n"
        "r = libc.ptrace(16, outside, 0, 0)\n"
        "print(r, errno.errorcode.get(ctypes.get_errno()), len(os.listdir('/proc')) < 100)"
    )
    out = attack.out(sid, code).split()
    assert out[0] == "-1" and out[1] in ("ESRCH", "EPERM"), f"ptrace reached a host process: {out}"


# Kernel interfaces a sandbox has no use for, each called as an attack would; NR (this
# architecture's system call numbers) is prepended. Prints {attack: "ok" or the errno}.
HOST_KERNEL_CALLS = """
import ctypes, errno, os, socket, struct, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def result(ret):
    return 'ok' if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def sys_(name, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return result(libc.syscall(NR[name], *args)) if name in NR else None
def in_child(fn):
    # For calls that change or end the process: a forked child makes them and reports.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, str(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    out = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return out
# A raw clone copies the GIL as it stands: through CDLL (which lets go of the GIL for the
# call) a kernel thread that took it meanwhile leaves the child waiting on it for ever.
held = ctypes.PyDLL(None, use_errno=True)
held.syscall.restype = ctypes.c_long
def clone(flags):
    pid = held.syscall(NR['clone'], ctypes.c_long(flags | 17), 0, 0, 0, 0)  # 17: SIGCHLD
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    return result(pid)
def sock(family, kind=socket.SOCK_STREAM):
    try:
        socket.socket(family, kind).close()
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
r = {}
secret = ctypes.create_string_buffer(b'secret!!')
victim = os.fork()  # a process of the sandbox's own, same user
if victim == 0:
    time.sleep(60)
    os._exit(0)
r['ptrace_attach'] = result(libc.ptrace(16, victim, 0, 0))
r['ptrace_traceme'] = in_child(lambda: result(libc.ptrace(0, 0, 0, 0)))
mine = ctypes.create_string_buffer(8)
theirs = struct.pack('PN', ctypes.addressof(secret), 8)  # same address after fork
r['process_vm_readv'] = sys_(
    'process_vm_readv', victim, struct.pack('PN', ctypes.addressof(mine), 8), 1, theirs, 1, 0)
r['pidfd_getfd'] = sys_('pidfd_getfd', libc.syscall(NR['pidfd_open'], victim, 0), 0, 0)
r['kcmp'] = sys_('kcmp', os.getpid(), victim, 0, 0, 0)
os.kill(victim, 9)
os.waitpid(victim, 0)
r['unshare_user'] = in_child(lambda: result(libc.unshare(0x10000000)))
r['unshare_mount'] = in_child(lambda: result(libc.unshare(0x00020000)))
r['clone_newuser'] = clone(0x10000000)
r['clone_newpid'] = clone(0x20000000)
r['clone_plain'] = clone(0)
r['clone3'] = sys_('clone3', 0, 0)
try:
    r['setns'] = result(libc.setns(os.open('/proc/self/ns/uts', os.O_RDONLY), 0))
except OSError as e:
    r['setns'] = errno.errorcode[e.errno]
r['mount'] = result(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
r['keyctl'] = in_child(lambda: sys_('keyctl', 1, 0))  # join a new session keyring
r['add_key'] = sys_('add_key', b'user', b'sbx', b'v', 1, -2)  # into the process keyring
array_map = struct.pack('IIII', 2, 4, 4, 1) + bytes(56)
r['bpf'] = sys_('bpf', 0, array_map, len(array_map))
r['userfaultfd'] = sys_('userfaultfd', 1 | os.O_CLOEXEC)  # user mode only: no sysctl stops it
own_clock = bytearray(128)  # this task's clock, user space only: allowed at paranoid 2
struct.pack_into('IIQQQQQ', own_clock, 0, 1, 128, 1, 0, 0, 0, (1 << 5) | (1 << 6))
r['perf_event_open'] = sys_('perf_event_open', bytes(own_clock), 0, -1, -1, 0)
r['io_uring_setup'] = sys_('io_uring_setup', 1, bytes(120))
r['personality_no_aslr'] = in_child(lambda: result(libc.personality(ctypes.c_ulong(0x40000))))
r['personality_query'] = result(libc.personality(ctypes.c_ulong(0xFFFFFFFF)))
r['socket_vsock'] = sock(socket.AF_VSOCK)
r['socket_alg'] = sock(socket.AF_ALG, socket.SOCK_SEQPACKET)
r['socket_inet'] = sock(socket.AF_INET)
mount_id = ctypes.c_int()
handle = struct.pack('Ii', 128, 0) + bytes(128)
r['name_to_handle_at'] = sys_('name_to_handle_at', -100, b'.', handle, ctypes.byref(mount_id), 0)
r['memfd_secret'] = sys_('memfd_secret', 0)
r['modify_ldt'] = sys_('modify_ldt', 0, bytes(16), 16)
print(sorted((k, v) for k, v in r.items() if v is not None))
"""
# What works everywhere: the filter refuses what it names, not processes or sockets.
ORDINARY = {"clone_plain", "socket_inet"}
# What gVisor serves in its own kernel: none of it reaches the host's.
GVISOR_SERVES = {
    "ptrace_attach", "ptrace_traceme", "unshare_user", "unshare_mount", "clone_newuser",
    "io_uring_setup",
}  # fmt: skip


def test_kernel_interfaces_a_sandbox_has_no_use_for_are_refused(attack, engine):
    """Under runc the gateway's seccomp profile answers EPERM (clone3: ENOSYS, so libc
    falls back to clone, whose flags it can check); see gateway/sandbox/isolation/seccomp.py."""
    sid = attack.session()
    nr = syscalls.numbers(
        "process_vm_readv", "pidfd_open", "pidfd_getfd", "kcmp", "clone", "clone3", "keyctl",
        "add_key", "bpf", "userfaultfd", "perf_event_open", "io_uring_setup",
        "name_to_handle_at", "memfd_secret", "modify_ldt",
    )  # fmt: skip
    got = dict(ast.literal_eval(attack.out(sid, f"NR = {nr!r}\n{HOST_KERNEL_CALLS}")))
    allowed = {name for name, result in got.items() if result == "ok"}
    options = engine.api.inspect_container(f"sbx-{sid}")["HostConfig"]["SecurityOpt"]
    filtered = any(o.startswith("seccomp=") for o in options)
    assert ORDINARY <= allowed, f"ordinary processes or sockets were refused: {got}"
    if attack.gvisor:
        assert allowed - ORDINARY <= GVISOR_SERVES, f"gVisor allowed more than it serves: {got}"
        assert not filtered, f"gVisor got a seccomp profile it does not need: {options}"
        return
    assert filtered, f"the kernel ran without the gateway's seccomp profile: {options}"
    assert allowed == ORDINARY | {"personality_query"}, f"an attack went through: {got}"
    refused = {name: result for name, result in got.items() if name not in allowed}
    assert refused.pop("clone3") == "ENOSYS", got
    assert set(refused.values()) == {"EPERM"}, f"refused, but not with EPERM: {refused}"


def test_kernel_and_cgroup_knobs_cannot_be_written(attack):
    sid = attack.session()
    code = ERRNO + (
        "def write(path, data='x'):\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write(data)\n"
        "        return 'written'\n"
        "    except OSError as e:\n"
        "        return err(e)\n"
        "paths = ['/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches',\n"
        "         '/proc/sysrq-trigger', '/sys/fs/cgroup/release_agent',\n"
        "         '/sys/fs/cgroup/cgroup.procs', '/sys/kernel/uevent_helper']\n"
        "print([write(p) for p in paths])"
    )
    results = ast.literal_eval(attack.out(sid, code))
    assert "written" not in results, f"a kernel or cgroup knob was writable: {results}"


def test_symlink_escapes_through_the_files_api(attack):
    sid = attack.session()
    code = ERRNO + (
        "import os\n"
        "os.symlink('/etc/passwd', 'passwd')\n"
        "os.symlink('/', 'root')\n"
        "os.makedirs('d', exist_ok=True)\n"
        "os.symlink('../../..', 'd/up')\n"
        "try:\n"
        "    os.link('/etc/passwd', 'hard')\n"
        "    print('linked')\n"
        "except OSError as e:\n"
        "    print(err(e))"
    )
    assert attack.out(sid, code) == "EXDEV\n", "a hard link reached outside the workspace"
    files = f"/v1/sessions/{sid}/files"
    for path in ("passwd", "root/etc/hostname", "d/up/etc/passwd"):
        r = attack.api.get(f"{files}/{path}")
        assert r.status_code == 403, f"GET {path} through a link answered {r.status_code}: {r.text}"
        assert r.json()["error"]["code"] == "path_forbidden"
    r = attack.api.put(f"{files}/root/tmp/planted", content=b"x")
    assert r.status_code == 403, f"an upload went through a link: {r.status_code} {r.text}"
    assert attack.api.get(f"{files}/../etc/passwd").status_code in (400, 404)


def test_a_link_planted_in_the_kernels_socket_place_never_takes_the_gateway_there(attack):
    """The kernel puts a symbolic link to a host socket where its iopub socket was, then
    makes the gateway connect again (a message over the bound cuts the connection).

    The gateway resolves socket paths on the host: through the link it would
    reach any socket the link names (the engine's, another session's kernel).
    """
    lure_dir = Path(tempfile.mkdtemp(prefix="sbx-lure-"))
    lure = socket.socket(socket.AF_UNIX)
    lure.bind(str(lure_dir / "engine.sock"))
    lure.listen(8)
    lure.settimeout(0.2)
    sid = attack.session()
    code = (
        "import json, os\n"
        "info = json.load(open('/run/sbx-kernel/kernel-connection.json'))\n"
        "path = f\"{info['ip']}-{info['iopub_port']}\"\n"
        "os.rename(path, path + '.kept')  # the kernel still listens there\n"
        f"os.symlink({str(lure_dir / 'engine.sock')!r}, path)\n"
        "print('x' * (33 << 20), flush=True)  # over max_kernel_message: the link is cut\n"
    )
    try:
        attack.api.post(
            f"/v1/sessions/{sid}/execute", json={"code": code, "timeout": 5}, timeout=30
        )
        refused = wait_for(
            lambda: any(
                "not a socket where a kernel's is" in line and sid in line
                for line in attack.gateway.log
            ),
            timeout=10,
        )
        reached = 0
        for _ in range(10):
            with contextlib.suppress(TimeoutError):
                lure.accept()[0].close()
                reached += 1
    finally:
        lure.close()
        shutil.rmtree(lure_dir, ignore_errors=True)
    assert reached == 0, "the gateway connected through the kernel's link to a host socket"
    assert refused, "the gateway never tried the kernel's socket again: the test shows nothing"


def test_oversized_and_nul_cells_get_clean_answers(attack):
    sid = attack.session()
    started = time.monotonic()
    r = attack.api.post(
        f"/v1/sessions/{sid}/execute",
        json={"code": "x = '" + "a" * 10_000_000 + "'\nprint(len(x))"},
    )
    assert r.status_code in (200, 413), r.text[:300]
    if r.status_code == 200:
        assert text_of(r.json()) == "10000000\n", r.text[:300]
    assert time.monotonic() - started < 60
    r = attack.api.post(f"/v1/sessions/{sid}/execute", json={"code": "print(1)\x00print(2)"})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200:
        reply = r.json()
        assert reply["status"] == "error" and "null" in reply["error"]["evalue"], reply
    assert attack.out(sid, "print('still fine')") == "still fine\n"
