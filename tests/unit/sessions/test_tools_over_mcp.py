"""A call through the sandbox's MCP URL (``SessionTools.call_over_mcp``): the kernel's gate and
limits, a recorded turn of its own, and nothing of a running execute's (its turn, its client
tools, its approvals)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from test_session_tools import AGENT, CLIENT_TOOLS, ClientSide, FakeServer, Recorder, World, run

from gateway.tools.endpoint import CallRefused


class Store:
    """The history's stand-in: each execution's row as started and as finished."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.rows: dict[int, dict] = {}

    def start_execution(self, session_id: str, record: dict):
        execution_id = next(self.ids)
        self.rows[execution_id] = dict(record)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return execution_id, done

    def finish_execution(self, execution_id: int, record: dict):
        self.rows[execution_id].update(record)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def test_an_mcp_call_is_judged_and_recorded_as_a_tool_execution_of_its_own():
    async def test(w: World):
        w.manager.store = store = Store()
        await w.give(rules={"drop": "deny"})
        answer = await w.tools.call_over_mcp("s1", AGENT, "query", {"sql": "SELECT 1"})
        assert answer["result"] == {"name": "query", "arguments": {"sql": "SELECT 1"}}
        with pytest.raises(CallRefused, match="the policy refuses drop"):
            await w.tools.call_over_mcp("s1", AGENT, "drop", {})
        first, second = store.rows[1], store.rows[2]
        assert first["review"]["kind"] == "tool" and first["status"] == "ok"
        assert [c["tool"] for c in first["review"]["tools"]] == ["query"]
        assert second["status"] == "error" and second["review"]["tools"][0]["status"] == "denied"
        assert [c[0] for c in FakeServer.made[0].calls] == ["query"]  # drop never reached it
        assert [e[2] for e in w.audited] == ["ok", "denied"]

    run(test)


def test_an_mcp_call_during_an_execute_takes_nothing_of_its_turn():
    async def test(w: World):
        w.manager.store = Store()
        await w.give()
        recorder, client = Recorder(), ClientSide()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel, CLIENT_TOOLS, client):
            turn = w.session.tools.turn
            with pytest.raises(CallRefused, match="no tool 'notify'"):  # the agent's own tools
                await w.tools.call_over_mcp("s1", AGENT, "notify", {})
            assert [t["name"] for t in w.tools.mcp_listing("s1")] == ["query", "drop", "unsaid"]
            await w.tools.call_over_mcp("s1", AGENT, "query", {})
            assert w.session.tools.turn is turn and turn.calls == 0 and recorder.tool_calls == []
            await w.tools.call("s1", "notify", {})  # the execute's calls still go through
        assert client.calls == [("notify", {})]

    run(test)


def test_arguments_nested_past_the_sockets_bound_are_refused_over_mcp_too():
    async def test(w: World):
        w.manager.store = Store()
        await w.give()
        deep: dict = {}
        for _ in range(100):
            deep = {"a": deep}
        with pytest.raises(CallRefused, match="nested deeper than 64"):
            await w.tools.call_over_mcp("s1", AGENT, "query", deep)
        assert FakeServer.made[0].calls == []

    run(test)


def test_a_call_over_the_mcp_url_that_can_only_be_refused_leaves_a_paused_session_paused():
    """Its tool's name, its arguments and the gate's verdict come first: a call naming no
    tool of the session, nested past the bound, or denied resumed the session to be refused."""
    from test_tool_servers_paused import paused_world, waking

    async def test(w: World):
        pausing, session, _ = await paused_world(w)
        w.manager.store = Store()
        woken = waking(w)
        await pausing.pause(session, "namespace")
        deep: dict = {}
        for _ in range(100):
            deep = {"a": deep}
        with pytest.raises(CallRefused, match="no tool 'nope'"):
            await w.tools.call_over_mcp("s1", AGENT, "nope", {})
        with pytest.raises(CallRefused, match="nested deeper than 64"):
            await w.tools.call_over_mcp("s1", AGENT, "echo", deep)
        await w.give(mcp=[], stdio=[{"name": "notes", "command": ["notes"]}],
                     rules={"echo": "deny"})  # fmt: skip
        with pytest.raises(CallRefused, match="refuses echo"):  # recorded as the gate's
            await w.tools.call_over_mcp("s1", AGENT, "echo", {})
        assert woken == [] and session.state == "paused"

    run(test)
