"""The v1 agent API for sessions: create, inspect, run code, end."""

from __future__ import annotations

from ..access.audit import code_facts
from ..sessions.requests import CreateSession, ExecuteCode, StartCommand, UpdateSession
from ..store.sqlite import HISTORY_PAGE
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
        sessions = self.manager.list(
            self.principal,
            state=self.get_argument("state", None),
            metadata=metadata,
            tenant=self.get_argument("tenant", None),
        )
        self.send({"sessions": [s.to_json() for s in sessions]})

    async def post(self) -> None:
        request = CreateSession.from_json(self.json_body())
        session = await self.manager.create(request, self.principal)
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
        result = await self.manager.execute(session_id, self.principal, request)
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
        result = await self.manager.run_command(session_id, self.principal, request)
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


class HistoryHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        page = await self.manager.history(
            session_id,
            self.principal,
            after=self.int_argument("after", 0),
            limit=self.int_argument("limit", HISTORY_PAGE),
        )
        self.send({"executions": page.executions, "next": page.next})


routes = [
    (r"/v1/sessions", SessionsHandler),
    (rf"/v1/sessions/{_ID}", SessionHandler),
    (rf"/v1/sessions/{_ID}/execute", ExecuteHandler),
    (rf"/v1/sessions/{_ID}/commands", CommandsHandler),
    (rf"/v1/sessions/{_ID}/interrupt", InterruptHandler),
    (rf"/v1/sessions/{_ID}/restart", RestartHandler),
    (rf"/v1/sessions/{_ID}/history", HistoryHandler),
]
