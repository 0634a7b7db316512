"""The sandbox agent of cluster kernels, run here as a process, and the gateway's client of it.

What the cluster tests cannot show from the outside: a client without the
session's keys gets nothing at all, the workspace walls are the local ones,
and the agent's answers never turn into anything but the gateway's errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from gateway.config import ConfigError, Settings
from gateway.errors import BadRequest, FileNotFound, PathForbidden, SandboxUnavailable
from gateway.sandbox.inside import agent as agent_module
from gateway.sandbox.swarm.agent_client import AgentClient, _error
from gateway.sandbox.swarm.workspace import RemoteWorkspace


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def agent(tmp_path: Path):
    """An agent process serving ``tmp_path/ws``, and the connection info a gateway holds."""
    public, secret = zmq.curve_keypair()
    port = free_port()
    connection = {
        "key": "k" * 32,
        "curve_publickey": public.decode(),
        "curve_secretkey": secret.decode(),
    }
    workspace = tmp_path / "ws"
    workspace.mkdir()
    secret_file = tmp_path / "secret.json"
    secret_file.write_text(
        json.dumps(
            {
                "agent_port": port,
                "workspace": str(workspace),
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
    assert sorted(e["path"] for e in ws.list("")) == ["data.txt", "link", "sub"]
    with pytest.raises(PathForbidden):
        ws.open_read("link")  # refused by the agent: links are never followed
    with pytest.raises(BadRequest):
        ws.open_read("../secret.json")  # refused here, before anything is sent
    with pytest.raises(BadRequest):
        ws.list("/etc")
    ws.remove("sub/new.bin")
    with pytest.raises(FileNotFound):
        ws.open_read("sub/new.bin")


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
