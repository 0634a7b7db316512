"""The v1 agent API for sessions: create, inspect, run code, end."""

from __future__ import annotations

from ..access.audit import code_facts
from ..errors import Denied
from ..execution.kernel import ExecutionResult
from ..hosts import NetworkPolicy
from ..sessions.listing import PAGE_MAX
from ..sessions.requests import (
    CreateSession,
    ExecuteCode,
    PauseSession,
    StartCommand,
    UpdateSession,
)
from ..store.base import HISTORY_PAGE
from .base import JSONHandler

_ID = r"(?P<session_id>[^/]+)"


class SessionsHandler(JSONHandler):
    actions = {"POST": "session.create"}

    async def get(self) -> None:
        metadata = {
            key.removeprefix("metadata."): self.get_argument(key)
            for key in self.request.arguments
            if key.startswith("metadata.")
        }
        sessions, following = await self.listing.page(
            self.principal,
            state=self.get_argument("state", None),
            metadata=metadata,
            tenant=self.get_argument("tenant", None),
            after=self.get_argument("after", None),
            limit=self.int_argument("limit", PAGE_MAX),
        )
        self.send({"sessions": sessions, "next": following})

    async def post(self) -> None:
        request = CreateSession.from_json(self.json_body())
        session = await self.tools.create(request, self.principal)
        self.audit_session = session.id
        self.set_header("Location", f"/v1/sessions/{session.id}")
        self.send(session.to_json(), status=201)


class SessionHandler(JSONHandler):
    actions = {"PATCH": "session.update", "DELETE": "session.delete"}

    async def get(self, session_id: str) -> None:
        self.send(await self.manager.describe(session_id, self.principal))

    async def patch(self, session_id: str) -> None:
        request = UpdateSession.from_json(self.json_body())
        session = await self.manager.update(session_id, self.principal, request)
        self.send(session.to_json())

    async def delete(self, session_id: str) -> None:
        await self.manager.delete(session_id, self.principal)
        self.set_status(204)
        self.finish()


class ExecuteHandler(JSONHandler):
    actions = {"POST": "session.execute"}

    async def post(self, session_id: str) -> None:
        body = self.json_body()
        if isinstance(body.get("code"), str):
            self.audit_detail.update(code_facts(body["code"]))
        request = ExecuteCode.from_json(body)
        try:
            result = await self.executions.submit(session_id, self.principal, request)
        except Denied as e:
            self.audit_detail["denied"] = e.message
            raise
        if not isinstance(result, ExecutionResult):  # held for an approver
            self.audit_detail["approval_id"] = result.id
            reasons = result.decision["reasons"]
            held = {"state": "pending_approval", "approval_id": result.id, "reasons": reasons}
            self.send(held, status=202)
            return
        self.audit_detail["execution_status"] = result.status
        self.send(result.to_json())


class CommandsHandler(JSONHandler):
    """Run a shell command in the session's sandbox and wait for its end."""

    actions = {"POST": "session.command"}

    async def post(self, session_id: str) -> None:
        body = self.json_body()
        if isinstance(body.get("command"), str):
            self.audit_detail.update(code_facts(body["command"]))
        request = StartCommand.from_json(body)
        result = await self.executions.run_command(session_id, self.principal, request)
        self.audit_detail["exit_code"] = result["exit_code"]
        self.send(result)


class InterruptHandler(JSONHandler):
    actions = {"POST": "session.interrupt"}

    async def post(self, session_id: str) -> None:
        session = await self.manager.interrupt(session_id, self.principal)
        self.send(session.to_json())


class RestartHandler(JSONHandler):
    actions = {"POST": "session.restart"}

    async def post(self, session_id: str) -> None:
        session = await self.manager.restart(session_id, self.principal)
        self.send(session.to_json())


class PauseHandler(JSONHandler):
    actions = {"POST": "session.pause"}

    async def post(self, session_id: str) -> None:
        request = PauseSession.from_json(self.json_body())
        session, saved = await self.manager.pause(session_id, self.principal, request)
        self.audit_detail["strategy"] = saved["strategy"]
        self.send({**session.to_json(), "strategy": saved["strategy"], "lost": saved["lost"]})


class ResumeHandler(JSONHandler):
    actions = {"POST": "session.resume"}

    async def post(self, session_id: str) -> None:
        session, report = await self.manager.resume(session_id, self.principal)
        self.audit_detail["strategy"] = report["strategy"]
        self.send({**session.to_json(), **report})


class HistoryHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        page = await self.reports.history(
            session_id,
            self.principal,
            after=self.int_argument("after", 0),
            limit=self.int_argument("limit", HISTORY_PAGE),
        )
        self.send(page._asdict())


class NetworkHandler(JSONHandler):
    """GET: the connections a session made; PATCH: its rules, changed while it runs."""

    actions = {"PATCH": "session.network"}

    async def patch(self, session_id: str) -> None:
        network = NetworkPolicy.parse(self.json_body())
        session, before = await self.networks.change(session_id, self.principal, network)
        self.audit_detail.update(before=before.to_json(), after=session.network.to_json())
        self.send(session.to_json())

    async def get(self, session_id: str) -> None:
        connections, after = await self.reports.network(
            session_id,
            self.principal,
            after=self.int_argument("after", 0),
            limit=self.int_argument("limit", HISTORY_PAGE),
        )
        self.send({"connections": connections, "next": after})


class MetricsHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        self.send(await self.reports.usage(session_id, self.principal))


routes = [
    (r"/v1/sessions", SessionsHandler),
    (rf"/v1/sessions/{_ID}", SessionHandler),
    (rf"/v1/sessions/{_ID}/execute", ExecuteHandler),
    (rf"/v1/sessions/{_ID}/commands", CommandsHandler),
    (rf"/v1/sessions/{_ID}/interrupt", InterruptHandler),
    (rf"/v1/sessions/{_ID}/restart", RestartHandler),
    (rf"/v1/sessions/{_ID}/pause", PauseHandler),
    (rf"/v1/sessions/{_ID}/resume", ResumeHandler),
    (rf"/v1/sessions/{_ID}/history", HistoryHandler),
    (rf"/v1/sessions/{_ID}/network", NetworkHandler),
    (rf"/v1/sessions/{_ID}/metrics", MetricsHandler),
]
