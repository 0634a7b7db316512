"""The sandbox agent of cluster kernels, run here as a process, and the gateway's client of it.

What the cluster tests cannot show from the outside: a client without the
session's keys gets nothing at all, the workspace walls are the local ones,
and the agent's answers never turn into anything but the gateway's errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tornado.httpserver
import tornado.iostream
import tornado.netutil
import tornado.web
import zmq
import zmq.asyncio

from gateway.access.audit import AuditLog
from gateway.access.auth import Authenticator, Quota
from gateway.api import files
from gateway.api.base import ApiOptions
from gateway.config import ConfigError, Settings
from gateway.errors import BadRequest, FileNotFound, PathForbidden, SandboxUnavailable
from gateway.sandbox.inside import agent as agent_module
from gateway.sandbox.swarm.agent_client import AgentClient, _error
from gateway.sandbox.swarm.workspace import RemoteWorkspace
from gateway.store.sqlite import SQLiteStore as Store
from gateway.workspace.files import AsyncWorkspace

# The first bytes a ZeroMQ peer sends (ZMTP 3 signature and version); a ZeroMQ socket
# answers them with its own.
ZMTP_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f\x03"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def agent(tmp_path: Path, request):
    """An agent process serving ``tmp_path/ws``, and the connection info a gateway holds.

    It admits connections from the gateway address ``request.param`` (default: here).
    """
    gateway = getattr(request, "param", "127.0.0.1")
    public, secret = zmq.curve_keypair()
    port = free_port()
    connection = {
        "key": "k" * 32,
        "curve_publickey": public.decode(),
        "curve_secretkey": secret.decode(),
        **{f"{channel}_port": free_port() for channel in agent_module.CHANNELS},
    }
    workspace = tmp_path / "ws"
    workspace.mkdir()
    secret_file = tmp_path / "secret.json"
    secret_file.write_text(
        json.dumps(
            {
                "agent_port": port,
                "workspace": str(workspace),
                "gateway": gateway,
                "connection": {**connection, "transport": "tcp", "ip": "127.0.0.1"},
            }
        )
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, agent_module.__file__, str(secret_file)],
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    time.sleep(0.5)
    yield f"tcp://127.0.0.1:{port}", connection, workspace
    proc.terminate()
    proc.wait(10)


def call(url: str, connection: dict, op: str, args: dict | None = None, timeout: float = 5):
    async def go():
        client = AgentClient(zmq.asyncio.Context.instance(), url, connection)
        try:
            return await client.call(op, args, timeout=timeout)
        finally:
            client.close()

    return asyncio.run(go())


def test_the_session_keys_answer(agent):
    url, connection, _ = agent
    status, _ = call(url, connection, "status")
    assert status == {"generation": 0, "running": False}


def test_a_wrong_hmac_key_gets_no_answer(agent):
    url, connection, _ = agent
    with pytest.raises(SandboxUnavailable):
        call(url, {**connection, "key": "x" * 32}, "status", timeout=1.5)


@pytest.mark.parametrize("agent", ["192.0.2.1"], indirect=True)
def test_only_the_gateways_address_gets_through(agent):
    """Another address is reset before a byte: not a greeting from the agent nor the kernel."""
    url, connection, _ = agent
    ports = [int(url.rpartition(":")[2])]
    ports += [connection[f"{channel}_port"] for channel in agent_module.CHANNELS]
    for port in ports:
        try:  # the reset may come before connect() even returns
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(ZMTP_GREETING)
                answer = sock.recv(64)
        except ConnectionResetError:
            answer = b""
        assert answer == b"", f"port {port} answered a stranger: {answer!r}"
    with pytest.raises(SandboxUnavailable):
        call(url, connection, "status", timeout=1)


def test_a_client_without_the_curve_keys_cannot_talk(agent):
    url, connection, _ = agent
    stranger_public, stranger_secret = zmq.curve_keypair()
    with pytest.raises(SandboxUnavailable):
        # The right HMAC key, but another server key: the handshake never completes.
        call(
            url,
            {**connection, "curve_publickey": stranger_public.decode(),
             "curve_secretkey": stranger_secret.decode()},
            "status",
            timeout=1.5,
        )  # fmt: skip


def test_the_workspace_walls_are_the_local_ones(agent):
    url, connection, workspace = agent
    (workspace / "data.txt").write_text("hello")
    os.symlink("/etc/passwd", workspace / "link")

    async def go():
        client = AgentClient(zmq.asyncio.Context.instance(), url, connection)
        await client.call("status")
        ws = RemoteWorkspace(str(workspace), os.getuid(), os.getgid(), agent=lambda: client)
        try:
            return await asyncio.to_thread(_exercise, ws)
        finally:
            client.close()

    asyncio.run(go())


def _exercise(ws: RemoteWorkspace) -> None:
    reader, info = ws.open_read("data.txt")
    assert (reader.read(), info.st_size) == (b"hello", 5)
    upload = ws.open_write("sub/new.bin")
    upload.write(os.urandom(600 * 1024))  # more than one chunk
    upload.finish(True)
    assert upload.size == 600 * 1024
    assert sorted(e["path"] for e in ws.list("")["entries"]) == ["data.txt", "link", "sub"]
    with pytest.raises(PathForbidden):
        ws.open_read("link")  # refused by the agent: links are never followed
    with pytest.raises(BadRequest):
        ws.open_read("../secret.json")  # refused here, before anything is sent
    with pytest.raises(BadRequest):
        ws.list("/etc")
    ws.remove("sub/new.bin")
    with pytest.raises(FileNotFound):
        ws.open_read("sub/new.bin")


class _OneSession:
    """What the files handlers ask of the session manager (its store answering) and of its
    Workspaces (one session's files, and its absent file policy)."""

    def __init__(self, workspace: RemoteWorkspace) -> None:
        self.workspace = AsyncWorkspace(workspace)  # as Sandboxes.equip makes it

    def files(self, session_id: str, who: object) -> AsyncWorkspace:
        return self.workspace

    def check_file(self, session_id: str, who: object, op: str, size: int = 0) -> int:
        return 0  # no policy limits this session's files

    def check_available(self) -> None:
        """Its store always answers."""


async def _serve_files(tmp_path: Path, url: str, connection: dict, workspace: Path):
    """The real files handlers on a real port, the session's workspace behind a real agent."""
    client = AgentClient(zmq.asyncio.Context.instance(), url, connection)
    await client.call("status")  # connected, as a session's agent is once its kernel started
    store = Store(tmp_path / "gateway.sqlite3")
    await store.open()
    one = _OneSession(RemoteWorkspace(str(workspace), agent=lambda: client))
    app = tornado.web.Application(
        files.routes,
        sbx_manager=one,
        sbx_workspaces=one,
        sbx_options=ApiOptions(
            **{f.name: getattr(Settings(), f.name) for f in dataclasses.fields(ApiOptions)}
        ),
        sbx_auth=Authenticator(None, {}, Quota(max_sessions=1, max_memory=2**30, max_disk=2**30)),
        sbx_audit=AuditLog(store),
    )
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets(sockets)
    return sockets[0].getsockname()[1], server, client, store


def _held_open(workspace: Path) -> list[str]:
    """Workspace files the agent process (the fixture's only child) still has open."""
    held = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and f"{workspace.parent}/secret.json" in _cmdline(pid):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(str(workspace)):
                    held.append(target)
    return held


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_swarm_upload_or_download_cut_short_is_dropped_in_the_sandbox(agent, tmp_path, caplog):
    """A client that goes away mid-transfer: the sandbox's half-file and open files go too."""
    url, connection, workspace = agent
    (workspace / "big.bin").write_bytes(os.urandom(4 * 2**20))

    async def go():
        port, server, client, store = await _serve_files(tmp_path, url, connection, workspace)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"PUT /v1/sessions/s/files/half.bin HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 3000000\r\n\r\n" + os.urandom(600 * 1024)
            )
            await writer.drain()
            await asyncio.sleep(0.5)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v1/sessions/s/files/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readexactly(300 * 1024)
            writer.close()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                left = [p.name for p in workspace.iterdir() if p.name != "big.bin"]
                if not left and not _held_open(workspace):
                    break
            return left, _held_open(workspace)
        finally:
            server.stop()
            client.close()
            await store.close()

    left, held = asyncio.run(go())
    assert left == [], f"an upload the client gave up on left {left} in the sandbox's workspace"
    assert held == [], f"the sandbox agent still holds {held} open after the client went away"
    failures = [
        r.exc_info[1]
        for r in caplog.records
        if r.exc_info and not isinstance(r.exc_info[1], tornado.iostream.StreamClosedError)
    ]
    assert failures == [], f"the gateway failed where the client went away: {failures}"


def test_an_agents_answer_maps_only_to_gateway_errors():
    assert isinstance(_error({"type": "FileNotFound", "message": "m"}), FileNotFound)
    assert type(_error({"type": "SystemExit", "message": "m"})).__name__ == "GatewayError"
    assert type(_error({"type": "SessionNotFound", "message": "m"})).__name__ == "GatewayError"
    assert type(_error("junk")).__name__ == "GatewayError"


def test_swarm_placement_refuses_what_a_service_cannot_do():
    with pytest.raises(ConfigError, match="runtime runc and network policy none"):
        Settings(placement="swarm")
    Settings(placement="swarm", runtimes="runc", network_policies="none")
    with pytest.raises(ConfigError, match="placement must be"):
        Settings(placement="kubernetes")
