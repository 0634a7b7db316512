"""A Jupyter client's cells and tools: Executions opens a relayed cell's window for tool calls
(``cell_started``, busy for it) and closes it (``cell_ended``, idle for it)."""

from __future__ import annotations

import asyncio
import types

import pytest
from test_session_tools import AGENT, APPROVER, World, run

from gateway.access.auth import Principal
from gateway.sessions.executions import ExecutionLimits, Executions
from gateway.tools.endpoint import CallRefused


class Store:
    def start_execution(self, session_id: str, record: dict) -> tuple[str, asyncio.Future]:
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return "e1", done


class Gate:
    """Allows every cell: the code's own gate is not what these tests judge."""

    async def review(self, *args, **kwargs) -> types.SimpleNamespace:
        return types.SimpleNamespace(action="allow", to_json=lambda: {"action": "allow"})


def executions(w: World) -> Executions:
    session = w.session
    session.limits = types.SimpleNamespace(output_bytes=1 << 20)
    session.output_bytes, session.running, session.held_for = 0, set(), None
    session.kernel.interrupts = 0
    limits = ExecutionLimits(1 << 20, 60.0, 1.0, 1 << 30)
    none = None
    return Executions(none, Gate(), Store(), none, none, none, none, limits, w.tools)  # type: ignore[arg-type]


async def refused(w: World) -> str:
    with pytest.raises(CallRefused) as e:
        await w.tools.call("s1", "query", {})
    return e.value.message


def test_a_relayed_cells_calls_are_taken_from_busy_to_idle_and_recorded_on_it():
    async def test(w: World):
        await w.give()
        pipeline = executions(w)
        admitted = await pipeline.admit(w.session, AGENT, {"code": "1", "user_expressions": {}})
        assert "sbx_tools" in w.session.kernel.silent[0]  # readied before it is sent
        assert "outside" in await refused(w)  # sent, not yet running: a cell before it may be
        pipeline.cell_started(w.session, admitted)
        assert (await w.tools.call("s1", "query", {}))["result"]["name"] == "query"
        pipeline.cell_ended(w.session, admitted)
        assert "outside" in await refused(w)
        assert [c["tool"] for c in admitted.recorder.tool_calls] == ["query"]

    run(test)


def test_a_silent_execute_opens_no_window_its_calls_would_be_on_no_notebook():
    async def test(w: World):
        await w.give()
        pipeline = executions(w)
        admitted = await pipeline.admit(w.session, AGENT, {"code": "1", "silent": True})
        pipeline.cell_started(w.session, admitted)
        assert "outside" in await refused(w)
        pipeline.cell_ended(w.session, admitted)

    run(test)


def test_a_relayed_cells_held_call_waits_for_another_approver_as_an_executes_does():
    async def test(w: World):
        await w.give()
        pipeline = executions(w)
        clients_token = Principal(tenant="t1", token_id="lab-user", approver=True)
        admitted = await pipeline.admit(w.session, clients_token, {"code": "drop()"})
        pipeline.cell_started(w.session, admitted)
        call = asyncio.ensure_future(w.tools.call("s1", "drop", {}))
        (approval,) = await w.pending()
        with pytest.raises(Exception, match="cannot decide on an execute it asked for"):
            await w.desk.decide(approval.id, clients_token, True, None)
        await w.desk.decide(approval.id, APPROVER, True, "fine")
        assert (await call)["result"]["name"] == "drop"
        pipeline.cell_ended(w.session, admitted)
        (entry,) = admitted.recorder.tool_calls
        assert entry["decision"] == "hold" and entry["status"] == "ok"

    run(test)


def test_a_call_that_comes_before_the_gateway_reads_its_cell_began_waits_for_its_window():
    """The kernel's busy and the code's first call come on different sockets: the call may
    be read first, and is then taken in the window once it opens, not refused."""

    async def test(w: World):
        await w.give()
        pipeline = executions(w)
        admitted = await pipeline.admit(w.session, AGENT, {"code": "query()"})
        call = asyncio.ensure_future(w.tools.call("s1", "query", {}))
        await asyncio.sleep(0.05)
        pipeline.cell_started(w.session, admitted)
        assert (await call)["result"]["name"] == "query"
        pipeline.cell_ended(w.session, admitted)
        assert [c["tool"] for c in admitted.recorder.tool_calls] == ["query"]
        assert "outside" in await refused(w)  # none coming now: refused at once

    run(test)
