"""A paused session's stdio tool servers stop costing: frozen with its sandbox, removed
with it on a deep pause, and started again by the next call after its resume.

A real ``SessionTools`` and ``Pausing`` over a real ``Session``; the engine is a stand-in
at the placement (``Engine``: start_tool_server, freeze, thaw), each server a scripted
MCP process in its sandbox (``Process``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from types import SimpleNamespace

import docker.errors
from test_session_tools import AGENT, World, run

from gateway.limits import Limits
from gateway.sessions.model import Session, public_view
from gateway.sessions.pausing import Pausing
from gateway.sessions.state import SavedState
from gateway.sessions.tools import SessionTools
from gateway.tools.mcp_servers import ToolFailed

KERNEL = "kernel-container"


class Process:
    """A stdio MCP server in its sandbox: answers initialize, tools/list and tools/call."""

    def __init__(self, engine: Engine, sandbox_id: str, listed: bool = True) -> None:
        self.engine, self.sandbox_id, self.listed = engine, sandbox_id, listed
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
                                      "annotations": {"readOnlyHint": True}}][: self.listed]},
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
        sandbox_id = f"tool-{self.started}"
        process = self.running[sandbox_id] = Process(self, sandbox_id, listed=name != "quiet")
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
        self.silent: list[str] = []

    async def run_silently(self, code: str) -> None:
        self.silent.append(code)

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
    session.state, session.language_info = "idle", {"name": "python"}
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


def test_a_deep_paused_session_given_tools_starts_no_server_till_a_call():
    """A PUT of its tools reaches each server to list its tools, then ends it."""

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, "namespace")
        await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}])
        assert engine.started == 2 and engine.running == {}
        assert [t["name"] for t in session.tools.to_json()["tools"]] == ["echo"]  # type: ignore[union-attr]
        session.state, session.paused = "idle", None  # resumed
        assert await called(session) == [{"type": "text", "text": "tool-3"}]

    run(test)


def test_a_server_given_to_a_frozen_session_is_frozen_with_it_and_thawed_on_resume():
    """It was ended, the view saying ``stopped`` beside servers ``frozen`` with the session."""

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, None)
        quiet = {"name": "quiet", "command": ["quiet"]}
        await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}, quiet])
        assert containers(session) == ["frozen", "frozen"]
        assert set(engine.running) == {"tool-2", "tool-3"} <= engine.frozen
        await pausing.resume(session)
        assert containers(session) == ["running", "running"]
        assert not engine.frozen & set(engine.running)
        assert await called(session) == [{"type": "text", "text": "tool-2"}]

    run(test)


async def restarted(w: World, session: Session) -> Session:
    """The gateway restarted: its tools stopped with it, the session taken back from its
    record (as the store keeps it, its kernel adopted) and given its tools (``restore``)."""
    old = w.tools
    await old.stop()
    back = Session.from_record(json.loads(json.dumps(session.record())))
    back.kernel = session.kernel
    w.manager.sessions["s1"] = back  # type: ignore[assignment]
    w.tools = SessionTools(w.manager, old.gate, old.secrets, old.ceiling, old.guard, old.connect)  # type: ignore[arg-type]
    await w.tools.restore()
    return back


def test_a_restart_starts_no_stdio_server_of_a_frozen_session_and_its_resume_does():
    """Its tools come from its record; they were listed by starting each server, then
    ending it, for every paused session at every start."""

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, None)
        back = await restarted(w, session)
        assert engine.started == 1 and engine.running == {}
        assert [t["name"] for t in back.tools.to_json()["tools"]] == ["echo"]  # type: ignore[union-attr]
        assert containers(back) == ["stopped"]
        assert [t["name"] for t in back.tools.listing()] == ["echo"]  # type: ignore[union-attr]
        await pausing.resume(back)
        assert await called(back) == [{"type": "text", "text": "tool-2"}]

    run(test)


def test_a_restart_starts_no_stdio_server_of_a_deep_paused_session_till_a_call():
    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, "namespace")
        back = await restarted(w, session)
        assert engine.started == 1 and engine.running == {}
        assert [t["name"] for t in back.tools.to_json()["tools"]] == ["echo"]  # type: ignore[union-attr]
        back.state, back.paused = "idle", None  # resumed
        assert await called(back) == [{"type": "text", "text": "tool-2"}]

    run(test)


def test_a_restart_starts_an_idle_sessions_stdio_servers_as_before():
    async def test(w: World):
        _, session, engine = await paused_world(w)
        back = await restarted(w, session)
        assert engine.started == 2 and list(engine.running) == ["tool-2"]
        assert containers(back) == ["running"]

    run(test)


def waking(w: World, session: Session | None = None) -> list[str]:
    """The ids the manager is asked to wake; ``session``, if given, then is resumed (deep:
    a new sandbox)."""
    woken: list[str] = []

    async def wake(session_id, who) -> None:
        woken.append(session_id)
        if session is not None:
            session.state, session.paused = "idle", None

    w.manager.wake = wake
    return woken


def test_a_call_over_the_mcp_url_resumes_a_paused_session_first():
    """As traffic to a paused sandbox does: its server never runs again for a session that
    stays paused (deep), nor waits out the call's timeout frozen."""
    from test_tools_over_mcp import Store

    async def test(w: World):
        pausing, session, _ = await paused_world(w)
        w.manager.store = Store()
        woken = waking(w, session)
        await pausing.pause(session, "namespace")
        answer = await w.tools.call_over_mcp("s1", AGENT, "echo", {})
        assert woken == ["s1"] and answer["result"] == "tool-2"
        await w.tools.call_over_mcp("s1", AGENT, "echo", {})
        assert woken == ["s1"]

    run(test)


def containers(session) -> list[str]:
    """Where the session's view says each stdio server's container is."""
    return [s["container"] for s in session.tools.to_json()["stdio"]]


def test_a_server_listing_no_tools_is_paused_and_ended_with_the_others():
    """It is connected all the same: its container ran on through pauses and the end."""

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        quiet = {"name": "quiet", "command": ["quiet"]}
        await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}, quiet])
        assert sorted(engine.running) == ["tool-2", "tool-3"]
        await pausing.pause(session, None)
        assert engine.frozen == {KERNEL, "tool-2", "tool-3"}
        assert containers(session) == ["frozen", "frozen"]
        await pausing.deepen(session)
        assert engine.running == {}
        assert containers(session) == ["stopped", "stopped"]

    run(test)


def test_the_view_says_each_stdio_servers_container_runs_and_the_end_removes_them_all():
    async def test(w: World):
        _, session, engine = await paused_world(w)
        quiet = {"name": "quiet", "command": ["quiet"]}
        await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}, quiet])
        assert containers(session) == ["running", "running"]
        await w.tools.close("s1")  # the session ended
        assert engine.running == {}

    run(test)


def test_the_kernel_a_deep_resume_starts_is_given_sbx_tools_again():
    """The same Kernel, neither restarted: the module went with the process it was put in."""

    async def test(w: World):
        pausing, session, _ = await paused_world(w)
        kernel = session.kernel
        await w.tools.ready(session, kernel)  # type: ignore[arg-type]
        await pausing.pause(session, None)
        await pausing.resume(session)
        await w.tools.ready(session, kernel)  # type: ignore[arg-type]
        assert len(kernel.silent) == 1  # type: ignore[union-attr]  # frozen: it kept it
        await pausing.pause(session, "namespace")
        session.state = "idle"  # resumed
        await w.tools.ready(session, kernel)  # type: ignore[arg-type]
        assert len(kernel.silent) == 2  # type: ignore[union-attr]

    run(test)


def test_a_session_resumed_deep_into_a_pooled_sandbox_has_its_tool_socket_served_again():
    """The pooled sandbox's directory takes the session's place (the same path): the socket
    went with the old one, and the next execute found none (FileNotFoundError in sbx_tools)."""

    async def test(w: World):
        pausing, session, _ = await paused_world(w)
        socket = session.kernel.sandbox.run_dir / "tools.sock"  # type: ignore[union-attr]
        assert socket.is_socket()
        await pausing.pause(session, "namespace")
        socket.unlink()  # the directories exchanged (``Placement.move_in``)
        session.state = "idle"  # resumed
        await w.tools.ready(session, session.kernel)  # type: ignore[arg-type]
        assert socket.is_socket()

    run(test)


def test_a_server_still_starting_when_its_session_freezes_is_not_left_running():
    """A call (over the MCP URL, or the kernel's just before) that starts a server races the
    pause: the freeze found no sandbox yet, and the server then ran on, unfrozen, for as
    long as its session stayed paused."""

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, "namespace")  # the server ended with the kernel
        session.state, session.paused = "idle", None  # resumed, its server not yet started
        gate, entered = asyncio.Event(), asyncio.Event()
        start = engine.start_tool_server

        async def slow_start(*args) -> Process:
            entered.set()
            await gate.wait()  # the container is being made
            return await start(*args)

        engine.start_tool_server = slow_start  # type: ignore[method-assign]
        call = asyncio.ensure_future(called(session))
        await entered.wait()
        await pausing.pause(session, None)  # frozen meanwhile
        gate.set()
        try:
            await call
        except Exception as e:  # the call may fail: its session is paused
            assert "paused" in str(e), e
        assert set(engine.running) <= engine.frozen, (engine.running, engine.frozen)

    run(test)


def test_a_server_still_starting_when_its_session_pauses_deep_is_not_left_running():
    """The same race with a deep pause: the call (over the MCP URL, woken before the pause)
    reached its server again once the pause had ended it, and the server ran for as long
    as the session stayed paused, its kernel gone."""

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        await pausing.pause(session, "namespace")
        session.state, session.paused = "idle", None  # resumed, its server not yet started
        gate, entered = asyncio.Event(), asyncio.Event()
        start = engine.start_tool_server

        async def slow_start(*args) -> Process:
            entered.set()
            await gate.wait()
            return await start(*args)

        engine.start_tool_server = slow_start  # type: ignore[method-assign]
        call = asyncio.ensure_future(called(session))
        await entered.wait()
        pause = asyncio.ensure_future(pausing.pause(session, "namespace"))
        await asyncio.sleep(0.1)
        gate.set()
        await pause
        late = asyncio.ensure_future(called(session))  # a call the pause did not wait for
        for done in (call, late):
            with contextlib.suppress(ToolFailed):  # it may fail: its session paused
                await done
        assert session.state == "paused" and engine.running == {}, engine.running

    run(test)


def test_a_listing_past_the_bound_is_not_kept_and_a_restart_lists_it_by_starting_the_server(
    monkeypatch,
):
    """The record keeps a bounded listing (it is saved with every change of the session)."""
    from gateway.sessions import tools as tools_module

    async def test(w: World):
        pausing, session, engine = await paused_world(w)
        assert session.tool_listing == {"notes": [session.tools.servers[0].tools[0]]}  # type: ignore[union-attr]
        assert "tool_listing" not in public_view(session.record())
        monkeypatch.setattr(tools_module, "MAX_KEPT_LISTING", 64)
        await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}])
        assert session.tool_listing is None
        await pausing.pause(session, "namespace")
        back = await restarted(w, session)
        assert engine.started == 3 and engine.running == {}
        assert [t["name"] for t in back.tools.listing()] == ["echo"]  # type: ignore[union-attr]

    run(test)
