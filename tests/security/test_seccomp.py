"""The gateway's seccomp profile (sandbox/isolation/seccomp.py), the default for runc kernels.

It must decide every system call, refuse at least what Docker's default
refuses, refuse more only where it says so, and leave real work alone: the data
stack, processes, threads, pools, files, sockets, and every kernel on offer.
The attacks it stops are in test_attacks.py.
"""

from __future__ import annotations

import ast
import base64
import errno
import itertools
import json
import platform
import signal
from collections.abc import Iterator

import pytest
from helpers import GatewayProcess, run, text_of

from gateway.config import PACKAGE_DIR
from gateway.sandbox.isolation import seccomp

from . import syscalls

pytestmark = pytest.mark.docker

DECIDED = {
    "allowed": {name for names in seccomp.ALLOWED.values() for name in names},
    "denied": {name for names in seccomp.DENIED.values() for name in names},
    "absent": set(seccomp.ABSENT),
    "restricted": set(seccomp.RESTRICTED),
}
REFUSED = (errno.EPERM, errno.ENOSYS)

# Calls every system call number with zero arguments, each in a forked child (a
# call may change or end the process), and prints {number: errno, 0, or None when
# the call ended the child or blocked past the timer}.
PROBE = """
import ctypes, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for nr in NUMBERS:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        failed = libc.syscall(nr, 0, 0, 0, 0, 0, 0) == -1
        os.write(w, str(ctypes.get_errno() if failed else 0).encode())
        os._exit(0)
    os.close(w)
    data = os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
    out[nr] = int(data) if data else None
print(json.dumps(out))
"""
# Calls that would copy the probe's child into a second, confused prober.
NOT_PROBED = ("fork", "vfork", "clone")


def test_the_profile_decides_every_system_call_this_host_knows():
    """A call libseccomp knows but the profile does not mention is an oversight."""
    for (group, names), (other, others) in itertools.combinations(DECIDED.items(), 2):
        assert not names & others, f"{sorted(names & others)} are both {group} and {other}"
    decided = set().union(*DECIDED.values())
    table = syscalls.table()
    newest = max(nr for nr, name in table.items() if name in decided)
    undecided = sorted(name for nr, name in table.items() if nr <= newest and name not in decided)
    assert not undecided, f"sandbox/isolation/seccomp.py does not say whether to allow {undecided}"


@pytest.fixture(scope="module")
def docker_default_gateway(start_gateway) -> GatewayProcess:
    return start_gateway("--seccomp-profile", "docker-default")


def probe(gateway: GatewayProcess, numbers: list[int]) -> dict[int, int | None]:
    api = gateway.client
    probe_code = f"NUMBERS = {numbers}\n{PROBE}"
    r = api.post("/v1/sessions", json={"runtime": "runc"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        # A fresh interpreter forks faster than the kernel, with its threads and sockets.
        code = (
            "import subprocess, sys\n"
            f"print(subprocess.run([sys.executable, '-c', {probe_code!r}], capture_output=True, "
            "text=True).stdout)"
        )
        out = text_of(run(api, sid, code, timeout=120))
    finally:
        api.delete(f"/v1/sessions/{sid}")
    return {int(nr): result for nr, result in json.loads(out).items()}


def test_the_profile_refuses_what_dockers_default_refuses_and_more_only_on_purpose(
    hostile_gateway, docker_default_gateway
):
    table = syscalls.table()
    numbers = [nr for nr in range(max(table) + 16) if table.get(nr) not in NOT_PROBED]
    ours = probe(hostile_gateway, numbers)
    docker = probe(docker_default_gateway, numbers)

    def name(nr: int) -> str:
        return table.get(nr, f"#{nr}")

    laxer = [name(nr) for nr in numbers if docker[nr] in REFUSED and ours[nr] not in REFUSED]
    assert not laxer, f"Docker's default refuses {laxer}, the gateway's profile does not"
    stricter = {name(nr) for nr in numbers if ours[nr] in REFUSED and docker[nr] not in REFUSED}
    on_purpose = DECIDED["denied"] | DECIDED["restricted"] | DECIDED["absent"]
    assert stricter <= on_purpose, f"refused by oversight: {sorted(stricter - on_purpose)}"
    newer = [name(nr) for nr in numbers if nr > max(table) and ours[nr] != errno.ENOSYS]
    assert not newer, f"calls newer than libseccomp knows must answer ENOSYS: {newer}"
    # The operator's way back to Docker's default works: ptrace (PTRACE_TRACEME) is back.
    ptrace = syscalls.numbers("ptrace")["ptrace"]
    assert (ours[ptrace], docker[ptrace]) == (errno.EPERM, 0), (ours[ptrace], docker[ptrace])


@pytest.fixture(scope="module")
def python(hostile_gateway) -> Iterator[str]:
    """One Python session under the default profile, shared by the workload tests."""
    api = hostile_gateway.client
    r = api.post("/v1/sessions", json={"runtime": "runc", "limits": {"memory": "1g"}})
    assert r.status_code == 201, r.text
    yield r.json()["id"]
    api.delete(f"/v1/sessions/{r.json()['id']}")


def works(gateway: GatewayProcess, sid: str, code: str) -> dict:
    reply = run(gateway.client, sid, code, timeout=120)
    assert reply["status"] == "ok", f"ordinary work failed under the seccomp profile: {reply}"
    return reply


def test_the_data_stack_computes_and_plots(hostile_gateway, python):
    code = (
        "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
        "rng = np.random.default_rng(0)\n"
        "df = pd.DataFrame({'x': np.arange(100), 'y': rng.normal(size=100).cumsum()})\n"
        "print(int(df['x'].sum()), np.linalg.inv(np.eye(3) * 2)[0, 0])\n"
        "df.plot(x='x', y='y')\n"
        "plt.show()"
    )
    reply = works(hostile_gateway, python, code)
    assert text_of(reply) == "4950 0.5\n", reply
    images = [o["data"]["image/png"] for o in reply["outputs"] if "image/png" in o.get("data", {})]
    assert images and base64.b64decode(images[0]).startswith(b"\x89PNG"), reply["outputs"]


def test_processes_threads_and_pools(hostile_gateway, python):
    code = """
import asyncio, concurrent.futures as cf, multiprocessing as mp, os, subprocess, threading
import numpy as np

def square(n):
    return n * n

out = {}
out['subprocess'] = subprocess.run(
    ['sh', '-c', 'echo $((6 * 7)) | cat'], capture_output=True, text=True).stdout.strip()
with mp.get_context('fork').Pool(2) as pool:
    out['fork_pool'] = sum(pool.map(square, range(10)))
with cf.ProcessPoolExecutor(2, mp_context=mp.get_context('spawn')) as pool:
    out['spawn_pool'] = sum(pool.map(abs, range(-4, 0)))
with cf.ThreadPoolExecutor(4) as pool:
    out['threads'] = sum(pool.map(lambda n: float(np.ones((200, 200)).sum()), range(4)))
out['posix_spawn'] = os.waitpid(os.posix_spawnp('true', ['true'], os.environ), 0)[1]
proc = await asyncio.create_subprocess_exec('echo', 'async', stdout=subprocess.PIPE)
out['asyncio'] = (await proc.communicate())[0].decode().strip()
print(sorted(out.items()))
"""
    got = dict(ast.literal_eval(text_of(works(hostile_gateway, python, code))))
    assert got == {
        "subprocess": "42", "fork_pool": 285, "spawn_pool": 10, "threads": 160000.0,
        "posix_spawn": 0, "asyncio": "async",
    }, got  # fmt: skip


def test_files_sockets_timers_and_the_shell(hostile_gateway, python):
    code = """
import os, shutil, signal, socket, sqlite3, tempfile, time
out = {}
with open('a.bin', 'wb') as f:
    f.write(os.urandom(1 << 20))
shutil.copy('a.bin', 'b.bin')  # copy_file_range / sendfile
out['copy'] = open('a.bin', 'rb').read() == open('b.bin', 'rb').read()
db = sqlite3.connect('t.db')
db.execute('create table t(x)')
db.execute('insert into t values (1)')
out['sqlite'] = db.execute('select count(*) from t').fetchone()[0]
with tempfile.TemporaryDirectory() as d:
    os.mkfifo(os.path.join(d, 'fifo'))
    out['fifo'] = os.listdir(d)
a, b = socket.socketpair()
a.send(b'x')
out['socketpair'] = b.recv(1)
server = socket.create_server(('127.0.0.1', 0))
client = socket.create_connection(server.getsockname())
server.accept()[0].send(b'tcp')
out['loopback'] = client.recv(3)
out['interfaces'] = [n for _, n in socket.if_nameindex()]  # netlink
def ring(*_):
    raise TimeoutError
signal.signal(signal.SIGALRM, ring)
signal.setitimer(signal.ITIMER_REAL, 0.05)
try:
    time.sleep(5)
except TimeoutError:
    out['timer'] = 'rang'
for name in ('a.bin', 'b.bin', 't.db'):
    os.remove(name)
print(sorted(out.items()))
"""
    got = dict(ast.literal_eval(text_of(works(hostile_gateway, python, code))))
    assert got == {
        "copy": True, "sqlite": 1, "fifo": ["fifo"], "socketpair": b"x", "loopback": b"tcp",
        "interfaces": ["lo"], "timer": "rang",
    }, got  # fmt: skip
    shell = works(hostile_gateway, python, "!echo shell $((1 + 1))")
    assert text_of(shell).strip() == "shell 2", shell


# mov eax, 20 (getpid in the 32-bit table); int 0x80; ret
INT80_GETPID = "b814000000cd80c3"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the int 0x80 entry is x86's")
def test_a_32_bit_system_call_kills_the_process(hostile_gateway, python):
    """Only the native architecture is in the filter: the old 32-bit table stays shut."""
    child = (
        "import ctypes, mmap; "
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC); "
        f"page.write(bytes.fromhex('{INT80_GETPID}')); "
        "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())"
    )
    code = (
        "import subprocess, sys\n"
        f"print(subprocess.run([sys.executable, '-c', {child!r}]).returncode)"
    )
    assert text_of(works(hostile_gateway, python, code)) == f"{-signal.SIGSYS}\n"


# A cell for each kernel in kernels/, doing what its users do: processes, plots, workers.
KERNEL_CELLS = {
    "python3": ("import os; print(os.cpu_count() > 0, sum(range(10)))", "True 45"),
    "xpython": (
        "import subprocess; print(subprocess.check_output(['echo', 'xeus']).decode().strip())",
        "xeus",
    ),
    "bash": (
        "x=$(echo 41); (sleep 0.1 &); wait; echo $((x + 1)) | cat; sort <<< $'b\\na' | head -1",
        "42\na",
    ),
    "ir": (
        "r <- parallel::mclapply(1:4, function(i) i * i, mc.cores = 2); "
        'f <- tempfile(fileext = ".png"); png(f); plot(1:10); invisible(dev.off()); '
        'cat(sum(unlist(r)), file.exists(f), system("echo sub", intern = TRUE), "\\n")',
        "30 TRUE sub",
    ),
    "javascript": (
        "$$.async(); const fs = require('fs'); const { Worker } = require('worker_threads'); "
        "fs.writeFileSync('/tmp/j.txt', 'js'); "
        "new Worker('require(\"worker_threads\").parentPort.postMessage(6 * 7)', { eval: true })"
        ".on('message', (m) => fs.readFile('/tmp/j.txt', 'utf8', (e, d) => { console.log(m, d, "
        "require('child_process').execSync('echo sub').toString().trim()); $$.done(); }));",
        "42 js sub",
    ),
}


KERNELS = sorted(spec.parent.name for spec in PACKAGE_DIR.glob("kernels/*/kernel.json"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_starts_and_runs_under_the_profile(hostile_gateway, engine, kernel):
    assert kernel in KERNEL_CELLS, f"add a cell for kernel {kernel!r} to KERNEL_CELLS"
    code, expected = KERNEL_CELLS[kernel]
    api = hostile_gateway.client
    r = api.post("/v1/sessions", json={"kernel": kernel, "limits": {"memory": "512m"}})
    assert r.status_code == 201, f"kernel {kernel} did not start under the profile: {r.text}"
    sid = r.json()["id"]
    try:
        assert text_of(works(hostile_gateway, sid, code)).strip() == expected
        options = engine.api.inspect_container(f"sbx-{sid}")["HostConfig"]["SecurityOpt"]
        profiles = [json.loads(o.removeprefix("seccomp=")) for o in options if "seccomp=" in o]
        assert profiles == [seccomp.profile()], "the kernel ran without the gateway's profile"
    finally:
        api.delete(f"/v1/sessions/{sid}")
