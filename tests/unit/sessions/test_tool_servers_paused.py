"""A paused session's stdio tool servers stop costing: frozen with its sandbox, removed
with it on a deep pause, and started again by the next call after its resume.

A real ``SessionTools`` and ``Pausing`` over a real ``Session``; the engine is a stand-in
at the placement (``Engine``: start_tool_server, freeze, thaw), each server a scripted
MCP process in its sandbox (``Process``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import docker.errors
from test_session_tools import World, run

from gateway.limits import Limits
from gateway.sessions.model import Session
from gateway.sessions.pausing import Pausing
from gateway.sessions.state import SavedState

KERNEL = "kernel-container"


class Process:
    """A stdio MCP server in its sandbox: answers initialize, tools/list and tools/call."""

    def __init__(self, engine: Engine, sandbox_id: str) -> None:
        self.engine, self.sandbox_id = engine, sandbox_id
        self.out: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

    async def read(self) -> tuple[str, bytes] | None:
        return await self.out.get()

    async def write(self, data: bytes) -> None:
        asked = json.loads(data)
        if "id" not in asked:
            return
        results = {
            "initialize": {"protocolVersion": asked.get("params", {}).get("protocolVersion"),
                           "capabilities": {"tools": {}},
                           "serverInfo": {"name": "notes", "version": "1"}},
            "tools/list": {"tools": [{"name": "echo", "inputSchema": {"type": "object"},
                                      "annotations": {"readOnlyHint": True}}]},
            "tools/call": {"content": [{"type": "text", "text": self.sandbox_id}]},
        }  # fmt: skip
        result = results.get(asked["method"])  # else unknown, as the SDK's server/discover
        said = {"result": result} if result else {"error": {"code": -32601, "message": "?"}}
        reply = {"jsonrpc": "2.0", "id": asked["id"], **said}
        await self.out.put(("stdout", json.dumps(reply).encode() + b"\n"))

    async def end(self) -> None:
        self.engine.running.pop(self.sandbox_id, None)
        self.out.put_nowait(None)


class Engine:
    """The placement: tool servers started, sandboxes frozen and thawed (``failing``: ids
    the engine refuses to freeze)."""

    name, freezes = "docker", True

    def __init__(self) -> None:
        self.running: dict[str, Process] = {}
        self.frozen: set[str] = set()
        self.started = 0
        self.failing: set[str] = set()

    async def start_tool_server(self, spec, name, image, argv, env) -> Process:
        self.started += 1
        process = self.running[f"tool-{self.started}"] = Process(self, f"tool-{self.started}")
        return process

    async def freeze(self, sandbox_id: str) -> None:
        if sandbox_id in self.failing:
            raise docker.errors.APIError("the cgroup freezer is unavailable")
        self.frozen.add(sandbox_id)

    async def thaw(self, sandbox_id: str) -> None:
        self.frozen.discard(sandbox_id)


class Kernel:
    def __init__(self, run_dir) -> None:
        self.sandbox = SimpleNamespace(run_dir=run_dir)
        self.container_id, self.connected, self.stopped = KERNEL, True, False
        self.died = asyncio.Event()
        self.restarts = 0

    async def run_silently(self, code: str) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


async def paused_world(w: World) -> tuple[Pausing, Session, Engine]:
    """The World's session a real one, given a stdio server; a Pausing over the engine."""
    engine = Engine()
    specs = SimpleNamespace(default="python3", names=lambda: ["python3"])
    w.manager.lifecycle = SimpleNamespace(
        placement=engine, kernelspecs=specs, kernel_image=lambda kernel: f"sbx/{kernel}"
    )
    w.manager.templates = None
    session = Session("python3", "img", Limits(2**30, 1.0, 64, 2**30, 30.0, 2**20), 60.0, 60.0,
                      {}, {}, session_id="s1")  # fmt: skip
    session.kernel = Kernel(w.session.kernel.sandbox.run_dir)  # type: ignore[assignment]
    session.state = "idle"
    w.manager.sessions["s1"] = session  # type: ignore[assignment]
    await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}])

    async def save(session: Session) -> None:
        pass

    async def saved(session, strategy, timeout) -> SavedState:
        return SavedState(strategy, [], 0, 0.0)

    state = SimpleNamespace(choose=lambda session, requested: requested or "namespace",
                            save=saved)  # fmt: skip
    events = SimpleNamespace(tell=lambda kind, session, reason=None: None)
    pausing = Pausing(SimpleNamespace(placement=engine), state, None, None, save, 30.0,  # type: ignore[arg-type]
                      events, None, None, 300.0)  # type: ignore[arg-type]  # fmt: skip
    return pausing, session, engine


async def called(session: Session) -> list[dict]:
    """The stdio server's echo called as a kernel's call reaches it: its answer's content."""
    _, connection = session.tools.tools["echo"]  # type: ignore[union-attr]
    return (await connection.call("echo", {}, 5.0))["content"]


def test_a_frozen_sessions_stdio_servers_are_frozen_with_it_and_thawed_on_resume():
    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        assert list(engine.running) == ["tool-1"]
        await pausing.pause(session, None)
        assert session.frozen and engine.frozen == {KERNEL, "tool-1"}
        await pausing.resume(session)
        assert engine.frozen == set() and list(engine.running) == ["tool-1"]
        assert await called(session) == [{"type": "text", "text": "tool-1"}]

    run(test)


def test_a_deep_pause_removes_the_stdio_servers_and_the_next_call_starts_them_again():
    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, "namespace")
        assert session.state == "paused" and session.kernel.stopped  # type: ignore[union-attr]
        assert engine.running == {}
        session.state = "idle"  # resumed (into another sandbox: the servers have none)
        assert await called(session) == [{"type": "text", "text": "tool-2"}]
        assert list(engine.running) == ["tool-2"]

    run(test)


def test_a_frozen_session_saved_to_disk_removes_its_frozen_stdio_servers():
    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, None)
        await pausing.deepen(session)
        assert session.state == "paused" and not session.frozen
        assert engine.running == {} and engine.frozen == set()

    run(test)


def test_a_stdio_server_the_engine_cannot_freeze_is_removed_and_the_pause_goes_on(caplog):
    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        engine.failing.add("tool-1")
        with caplog.at_level(logging.WARNING):
            await pausing.pause(session, None)
        assert session.frozen and engine.frozen == {KERNEL} and engine.running == {}
        assert "cgroup freezer is unavailable" in caplog.text
        await pausing.resume(session)
        assert await called(session) == [{"type": "text", "text": "tool-2"}]

    run(test)


def test_a_paused_session_given_tools_again_starts_no_server_till_a_call():
    """A restarted gateway gives a paused session its tools back (``restore``), as a PUT of
    its tools does: each server is reached to list its tools, then ended, not left running."""

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, None)
        await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}])
        assert engine.started == 2 and engine.running == {}
        assert [t["name"] for t in session.tools.to_json()["tools"]] == ["echo"]  # type: ignore[union-attr]
        await pausing.resume(session)
        assert await called(session) == [{"type": "text", "text": "tool-3"}]

    run(test)
