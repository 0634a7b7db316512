"""``sbx mcp`` driven by the official MCP SDK's own client, over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import nbformat
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.docker

SBX = str(Path(sys.executable).with_name("sbx"))
TOOLS = {
    "create_session",
    "run_code",
    "upload_file",
    "download_file",
    "list_files",
    "export_notebook",
    "delete_session",
    "snapshot",
    "fork",
    "list_sessions",
    "interrupt",
    "restart",
    "update_network",
    "create_volume",
    "list_volumes",
    "delete_volume",
    "list_contexts",
    "create_context",
    "restart_context",
    "remove_context",
}
PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
)


def stdio_params(gateway) -> StdioServerParameters:
    """``sbx mcp`` over stdio, with this checkout on its path (the SDK passes little env)."""
    token = getattr(gateway, "token", "")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    return StdioServerParameters(
        command=SBX, args=["mcp", "--url", gateway.url, "--token", token], env=env
    )


def _texts(result) -> list[str]:
    return [block.text for block in result.content if block.type == "text"]


async def _agent_flow(client: Client) -> dict:
    """What an agent does: start, upload, compute, look at a chart, download, export, end."""
    seen: dict = {"tools": await client.list_tools()}
    created = await client.call_tool("create_session", {"memory": "512m", "ttl": 300})
    assert not created.is_error, _texts(created)
    sid = created.structured_content["session_id"]
    seen["created"] = created
    calls = {
        "upload_text": ("upload_file", {"path": "in/data.csv", "content": "a,b\n1,2\n3,4\n"}),
        "upload_binary": (
            "upload_file",
            {
                "path": "blob.bin",
                "content": base64.b64encode(b"\x00\xff\x10").decode(),
                "encoding": "base64",
            },
        ),
        "run": (
            "run_code",
            {
                "code": "import pandas as pd\ndf = pd.read_csv('in/data.csv')\n"
                "print('rows', len(df))\ndf.to_csv('out.csv')\n" + PLOT + "int(df.a.sum())"
            },
        ),
        "state": ("run_code", {"code": "len(df) * 10"}),
        "error": ("run_code", {"code": "df['missing']"}),
        "timeout": ("run_code", {"code": "import time; time.sleep(5)", "timeout": 1}),
        "list": ("list_files", {}),
        "list_dir": ("list_files", {"path": "in"}),
        "text_file": ("download_file", {"path": "out.csv"}),
        "binary_file": ("download_file", {"path": "blob.bin"}),
        "missing_file": ("download_file", {"path": "nope.txt"}),
        "big": ("run_code", {"code": "open('big.bin', 'wb').truncate(16 * 1024**2 + 1)"}),
        "too_big": ("download_file", {"path": "big.bin"}),
        "notebook": ("export_notebook", {}),
        "network": ("update_network", {"allow_hosts": ["pypi.org"]}),
        "deleted": ("delete_session", {}),
        "after_delete": ("run_code", {"code": "1"}),
    }
    for name, (tool, arguments) in calls.items():
        seen[name] = await client.call_tool(tool, {"session_id": sid, **arguments})
    seen["png"] = await _chart_file(client)
    return seen


async def _chart_file(client: Client):
    created = await client.call_tool("create_session", {"metadata": {"test": "mcp"}})
    sid = created.structured_content["session_id"]
    try:
        await client.call_tool(
            "run_code", {"session_id": sid, "code": PLOT + "plt.savefig('c.png')"}
        )
        return await client.call_tool("download_file", {"session_id": sid, "path": "c.png"})
    finally:
        await client.call_tool("delete_session", {"session_id": sid})


def test_stdio_server_serves_every_tool(gateway, api):
    params = stdio_params(gateway)

    async def scenario():
        async with Client(params) as client:
            return await _agent_flow(client)

    seen = asyncio.run(scenario())
    tools = {t.name: t for t in seen["tools"].tools}
    assert set(tools) == TOOLS
    assert all(t.description for t in tools.values())
    assert tools["run_code"].input_schema["required"] == ["session_id", "code"]

    created = seen["created"].structured_content
    assert created["state"] == "idle" and created["limits"]["memory"] == 512 * 1024**2
    session = api.get(f"/v1/sessions/{created['session_id']}").json()
    assert session["metadata"] == {"client": "mcp"} and session["ttl"] == 300

    assert seen["upload_text"].structured_content == {"path": "in/data.csv", "size": 12}
    assert seen["upload_binary"].structured_content == {"path": "blob.bin", "size": 3}

    run = seen["run"]
    assert not run.is_error and run.structured_content["status"] == "ok"
    assert run.structured_content["artifacts"] == ["out.csv"]
    kinds = [block.type for block in run.content]
    assert kinds == ["text", "image", "text", "text"], kinds
    assert run.content[0].text == "[stdout]\nrows 2\n"
    image = run.content[1]
    assert image.mime_type == "image/png" and base64.b64decode(image.data).startswith(b"\x89PNG")
    assert run.content[2].text == "4" and "out.csv" in run.content[3].text

    assert _texts(seen["state"]) == ["20"], "state did not persist between run_code calls"
    error = seen["error"]
    assert not error.is_error, "a failing cell is a result for the model, not a tool failure"
    assert error.structured_content["status"] == "error"
    assert "KeyError" in error.structured_content["error"]
    traceback = _texts(error)[0]
    assert traceback.startswith("[error]") and "df['missing']" in traceback
    assert "\x1b[" not in traceback, "the model got terminal colour codes"
    assert seen["timeout"].structured_content["status"] == "timeout"
    assert "[timeout: ExecutionTimeout" in _texts(seen["timeout"])[-1]

    listing = seen["list"].structured_content["entries"]
    assert {e["path"]: e["type"] for e in listing} == {
        "blob.bin": "file",
        "in": "directory",
        "out.csv": "file",
    }
    assert [e["path"] for e in seen["list_dir"].structured_content["entries"]] == ["in/data.csv"]
    assert _texts(seen["text_file"]) == [",a,b\n0,1,2\n1,3,4\n"]
    (blob,) = seen["binary_file"].content
    assert blob.type == "resource" and base64.b64decode(blob.resource.blob) == b"\x00\xff\x10"
    assert seen["missing_file"].is_error and "file_not_found" in _texts(seen["missing_file"])[0]
    assert seen["too_big"].is_error, "a file over the limit was put in the model's context"
    assert "big.bin is 16777217 bytes, over the 16777216-byte limit" in _texts(seen["too_big"])[0]
    (png,) = seen["png"].content
    assert png.type == "image" and base64.b64decode(png.data).startswith(b"\x89PNG")

    (notebook,) = seen["notebook"].content
    assert notebook.resource.mime_type == "application/x-ipynb+json"
    nb = nbformat.reads(notebook.resource.text, as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells if c.cell_type == "code"][1] == "len(df) * 10"

    # the flow's session has no network at all: there is nothing to change, and it says so
    network = seen["network"]
    assert network.is_error and "created with network" in _texts(network)[0], _texts(network)

    assert "deleted session" in _texts(seen["deleted"])[0]
    after = seen["after_delete"]
    assert after.is_error and (
        "session_ended" in after.content[0].text or "session_not_found" in after.content[0].text
    )
    assert api.get("/v1/sessions", params={"metadata.test": "mcp"}).json()["sessions"] == []


class MCPHTTPProcess:
    """``sbx mcp --http`` on a free port; its URL is read from what it prints.

    It has no token of its own (nor a generated one to find): callers send theirs.
    """

    def __init__(self, gateway_url: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        env.update(SBX_URL=gateway_url, XDG_DATA_HOME="/nonexistent")
        self.proc = subprocess.Popen(
            [SBX, "mcp", "--http", "--port", "0"],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.url = ""
        self.log: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if "streamable HTTP on " in line:
                    self.url = line.split("streamable HTTP on ")[1].strip()
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(30) or not self.url:
            self.stop()
            raise AssertionError("sbx mcp --http did not start:\n" + "".join(self.log))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()

    @contextlib.asynccontextmanager
    async def client(self, token: str) -> AsyncIterator[Client]:
        """An MCP client sending ``token``, as a person's MCP client configured with it would."""
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
            async with Client(streamable_http_client(self.url, http_client=http)) as client:
                yield client


def test_streamable_http_server(gateway):
    server = MCPHTTPProcess(gateway.url)

    async def scenario():
        async with server.client(gateway.token) as client:  # each caller sends its own token
            tools = await client.list_tools()
            created = await client.call_tool("create_session", {})
            sid = created.structured_content["session_id"]
            first = await client.call_tool("run_code", {"session_id": sid, "code": "n = 21"})
            second = await client.call_tool(
                "run_code", {"session_id": sid, "code": "print(n * 2)\n" + PLOT}
            )
            deleted = await client.call_tool("delete_session", {"session_id": sid})
            return tools, first, second, deleted

    try:
        tools, first, second, deleted = asyncio.run(scenario())
    finally:
        server.stop()
    assert {t.name for t in tools.tools} == TOOLS
    assert first.structured_content["status"] == "ok"
    assert [b.type for b in second.content] == ["text", "image"]
    assert second.content[0].text == "[stdout]\n42\n"
    assert not deleted.is_error
    assert json.dumps(second.structured_content)  # plain JSON for any client


def test_an_agent_tries_two_paths_from_one_snapshot(gateway):
    params = stdio_params(gateway)

    async def scenario() -> list[str]:
        async with Client(params) as client:
            created = await client.call_tool("create_session", {})
            sid = created.structured_content["session_id"]
            await client.call_tool("run_code", {"session_id": sid, "code": "base = 100"})
            snap = await client.call_tool("snapshot", {"session_id": sid, "name": "start"})
            assert not snap.is_error, _texts(snap)
            snapshot_id = snap.structured_content["snapshot_id"]
            answers = []
            for step in ("base + 1", "base * 2"):
                fork = await client.call_tool("fork", {"snapshot_id": snapshot_id})
                assert not fork.is_error, _texts(fork)
                child = fork.structured_content["session_id"]
                ran = await client.call_tool("run_code", {"session_id": child, "code": step})
                answers += _texts(ran)
                await client.call_tool("delete_session", {"session_id": child})
            missing = await client.call_tool("fork", {"snapshot_id": "nope"})
            answers.append(str(missing.is_error))
            await client.call_tool("delete_session", {"session_id": sid})
            return answers

    assert asyncio.run(scenario()) == ["101", "200", "True"]
