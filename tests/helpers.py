"""Helpers for tests that drive a real gateway process."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tornado.websocket import websocket_connect

from gateway.sandbox import volume
from gateway.store.postgres import GATEWAY_ID_FILE

ROOT = Path(__file__).resolve().parent.parent  # the checkout: docs, notebooks, scripts


def screenshot_path(name: str, scratch: Path) -> Path:
    """Where a browser test saves its screenshot: ``docs/`` (the picture the docs show)
    with ``SBX_UPDATE_SCREENSHOTS=1``, else ``scratch``, so a test run leaves the
    checkout as it found it."""
    return (ROOT / "docs" if os.environ.get("SBX_UPDATE_SCREENSHOTS") == "1" else scratch) / name


class GatewayProcess:
    """``sbx serve`` in a subprocess, with its log kept for failure messages."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        cmd = [
            sys.executable, "-m", "gateway.cli", "serve",
            "--port", "0", "--data-dir", str(data_dir), "--log-level", "debug", *args,
        ]  # fmt: skip
        # Every gateway has its own admin token, passed as SBX_TOKEN as an operator would.
        self.token = secrets.token_hex(16)  # a leading "-" would read as a flag
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        environ.update({"SBX_TOKEN": self.token, **(env or {})})
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=environ)
        self.log: list[str] = []
        self.client = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {self.token}"})
        self.url = ""
        self.stopped = False  # stopped on purpose, as opposed to crashed
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if "listening on http://" in line and not ready.is_set():
                    self.url = line.split("listening on ")[1].split()[0]
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(60) or not self.url:
            self.stop()
            raise RuntimeError("gateway did not start:\n" + "".join(self.log[-40:]))
        self.client.base_url = self.url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ws_url(self, path: str, **query: str) -> str:
        """A WebSocket URL on this gateway, carrying the token as browsers would."""
        query = {"token": self.token, **query}
        return self.url.replace("http://", "ws://") + path + "?" + urllib.parse.urlencode(query)

    def tail(self, n: int = 30) -> str:
        return "".join(self.log[-n:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.stopped = True
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def gateway_id(data_dir: Path) -> str | None:
    """The id a gateway labels its containers with: its file (PostgreSQL) or its store."""
    if (data_dir / GATEWAY_ID_FILE).exists():
        return (data_dir / GATEWAY_ID_FILE).read_text().strip()
    path = data_dir / "gateway.sqlite3"
    if not path.exists():
        return None
    with contextlib.closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'gateway_id'").fetchone()
    return row[0] if row else None


def remove_leftovers(engine, data_dir: Path) -> None:
    """Remove what gateways on ``data_dir`` left (tests that kill them leave kernels)."""
    for worker in sorted(data_dir.glob("worker-*")):  # ``sbx serve --workers``: a gateway each
        remove_leftovers(engine, worker)
    gid = gateway_id(data_dir)
    if gid:
        for container in engine.containers.list(all=True, filters={"label": f"sbx.gateway={gid}"}):
            container.remove(force=True)
    for kind in ("sessions", "volumes"):  # workspaces, and named volumes (they outlive it)
        if (data_dir / kind).exists():
            for directory in (data_dir / kind).iterdir():
                volume.destroy(directory)
    shutil.rmtree(data_dir, ignore_errors=True)


def short_tmpdir() -> Path:
    """A short data dir: kernel socket paths must fit in 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="sbx-"))


def run(api: httpx.Client, sid: str, code: str, **kw) -> dict:
    """Execute code and return the reply body, failing loudly on HTTP errors."""
    r = api.post(f"/v1/sessions/{sid}/execute", json={"code": code, **kw})
    assert r.status_code == 200, f"execute answered {r.status_code}: {r.text}"
    return r.json()


def execute_in_background(
    api: httpx.Client, sid: str, code: str, **kw
) -> tuple[threading.Thread, dict]:
    """Start an execute on its own connection; the box gets the reply when it ends.

    A client of its own keeps this long request from sharing a connection
    pool with the test's other calls across threads.
    """
    box: dict = {}

    def go() -> None:
        with httpx.Client(base_url=api.base_url, timeout=api.timeout, headers=api.headers) as own:
            box["reply"] = run(own, sid, code, **kw)

    thread = threading.Thread(target=go)
    thread.start()
    return thread, box


# Code printing the scheduling classes of the sandbox's threads but its init's (3: SCHED_BATCH).
SCHEDULING_CLASSES = (
    "import glob\n"
    "classes = set()\n"
    "for stat in glob.glob('/proc/[0-9]*/task/*/stat'):\n"
    "    try:\n"
    "        if stat.split('/')[2] != '1':\n"
    "            classes.add(int(open(stat).read().rsplit(')', 1)[1].split()[38]))\n"
    "    except FileNotFoundError:  # a thread that ended meanwhile\n"
    "        pass\n"
    "print(sorted(classes))"
)


def text_of(reply: dict, name: str = "stdout") -> str:
    return "".join(
        o["text"] for o in reply["outputs"] if o["output_type"] == "stream" and o["name"] == name
    )


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1):
    """Poll until ``predicate()`` is truthy; return its value or None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


async def closed(ws) -> None:
    """Close a WebSocket client and wait until its socket is gone.

    A bare ``close()`` only starts the closing handshake; a loop that ends
    right after leaves the socket for the garbage collector, whose
    ResourceWarning then fails whichever test happens to be running.
    """
    stream = getattr(ws.protocol, "stream", None)  # close() forgets the protocol
    ws.close()
    deadline = time.monotonic() + 10
    # Poll the socket itself: when the server closed first, the one None that
    # read_message() returns for the end was already taken by the caller.
    while stream is not None and not stream.closed() and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ws.read_message(), 0.1)


def execute_request(code: str) -> dict:
    # No "date" and an empty "session", as some clients send.
    return {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "",
                   "session": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True},
    }  # fmt: skip


async def run_over_channels(url: str, code: str, headers: dict | None = None) -> list[dict]:
    """Send one execute_request and collect messages until its reply and idle."""
    from tornado.httpclient import HTTPRequest

    ws = await websocket_connect(HTTPRequest(url, headers=headers or {}))
    request = execute_request(code)
    ws.write_message(json.dumps(request))
    seen: list[dict] = []
    replied = idle = False
    while not (replied and idle):
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if msg.get("parent_header", {}).get("msg_id") != request["header"]["msg_id"]:
            continue
        seen.append(msg)
        replied |= msg["msg_type"] == "execute_reply"
        idle |= msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
    await closed(ws)
    return seen


def full_history(api: httpx.Client, sid: str) -> list[dict]:
    """Every execution of a session, following the history's pages."""
    executions: list[dict] = []
    params: dict = {}
    while True:
        page = api.get(f"/v1/sessions/{sid}/history", params=params).json()
        executions += page["executions"]
        if not page.get("next"):
            return executions
        params = {"after": page["next"]}


def deleted_files_held(pid: int) -> list[str]:
    """Files the gateway holds open that are gone from the file system (a spooled temp file).

    Its standard streams are left out: they are whatever it inherited (under
    pytest's capture, stdout is a deleted temp file of pytest's own).
    """
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if int(fd) < 3:
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith(" (deleted)") and not target.startswith("/memfd:"):
            held.append(target)
    return held


def unix_sockets_under(path_part: str) -> list[str]:
    """Paths of this network namespace's Unix sockets that contain ``path_part``.

    A socket stays listed while any process holds it open, even once its
    file is removed: a gateway's sockets outliving their session show here.
    """
    with open("/proc/net/unix") as f:
        next(f)  # the header
        return [line.split()[-1] for line in f if path_part in line]


# A sandbox's racing process (``.format(run=, victim=, count=)``, then ``python -c``).
# inotify wakes it as an entry is made in ``run``: unless a link or a kernel's own k-*
# socket, it is swapped at once for a symbolic link to ``victim`` (made beforehand, so
# the swap is one rename), and the number of swaps so far is written to ``count``.
SWAPPER = r"""
import ctypes, os, stat, struct
RUN, VICTIM, COUNT = {run!r}, {victim!r}, {count!r}
LURE = RUN + "/.lure"
libc = ctypes.CDLL(None, use_errno=True)
watch = libc.inotify_init1(0)
assert libc.inotify_add_watch(watch, RUN.encode(), 0x100 | 0x80) >= 0  # IN_CREATE, IN_MOVED_TO
os.symlink(VICTIM, LURE)
swaps = 0
while True:
    events, at = os.read(watch, 65536), 0
    while at < len(events):
        size = struct.unpack_from("iIII", events, at)[3]
        name = events[at + 16 : at + 16 + size].rstrip(b"\0").decode()
        at += 16 + size
        path = f"{{RUN}}/{{name}}"
        try:
            if name.startswith(("k-", ".lure")) or stat.S_ISLNK(os.lstat(path).st_mode):
                continue
            os.rename(LURE, path)
        except FileNotFoundError:
            continue
        os.symlink(VICTIM, LURE)
        swaps += 1
        with open(COUNT + ".tmp", "w") as f:
            f.write(str(swaps))
        os.replace(COUNT + ".tmp", COUNT)
"""


def host_file(directory: Path) -> Path:
    """A host file of the test's own (mode 0600), for a race to aim a link at."""
    path = directory / "host-file"
    path.write_bytes(b"the host's own\n")
    path.chmod(0o600)
    return path


def file_facts(path: Path) -> tuple[int, int, int, bytes]:
    """A file's mode, owner, group and content: what a race through a link would change."""
    st = os.lstat(path)
    return st.st_mode & 0o7777, st.st_uid, st.st_gid, path.read_bytes()


CANARY_SECONDS = 2.0  # a liveness bound on a shared machine, not a performance target


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak since the last reset) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


class Canary:
    """A second session that must stay usable while an attack runs on the same gateway.

    Runs ``print(alive)`` in a loop on its own connection (and, with
    ``list_files``, lists its workspace: that waits on the same worker threads
    as every session's file calls), keeping the slowest answer; samples the
    gateway's RSS every 0.1 s, keeping its peak and its growth. Past
    ``max_rss_mib`` it kills the gateway (the attack would take the shared
    host down with it). Leaving the block asserts the canary answered within
    ``CANARY_SECONDS`` and, given ``max_rss_growth`` (bytes), that the growth
    stayed under it. The growth also counts the kernel's VmHWM, reset on entry,
    so a spike between samples is not missed. The session must hold ``alive =
    42`` (``canary_session``).
    """

    def __init__(
        self,
        gw: GatewayProcess,
        sid: str,
        list_files: bool = False,
        max_rss_growth: int | None = None,
        max_rss_mib: int | None = None,
    ) -> None:
        self.gw, self.sid, self.list_files = gw, sid, list_files
        self.max_rss_growth, self.max_rss_mib = max_rss_growth, max_rss_mib
        self.slowest = 0.0
        self.answers = 0
        self.peak_rss_mib = 0
        self.rss_growth = 0
        self.failure: str | None = None
        self._stop = threading.Event()
        self._rss_before = memory_kib(gw.pid)["VmRSS"] * 1024
        self._threads = [
            threading.Thread(target=self._answer, daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]

    def _timed(self, call, *args):
        started = time.monotonic()
        result = call(*args)
        self.slowest = max(self.slowest, time.monotonic() - started)
        return result

    def _answer(self) -> None:
        headers = {"Authorization": f"Bearer {self.gw.token}"}
        with httpx.Client(base_url=self.gw.url, headers=headers, timeout=30) as api:
            while not self._stop.is_set():
                try:
                    reply = self._timed(run, api, self.sid, "print(alive)")
                    listing = f"/v1/sessions/{self.sid}/files"
                    files = self._timed(api.get, listing) if self.list_files else None
                except Exception as e:  # the test asserts on it
                    self.failure = f"the canary got no answer: {e!r}"
                    return
                self.answers += 1
                if text_of(reply) != "42\n":
                    self.failure = f"the canary lost its state: {reply}"
                elif files is not None and files.status_code != 200:
                    self.failure = f"the canary could not list its files: {files.text}"
                if self.failure:
                    return

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            try:
                rss = memory_kib(self.gw.pid)["VmRSS"] * 1024
            except OSError:
                return  # the gateway is gone: the answers say so
            self.peak_rss_mib = max(self.peak_rss_mib, rss // 2**20)
            self.rss_growth = max(self.rss_growth, rss - self._rss_before)
            if self.max_rss_mib is not None and rss // 2**20 > self.max_rss_mib:
                mib = rss // 2**20
                self.failure = f"the gateway grew to {mib} MiB (bound {self.max_rss_mib}): killed"
                self.gw.proc.kill()
                return

    @property
    def worst(self) -> float:
        """The slowest answer, in seconds."""
        return self.slowest

    @property
    def grown_mib(self) -> float:
        """How far the gateway's RSS rose above where it was when the attack began."""
        return self.rss_growth / 2**20

    def __str__(self) -> str:
        return (
            f"canary: {self.answers} answers, slowest {self.slowest * 1000:.0f} ms; gateway RSS "
            f"peak {self.peak_rss_mib} MiB, grew at most {self.grown_mib:.1f} MiB"
        )

    def __enter__(self) -> Canary:
        reset_peak_memory(self.gw.pid)
        for thread in self._threads:
            thread.start()
        assert wait_for(lambda: self.answers or self.failure, 30), "the canary never answered"
        return self

    def __exit__(self, *exc) -> None:
        # One more answer once the attack is over, however fast it went.
        after = self.answers + 1
        wait_for(lambda: self.answers >= after or self.failure, 30)
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        with contextlib.suppress(OSError):  # gone: the answers say so
            peak = memory_kib(self.gw.pid)["VmHWM"] * 1024
            self.peak_rss_mib = max(self.peak_rss_mib, peak // 2**20)
            self.rss_growth = max(self.rss_growth, peak - self._rss_before)
        print(self)
        assert self.failure is None, f"the canary session failed during the attack: {self.failure}"
        assert self.slowest < CANARY_SECONDS, (
            f"the canary took {self.slowest:.2f} s to answer during the attack"
        )
        if self.max_rss_growth is not None:
            assert self.rss_growth < self.max_rss_growth, (
                f"the gateway's RSS grew {self.rss_growth / 2**20:.0f} MiB during the attack"
            )


def reset_peak_memory(pid: int) -> None:
    """Make VmHWM start again from the current RSS (Linux ``clear_refs`` 5; needs root)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


@contextlib.contextmanager
def canary_session(gw: GatewayProcess) -> Iterator[str]:
    """A session of its own where ``alive = 42`` ran (what ``Canary`` expects); deleted after."""
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    run(gw.client, sid, "alive = 42")
    yield sid
    gw.client.delete(f"/v1/sessions/{sid}")


@contextlib.contextmanager
def tenant_gateway(
    start_gateway, tokens: dict[str, str], *flags: str, tenants: str = ""
) -> Iterator[tuple[GatewayProcess, dict[str, httpx.Client]]]:
    """A gateway with one token per tenant (``tokens``: tenant -> token), and a client each.

    ``tenants``: more of the tokens file, e.g. ``[tenants.beta]`` settings.
    """
    data_dir = short_tmpdir()
    tokens_file = data_dir / "tokens.toml"
    entries = "".join(f'[[tokens]]\ntenant = "{t}"\ntoken = "{k}"\n\n' for t, k in tokens.items())
    tokens_file.write_text(entries + tenants)
    gw = start_gateway("--tokens-file", str(tokens_file), *flags, data_dir=data_dir)
    clients = {
        name: httpx.Client(base_url=gw.url, timeout=300, headers={"Authorization": f"Bearer {t}"})
        for name, t in tokens.items()
    }
    try:
        yield gw, clients
    finally:
        for client in clients.values():
            client.close()


class PostgresServer:
    """A PostgreSQL server of the tests' own (``scripts/postgres``), in a temporary directory.

    Each test that needs a clean store asks for a ``database()`` of its own.
    """

    SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "postgres"

    def __init__(self) -> None:
        self.dir = short_tmpdir()
        self.url = self.start()

    def start(self) -> str:
        """Start (or start again) the server; its URL."""
        done = subprocess.run(
            [str(self.SCRIPT), "start", str(self.dir)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"scripts/postgres start failed: {done.stderr}"
        return done.stdout.strip()

    def stop(self, mode: str = "stop") -> None:
        """Stop the server: ``stop`` (fast shutdown) or ``kill`` (immediate, as a crash)."""
        subprocess.run([str(self.SCRIPT), mode, str(self.dir)], capture_output=True, check=True)

    def database(self) -> str:
        """A new, empty database on this server; its URL."""
        import psycopg

        name = f"t{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.url.replace("/sbx?", f"/{name}?")

    def remove(self) -> None:
        """Stop the server and delete its files."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def e2b_env(gw: GatewayProcess, key: str) -> dict[str, str]:
    """What ``sbx e2b env`` exports to point the stock E2B SDKs at ``gw``."""
    return {
        "E2B_API_KEY": key,
        "E2B_API_URL": gw.url,
        "E2B_SANDBOX_URL": gw.url,
        "E2B_VOLUME_API_URL": gw.url,
        "E2B_DOMAIN": "sandbox.invalid",
    }


def origin_authority(tmp: Path) -> tuple[Path, ssl.SSLContext]:
    """An origin's own CA (its file) and a server context for localhost and 127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test origin CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    (tmp / "origin-ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp / "origin.pem").write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp / "origin.pem")
    return tmp / "origin-ca.pem", server
