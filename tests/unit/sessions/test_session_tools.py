"""Tool calls from a session's code: each judged, held, bounded and recorded (``SessionTools``).

A real ``SessionTools`` with the real gate's ``review_tool`` and a real
``ApprovalDesk`` (over a store that keeps approvals in a dict), its socket
served in a temporary run directory; the session, its kernel and the MCP
servers are stand-ins at the boundary (``FakeServer`` answers as an MCP
connection does).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from gateway.access.auth import Principal
from gateway.egress.policy import AddressGuard
from gateway.masking import NO_SECRETS, Masker
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.sessions import tools as tools_module
from gateway.sessions.tools import SessionTools, ToolServerFailed
from gateway.tools.endpoint import CallRefused
from gateway.tools.mcp_servers import ToolFailed
from gateway.tools.specs import CallLimits, McpServer, parse_tools

AGENT = Principal(tenant="t1", token_id="agent")
APPROVER = Principal(tenant="t1", token_id="person", approver=True)
LISTED = [
    {"name": "query", "description": "Read.", "input_schema": {"type": "object"},
     "annotations": {"readOnlyHint": True}},
    {"name": "drop", "description": "Delete.", "input_schema": {"type": "object"},
     "annotations": {"destructiveHint": True}},
    {"name": "unsaid", "description": "Says nothing.", "input_schema": {"type": "object"},
     "annotations": {}},
]  # fmt: skip


class FakeServer:
    """An MCP connection's stand-in: lists LISTED, answers each call as ``answer`` says."""

    made: list[FakeServer] = []

    def __init__(self, server: McpServer, headers: dict[str, str], max_bytes: int, refusal) -> None:
        self.server, self.headers, self.calls, self.closed = server, headers, [], False
        self.answer = lambda name, arguments: {
            "content": [{"type": "text", "text": "x"}],
            "structured": {"result": {"name": name, "arguments": arguments}},
            "is_error": False,
        }
        self.gate: asyncio.Event | None = None
        FakeServer.made.append(self)

    async def open(self) -> list[dict[str, Any]]:
        if "slow" in self.server.url:
            await asyncio.sleep(0.3)
        if "down" in self.server.url:
            raise ToolFailed("All connection attempts failed")
        return LISTED

    async def call(self, name: str, arguments: dict, timeout: float) -> dict[str, Any]:
        self.calls.append((name, arguments))
        if self.gate is not None:
            await self.gate.wait()
        return self.answer(name, arguments)

    async def close(self) -> None:
        self.closed = True


class FakeKernel:
    def __init__(self, run_dir: Path) -> None:
        self.sandbox = type("Spec", (), {"run_dir": run_dir})()
        self.died = asyncio.Event()
        self.restarts = 0
        self.silent: list[str] = []

    async def run_silently(self, code: str) -> None:
        self.silent.append(code)


class FakeSession:
    def __init__(self, run_dir: Path) -> None:
        self.id, self.tenant, self.policy = "s1", "t1", None
        self.kernel = FakeKernel(run_dir)
        self.language = "python"
        self.state = "idle"
        self.masker = NO_SECRETS
        self.on_end: set = set()
        self.tools = None
        self.tool_config = None


class FakeManager:
    def __init__(self, session: FakeSession) -> None:
        self.sessions = {session.id: session}
        self.created = 0

    def get(self, session_id: str, who: Principal) -> FakeSession:
        return self.sessions[session_id]

    async def create(self, request, who) -> FakeSession:
        self.created += 1
        return self.sessions["s1"]

    def spawn(self, coro):
        return asyncio.ensure_future(coro)

    def save_soon(self, session) -> None:
        self.saved = session.tool_config


class ApprovalStore:
    def __init__(self) -> None:
        self.docs: dict[str, dict] = {}

    async def save_approval(self, doc: dict) -> None:
        self.docs[doc["id"]] = doc


class Recorder:
    def __init__(self) -> None:
        self.tool_calls: list[dict] = []


class Secrets:
    async def unseal(self, tenant: str, names: tuple[str, ...], strict: bool = True) -> dict:
        return {name: "s3cret-value-0042" for name in names}


class World:
    def __init__(self, run_dir: Path, policies: str = "") -> None:
        self.session = FakeSession(run_dir)
        self.manager = FakeManager(self.session)
        self.desk = ApprovalDesk(ApprovalStore(), timeout=5, live=lambda sid: True)
        self.tools = SessionTools(
            self.manager,
            Gate(self.book(run_dir.parent, policies), None, self.desk),
            Secrets(),
            CallLimits(),
            AddressGuard([], set()),
            FakeServer,
        )
        self.audited: list[tuple] = []
        self.tools.on_call = lambda *event: self.audited.append(event)

    @staticmethod
    def book(directory: Path, policy: str) -> PolicyBook:
        """Tenant t1's policy (none: the built-in one, report mode)."""
        (directory / "policies").mkdir()
        if policy:
            (directory / "policies" / "t1.toml").write_text(policy)
        book = PolicyBook(directory / "policies")
        book.load()
        return book

    async def give(self, **config: Any) -> None:
        body = {"mcp": [{"url": "http://127.0.0.1:9/mcp", "name": "wh"}], **config}
        await self.tools.give("s1", AGENT, parse_tools(body))

    async def pending(self, count: int = 1) -> list:
        for _ in range(200):
            if len(self.desk.pending) >= count:
                return list(self.desk.pending.values())
            await asyncio.sleep(0.01)
        raise AssertionError("no approval was requested")


def run(test, policies: str = ""):
    directory = Path(tempfile.mkdtemp(prefix="t38", dir="/tmp"))
    (directory / "run").mkdir()
    FakeServer.made.clear()

    async def main():
        world = World(directory / "run", policies)
        try:
            await test(world)
        finally:
            await world.tools.stop()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_tools_are_listed_with_actions_from_their_annotations_and_rules():
    async def test(w: World):
        await w.give(rules={"unsaid": "allow"})
        view = w.session.tools.to_json()
        actions = {t["name"]: t["action"] for t in view["tools"]}
        assert actions == {"query": "allow", "drop": "hold", "unsaid": "allow"}
        assert view["mcp"] == [{"name": "wh", "url": "http://127.0.0.1:9/mcp", "headers": []}]
        assert (w.session.kernel.sandbox.run_dir / "tools.sock").is_socket()

    run(test)


def test_a_tool_without_annotations_is_held_as_mcp_counts_it_destructive():
    async def test(w: World):
        await w.give()
        assert {t["name"]: t["action"] for t in w.tools.view("s1", AGENT)["tools"]}[
            "unsaid"
        ] == "hold"

    run(test)


def test_a_call_outside_a_running_execute_is_refused():
    async def test(w: World):
        await w.give()
        with pytest.raises(CallRefused) as refused:
            await w.tools.call("s1", "query", {})
        assert refused.value.status == 409 and "outside" in refused.value.message
        assert FakeServer.made[0].calls == []

    run(test)


def test_a_call_is_made_recorded_and_audited_within_an_execute():
    async def test(w: World):
        await w.give()
        recorder = Recorder()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel):
            answer = await w.tools.call("s1", "query", {"sql": "SELECT 1"})
        assert answer["result"] == {"name": "query", "arguments": {"sql": "SELECT 1"}}
        (entry,) = recorder.tool_calls
        assert entry["tool"] == "query" and entry["status"] == "ok"
        assert entry["decision"] == "allow" and entry["bytes"] > 0 and entry["duration_ms"] >= 0
        assert json.loads(entry["arguments"]) == {"sql": "SELECT 1"}
        assert w.audited[0][:3] == ("s1", AGENT, "ok")
        assert "sbx_tools" in w.session.kernel.silent[0]  # put in the kernel before its code

    run(test)


def test_the_module_is_put_in_the_kernel_once_and_again_after_a_restart():
    async def test(w: World):
        await w.give()
        for _ in range(2):
            async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
                pass
        assert len(w.session.kernel.silent) == 1
        w.session.kernel.restarts += 1
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            pass
        assert len(w.session.kernel.silent) == 2

    run(test)


def test_a_tool_not_given_and_a_denied_tool_are_refused():
    async def test(w: World):
        await w.give(rules={"query": "deny"})
        recorder = Recorder()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel):
            with pytest.raises(CallRefused) as unknown:
                await w.tools.call("s1", "rm_rf", {})
            with pytest.raises(CallRefused) as denied:
                await w.tools.call("s1", "query", {})
        assert unknown.value.status == 404 and "no tool 'rm_rf'" in unknown.value.message
        assert denied.value.status == 403 and "refuses query" in denied.value.message
        assert FakeServer.made[0].calls == []
        assert [e["status"] for e in recorder.tool_calls] == ["denied"]

    run(test)


def test_one_approval_covers_the_next_calls_of_its_tool_in_that_execute_only():
    async def test(w: World):
        await w.give(rules={"drop": {"action": "hold", "approval_covers": 3}})
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            first = asyncio.ensure_future(w.tools.call("s1", "drop", {"n": 0}))
            (approval,) = await w.pending()
            assert "covers the next 3 calls" in approval.code
            # calls made while it is pending wait for it instead of asking again
            waiting = [asyncio.ensure_future(w.tools.call("s1", "drop", {"n": n})) for n in (1, 2)]
            await asyncio.sleep(0.05)
            assert len(w.desk.pending) == 1
            await w.desk.decide(approval.id, APPROVER, True, "fine")
            await asyncio.gather(first, *waiting)
            fourth = asyncio.ensure_future(w.tools.call("s1", "drop", {"n": 3}))
            (again,) = await w.pending()  # the fourth asks again
            await w.desk.decide(again.id, APPROVER, False, "enough")
            with pytest.raises(CallRefused, match="denied: enough"):
                await fourth
        assert len(FakeServer.made[0].calls) == 3
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            nxt = asyncio.ensure_future(w.tools.call("s1", "drop", {}))
            (third,) = await w.pending()  # a new execute: nothing carried over
            await w.desk.decide(third.id, APPROVER, True, None)
            await nxt

    run(test)


def test_the_agent_cannot_approve_its_own_tool_call():
    async def test(w: World):
        await w.give()
        agent_approver = Principal(tenant="t1", token_id="agent", approver=True)
        async with w.tools.turn(w.session, agent_approver, Recorder(), w.session.kernel):
            call = asyncio.ensure_future(w.tools.call("s1", "drop", {}))
            (approval,) = await w.pending()
            with pytest.raises(Exception, match="cannot decide on an execute it asked for"):
                await w.desk.decide(approval.id, agent_approver, True, None)
            call.cancel()

    run(test)


def test_calls_past_calls_per_execute_are_refused():
    async def test(w: World):
        await w.give(limits={"calls_per_execute": 3})
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            for _ in range(3):
                await w.tools.call("s1", "query", {})
            with pytest.raises(CallRefused, match="more than 3 tool calls") as refused:
                await w.tools.call("s1", "query", {})
        assert refused.value.status == 429

    run(test)


def test_a_huge_answer_is_refused_not_passed_on():
    async def test(w: World):
        await w.give(limits={"result_bytes": 1000})
        FakeServer.made[0].answer = lambda n, a: {
            "content": [{"type": "text", "text": "x" * 5000}], "structured": None,
            "is_error": False,
        }  # fmt: skip
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            with pytest.raises(CallRefused, match="over the 1000 of result_bytes"):
                await w.tools.call("s1", "query", {})

    run(test)


def test_a_call_held_open_past_its_execute_is_cut_when_the_execute_ends():
    async def test(w: World):
        await w.give()
        FakeServer.made[0].gate = asyncio.Event()  # answers never
        recorder = Recorder()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel):
            call = asyncio.ensure_future(w.tools.call("s1", "query", {}))
            await asyncio.sleep(0.05)
        with pytest.raises(CallRefused, match="ended before it was answered") as cut:
            await call
        assert cut.value.status == 409
        assert recorder.tool_calls[0]["status"] == "execute_ended"
        with pytest.raises(CallRefused, match="outside"):
            await w.tools.call("s1", "query", {})  # and no later one is taken

    run(test)


def test_a_tools_error_and_a_failed_server_reach_the_kernel_as_clear_errors():
    async def test(w: World):
        await w.give()
        server = FakeServer.made[0]
        server.answer = lambda n, a: {
            "content": [{"type": "text", "text": "no such table: nope"}], "structured": None,
            "is_error": True,
        }  # fmt: skip
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            with pytest.raises(CallRefused, match="query failed: no such table") as failed:
                await w.tools.call("s1", "query", {})
            assert failed.value.status == 502

            async def crashed(name, arguments, timeout):
                raise ToolFailed("MCP server wh went away (connection reset)")

            server.call = crashed
            with pytest.raises(CallRefused, match="went away") as gone:
                await w.tools.call("s1", "query", {})
            assert gone.value.status == 502

    run(test)


def test_header_secrets_are_sent_to_the_server_but_never_shown_or_passed_to_the_sandbox():
    async def test(w: World):
        headers = {"Authorization": {"secret": "WH_TOKEN", "prefix": "Bearer "}}
        await w.tools.give("s1", AGENT, parse_tools(
            {"mcp": [{"url": "http://127.0.0.1:9/mcp", "name": "wh", "headers": headers}]}
        ))  # fmt: skip
        server = FakeServer.made[0]
        assert server.headers == {"Authorization": "Bearer s3cret-value-0042"}
        assert "s3cret" not in json.dumps(w.session.tools.to_json())
        server.answer = lambda n, a: {  # a server that echoes what it was sent
            "content": [{"type": "text", "text": "you sent Bearer s3cret-value-0042"}],
            "structured": None, "is_error": False,
        }  # fmt: skip
        recorder = Recorder()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel):
            answer = await w.tools.call("s1", "query", {"echo": "s3cret-value-0042"})
        assert "s3cret" not in json.dumps(answer)
        assert "s3cret" not in json.dumps(recorder.tool_calls)

    run(test)


def test_a_server_that_does_not_answer_fails_the_create_before_a_sandbox_is_made():
    async def test(w: World):
        from gateway.sessions.requests import CreateSession

        request = CreateSession.from_json({"tools": {"mcp": [{"url": "http://down.example/mcp"}]}})
        with pytest.raises(ToolServerFailed, match="did not answer"):
            await w.tools.create(request, AGENT)
        assert w.manager.created == 0

    run(test)


def test_putting_new_tools_closes_the_old_servers_and_keeps_the_socket():
    async def test(w: World):
        await w.give()
        first = FakeServer.made[0]
        await w.tools.give("s1", AGENT, parse_tools({}))
        assert first.closed and w.session.tools.to_json()["tools"] == []
        assert (w.session.kernel.sandbox.run_dir / "tools.sock").is_socket()

    run(test)


def test_many_concurrent_calls_run_at_most_concurrent_at_once():
    async def test(w: World):
        await w.give(limits={"concurrent": 2})
        server = FakeServer.made[0]
        running, most = 0, 0
        release = asyncio.Event()

        async def counted(name, arguments, timeout):
            nonlocal running, most
            running += 1
            most = max(most, running)
            await release.wait()
            running -= 1
            return {"content": [], "structured": {"ok": 1}, "is_error": False}

        server.call = counted
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            calls = [asyncio.ensure_future(w.tools.call("s1", "query", {})) for _ in range(6)]
            await asyncio.sleep(0.05)
            release.set()
            await asyncio.gather(*calls)
        assert most == 2

    run(test)


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"name": "s", "command": "npx server"}, "an argv"),  # a shell string
        ({"name": "s", "command": []}, "an argv"),
        ({"name": "s", "command": ["python", "a\0b"]}, "an argv"),
        ({"name": "s", "command": ["x" * 70_000]}, "bytes in all"),
        ({"name": "s", "command": ["x"], "args": ["server"]}, "an object of name, command"),
        ({"name": "s", "command": ["x"], "image": "../../evil"}, "names a kernel"),
        ({"name": "s", "command": ["x"], "image": "python3", "template": "t"}, "not both"),
        ({"name": "s", "command": ["x"], "env": {"A B": "1"}}, "not a variable name"),
        ({"name": "s", "command": ["x"], "env": {"A": "line\nbreak"}}, "printable ASCII"),
        ({"name": "a b", "command": ["x"]}, ".name must be"),
    ],
)
def test_a_stdio_server_is_read_strictly(entry, said):
    from gateway.errors import BadRequest

    with pytest.raises(BadRequest, match=said):
        parse_tools({"stdio": [entry]})


def test_stdio_servers_are_bounded_in_number_and_share_names_with_http_ones():
    from gateway.errors import BadRequest

    many = [{"name": f"s{n}", "command": ["x"]} for n in range(5)]
    with pytest.raises(BadRequest, match="at most 4 servers"):
        parse_tools({"stdio": many})
    with pytest.raises(BadRequest, match="a name of its own"):
        parse_tools({"mcp": [{"url": "http://a/mcp", "name": "s0"}], "stdio": many[:1]})
    given = parse_tools({"stdio": [{"name": "s", "command": ["python", "-c", "1"],
                                    "env": {"TOKEN": "k"}}]})  # fmt: skip
    shown = {"name": "s", "command": ["python", "-c", "1"], "image": None, "template": None,
             "env": ["TOKEN"]}  # fmt: skip
    assert given.stdio[0].to_json() == shown


def test_the_masker_of_a_toolbox_is_built_from_header_secrets(monkeypatch):
    assert Masker({"A": "s3cret-value-0042"}).text("x s3cret-value-0042") == "x ***A***"
    assert tools_module.MAX_RECORDED_ARGUMENTS == 2048


def test_a_second_server_cannot_shadow_a_tool_of_the_first():
    async def test(w: World):
        from gateway.errors import BadRequest

        body = {"mcp": [{"url": "http://127.0.0.1:9/a", "name": "a"},
                        {"url": "http://127.0.0.1:9/b", "name": "b"}]}  # fmt: skip
        with pytest.raises(BadRequest, match=r"query.*listed by both a and b"):
            await w.tools.give("s1", AGENT, parse_tools(body))
        assert all(server.closed for server in FakeServer.made)

    run(test)


def test_tools_whose_names_a_call_cannot_carry_are_left_out():
    async def test(w: World):
        LISTED.append({"name": "bad\nname", "description": "", "input_schema": {},
                       "annotations": {"readOnlyHint": True}})  # fmt: skip
        try:
            await w.give()
        finally:
            LISTED.pop()
        assert "bad\nname" not in {t["name"] for t in w.tools.view("s1", AGENT)["tools"]}

    run(test)


class ClientSide:
    """The agent's process: answers each client tool's call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    async def call(self, name: str, arguments: dict, timeout: float) -> dict:
        self.calls.append((name, arguments))
        return {"content": [], "structured": {"result": f"{name} ok"}, "is_error": False}


CLIENT_TOOLS = ({"name": "notify", "description": "Tell the user.", "input_schema": {},
                 "annotations": {}},)  # fmt: skip


def test_an_executes_client_tools_are_callable_in_that_execute_only_even_without_servers():
    async def test(w: World):
        client = ClientSide()
        recorder = Recorder()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel, CLIENT_TOOLS, client):
            listed = json.loads(await w.tools._listing("s1"))["tools"]
            assert [t["name"] for t in listed] == ["notify"]
            answer = await w.tools.call("s1", "notify", {"text": "hi"})
        assert answer["result"] == "notify ok" and client.calls == [("notify", {"text": "hi"})]
        assert recorder.tool_calls[0]["server"] == "client"
        assert recorder.tool_calls[0]["decision"] == "allow"
        assert (w.session.kernel.sandbox.run_dir / "tools.sock").is_socket()
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            with pytest.raises(CallRefused, match="no tool 'notify'"):
                await w.tools.call("s1", "notify", {})

    run(test)


def test_client_tools_need_the_agent_stream_and_names_of_their_own():
    async def test(w: World):
        from gateway.errors import BadRequest

        with pytest.raises(BadRequest, match="over the agent stream"):
            w.tools.check_client_tools(w.session, CLIENT_TOOLS, answered=False)
        await w.give()
        clash = ({**CLIENT_TOOLS[0], "name": "query"},)
        with pytest.raises(BadRequest, match="query are named as the session's tools"):
            w.tools.check_client_tools(w.session, clash, answered=True)
        w.tools.check_client_tools(w.session, CLIENT_TOOLS, answered=True)

    run(test)


def test_a_session_resumed_in_another_sandbox_gets_its_socket_in_the_new_run_directory():
    async def test(w: World):
        await w.give()
        moved = w.session.kernel.sandbox.run_dir.parent / "moved"
        moved.mkdir()
        w.session.kernel.sandbox.run_dir = moved  # a resume into a pooled sandbox
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            pass
        assert (moved / "tools.sock").is_socket()

    run(test)


def test_the_tenants_policy_holds_a_tool_a_sessions_rule_allows():
    async def test(w: World):
        await w.give(rules={"drop": "allow"})
        recorder = Recorder()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel):
            call = asyncio.ensure_future(w.tools.call("s1", "drop", {}))
            (approval,) = await w.pending()
            assert "the tenant's policy says hold" in approval.decision["reasons"][0]
            await w.desk.decide(approval.id, APPROVER, False, "no")
            with pytest.raises(CallRefused, match="denied: no"):
                await call
        assert recorder.tool_calls[0]["decision"] == "hold"

    run(test, policies='mode = "enforce"\n[tools]\n"dr*" = "hold"\n')


def test_a_restarted_gateway_gives_a_session_the_tools_its_record_kept():
    async def test(w: World):
        headers = {"Authorization": {"secret": "WH_TOKEN", "prefix": "Bearer "}}
        body = {"mcp": [{"url": "http://127.0.0.1:9/mcp", "name": "wh", "headers": headers}],
                "rules": {"query": "deny"}}  # fmt: skip
        await w.tools.give("s1", AGENT, parse_tools(body))
        assert w.manager.saved == body  # in the record: given again after a restart
        record = {"tool_config": w.session.tool_config}
        from gateway.sessions.model import public_view

        assert "tool_config" not in public_view({**record, "env": {}})
        await w.tools.stop()  # the gateway stops; a new one takes the session over
        w.session.tools = None
        FakeServer.made.clear()
        await w.tools.restore()
        assert FakeServer.made[0].headers == {"Authorization": "Bearer s3cret-value-0042"}
        actions = {t["name"]: t["action"] for t in w.tools.view("s1", AGENT)["tools"]}
        assert actions["query"] == "deny"
        assert (w.session.kernel.sandbox.run_dir / "tools.sock").is_socket()

    run(test)


def test_the_agent_stream_hears_of_each_tool_call_held_for_an_approver():
    async def test(w: World):
        await w.give()
        heard = []
        async with w.tools.turn(
            w.session, AGENT, Recorder(), w.session.kernel, on_hold=heard.append
        ):
            call = asyncio.ensure_future(w.tools.call("s1", "drop", {"region": "north"}))
            (approval,) = await w.pending()
            assert heard == [approval] and "drop" in approval.code
            await w.desk.decide(approval.id, APPROVER, True, None)
            await call

    run(test)


def test_a_servers_error_echoing_a_header_secret_reaches_the_kernel_masked():
    async def test(w: World):
        headers = {"Authorization": {"secret": "WH_TOKEN", "prefix": "Bearer "}}
        body = {"mcp": [{"url": "http://127.0.0.1:9/mcp", "name": "wh", "headers": headers}]}
        await w.tools.give("s1", AGENT, parse_tools(body))

        async def echoing(name, arguments, timeout):
            raise ToolFailed("MCP server wh failed: bad token Bearer s3cret-value-0042")

        FakeServer.made[0].call = echoing
        recorder = Recorder()
        async with w.tools.turn(w.session, AGENT, recorder, w.session.kernel):
            with pytest.raises(CallRefused) as refused:
                await w.tools.call("s1", "query", {})
        assert "s3cret" not in refused.value.message and "***WH_TOKEN***" in refused.value.message
        assert "s3cret" not in json.dumps(recorder.tool_calls)

    run(test)


def test_a_server_refusing_at_connect_cannot_show_a_header_secret_back(monkeypatch):
    async def test(w: World):
        async def echo_open(self):
            raise ToolFailed("401: you sent Bearer s3cret-value-0042")

        monkeypatch.setattr(FakeServer, "open", echo_open)
        headers = {"Authorization": {"secret": "WH_TOKEN", "prefix": "Bearer "}}
        body = {"mcp": [{"url": "http://127.0.0.1:9/mcp", "name": "wh", "headers": headers}]}
        with pytest.raises(ToolServerFailed) as failed:
            await w.tools.give("s1", AGENT, parse_tools(body))
        assert "s3cret" not in failed.value.message and "***WH_TOKEN***" in failed.value.message

    run(test)


def test_a_server_listing_a_header_secret_back_shows_the_sandbox_it_masked(monkeypatch):
    async def test(w: World):
        async def echo_open(self):
            schema = {"type": "object", "default": "s3cret-value-0042"}
            return [
                {**LISTED[0], "description": "Bearer s3cret-value-0042", "input_schema": schema}
            ]

        monkeypatch.setattr(FakeServer, "open", echo_open)
        headers = {"Authorization": {"secret": "WH_TOKEN", "prefix": "Bearer "}}
        body = {"mcp": [{"url": "http://127.0.0.1:9/mcp", "name": "wh", "headers": headers}]}
        await w.tools.give("s1", AGENT, parse_tools(body))
        listing = (await w.tools.endpoint.listing("s1")).decode()
        assert "s3cret" not in listing and "***WH_TOKEN***" in listing
        assert "s3cret" not in json.dumps(w.tools.view("s1", AGENT))

    run(test)


def test_an_approver_sees_a_held_calls_arguments_whole():
    """Arguments padded past what the approval showed hid what the call would do: the
    approver saw a harmless comment and approved dropping every table."""

    async def test(w: World):
        await w.give()
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            call = asyncio.ensure_future(
                w.tools.call("s1", "drop", {"comment": "tidy up " * 500, "table": "EVERYTHING"})
            )
            (approval,) = await w.pending()
            assert '"table": "EVERYTHING"' in approval.code
            await w.desk.decide(approval.id, APPROVER, False, None)
            with pytest.raises(CallRefused):
                await call

    run(test)


def test_a_tool_cannot_shadow_anothers_python_function_by_a_name_spelled_otherwise(monkeypatch):
    """sbx_tools.send_email is the first tool whose name becomes send_email: a second server
    listing send-email (or an execute's client tool so named) would take the other's calls."""

    async def test(w: World):
        from gateway.errors import BadRequest

        async def listing(self):
            name = "send_email" if self.server.name == "a" else "send-email"
            return [{**LISTED[0], "name": name}]

        monkeypatch.setattr(FakeServer, "open", listing)
        body = {"mcp": [{"url": "http://127.0.0.1:9/b", "name": "b"},
                        {"url": "http://127.0.0.1:9/a", "name": "a"}]}  # fmt: skip
        with pytest.raises(BadRequest, match=r"send-email of b and send_email of a"):
            await w.tools.give("s1", AGENT, parse_tools(body))
        await w.tools.give("s1", AGENT, parse_tools({"mcp": body["mcp"][1:]}))
        clash = ({**CLIENT_TOOLS[0], "name": "send-email"},)
        with pytest.raises(BadRequest, match="send-email are named as the session's tools"):
            w.tools.check_client_tools(w.session, clash, answered=True)

    run(test)


def test_a_kernel_asking_for_the_listing_again_and_again_costs_one_encoding_per_execute(
    monkeypatch,
):
    """A server may list megabytes of tools; each GET /tools encoded them anew on the loop all
    sessions share (some 60 ms for 2.7 MB), and a kernel may ask in a loop."""

    async def test(w: World):
        await w.give()
        made = []
        listing = tools_module.Toolbox.listing
        monkeypatch.setattr(
            tools_module.Toolbox, "listing", lambda box: made.append(1) or listing(box)
        )
        client = ClientSide()
        async with w.tools.turn(
            w.session, AGENT, Recorder(), w.session.kernel, CLIENT_TOOLS, client
        ):
            answers = [await w.tools.endpoint.listing("s1") for _ in range(50)]
        async with w.tools.turn(w.session, AGENT, Recorder(), w.session.kernel):
            after = await w.tools.endpoint.listing("s1")
        assert len(made) == 2  # once per execute
        assert all(answer is answers[0] for answer in answers)
        assert "notify" in answers[0].decode() and "notify" not in after.decode()
        assert json.loads(after)["tools"][0]["name"] == "query"

    run(test)


def test_putting_sbx_tools_in_a_kernel_leaves_the_users_names_alone():
    import sys

    from gateway.sessions.tools import INJECT

    namespace = {"_s": "mine", "_t": 2, "_m": [3]}
    before = sys.modules.pop("sbx_tools", None)
    try:
        exec(INJECT, namespace)
        assert sys.modules["sbx_tools"].__name__ == "sbx_tools"
    finally:
        sys.modules.pop("sbx_tools", None)
        if before is not None:
            sys.modules["sbx_tools"] = before
    assert {k: v for k, v in namespace.items() if k != "__builtins__"} == {
        "_s": "mine",
        "_t": 2,
        "_m": [3],
    }


def test_a_relayed_cells_window_closes_when_its_kernel_restarts_or_dies_mid_cell():
    """A Jupyter client's cell ends unseen if its kernel restarts or dies: no idle for it
    comes, so its window must not outlive the kernel it opened in (a process the cell
    started may still run and call)."""

    async def test(w: World):
        await w.give()
        kernel = w.session.kernel
        for end in ("restart", "death"):
            await w.tools.ready(w.session, kernel)
            recorder = Recorder()
            turn = w.tools.open(w.session, AGENT, recorder, kernel)
            assert (await w.tools.call("s1", "query", {}))["result"]["name"] == "query"
            if end == "restart":
                kernel.restarts += 1
            else:
                kernel.died.set()
            with pytest.raises(CallRefused) as refused:
                await w.tools.call("s1", "query", {})
            assert refused.value.status == 409 and "outside" in refused.value.message
            assert len(recorder.tool_calls) == 1
            w.tools.end("s1", turn)
            kernel.died.clear()

    run(test)


def test_a_stdio_server_starts_only_from_a_kernels_image_or_the_tenants_template():
    from gateway.errors import BadRequest

    class Specs:
        default = "python3"

        def names(self):
            return ["python3", "ir"]

    class Placement:
        started: list = []

        async def start_tool_server(self, spec, name, image, argv, env):
            self.started.append((spec, name, image, argv, env))
            raise RuntimeError("no engine here")

    class Templates:
        async def resolve(self, tenant, ref):
            assert tenant == "t1"
            return {"image": f"sbx/tpl-{tenant}-{ref}"}

    async def test(w: World):
        made = {"kernelspecs": Specs(), "placement": Placement(),
                "kernel_image": lambda self, k: f"sbx/{k}"}  # fmt: skip
        lifecycle = type("Lifecycle", (), made)()
        w.manager.lifecycle, w.manager.templates = lifecycle, None
        entry = {"name": "n", "command": ["notes"], "env": {"A": "1"}}
        with pytest.raises(BadRequest, match="names a kernel"):
            await w.give(mcp=[], stdio=[{**entry, "image": "alpine"}])
        with pytest.raises(BadRequest, match="builds no templates"):
            await w.give(mcp=[], stdio=[{**entry, "template": "notes"}])
        assert Placement.started == []
        with pytest.raises(ToolServerFailed, match="no engine here"):
            await w.give(mcp=[], stdio=[entry])
        w.manager.templates = Templates()
        with pytest.raises(ToolServerFailed):
            await w.give(mcp=[], stdio=[{**entry, "template": "notes:2"}])
        images = [(image, argv, env) for _, _, image, argv, env in Placement.started]
        assert images == [("sbx/python3", ["notes"], {"A": "1"}),
                          ("sbx/tpl-t1-notes:2", ["notes"], {"A": "1"})]  # fmt: skip
        assert Placement.started[0][0] is w.session.kernel.sandbox

        from gateway.sessions.requests import CreateSession

        deleted = []

        async def delete(session_id, who):
            deleted.append(session_id)

        w.manager.delete = delete
        request = CreateSession.from_json({"tools": {"stdio": [entry]}})
        with pytest.raises(ToolServerFailed):  # made from the session's: it is made first
            await w.tools.create(request, AGENT)
        assert w.manager.created == 1 and deleted == ["s1"]

    run(test)


def test_servers_are_reached_at_once_so_slow_ones_hold_a_give_the_longest_not_the_sum():
    import time as clock

    async def test(w: World):
        mcp = [{"url": "http://slow.example/mcp", "name": "first"},
               {"url": "http://slow-down.example/mcp", "name": "last"}]  # fmt: skip
        began = clock.monotonic()
        with pytest.raises(ToolServerFailed, match="MCP server last"):
            await w.give(mcp=mcp)
        assert clock.monotonic() - began < 0.5  # one after the other: 0.6 s
        assert FakeServer.made[0].closed

    run(test)


def test_the_listing_asked_before_the_gateway_reads_the_begin_holds_the_executes_tools():
    """A kernel may run ``from sbx_tools import convert`` before the gateway reads its begin
    (the full suite's load): the listing, as a call does, waits for the window of an execute
    sent but not yet begun, or the execute's own tools are missing from it."""
    from gateway.tools import sbx_tools

    async def test(w: World):
        client = ClientSide()
        kernel = w.session.kernel
        async with w.tools.turn(
            w.session, AGENT, Recorder(), kernel, CLIENT_TOOLS, client, at_begin=True
        ) as begin:
            sbx_tools.SOCKET = str(kernel.sandbox.run_dir / "tools.sock")
            asked = asyncio.ensure_future(asyncio.to_thread(sbx_tools.tools))
            await asyncio.sleep(0.3)
            begin()
            listed = await asked
        assert [t["name"] for t in listed] == ["notify"]

    run(test)
