"""The v1 agent API for sessions: create, inspect, run code, end."""

from __future__ import annotations

from .base import JSONHandler

_ID = r"(?P<session_id>[^/]+)"


class SessionsHandler(JSONHandler):
    async def get(self) -> None:
        metadata = {
            key.removeprefix("metadata."): self.get_argument(key)
            for key in self.request.arguments
            if key.startswith("metadata.")
        }
        state = self.get_argument("state", None)
        sessions = self.manager.list(state=state, metadata=metadata)
        self.send({"sessions": [s.to_json() for s in sessions]})

    async def post(self) -> None:
        session = await self.manager.create(self.json_body())
        self.set_header("Location", f"/v1/sessions/{session.id}")
        self.send(session.to_json(), status=201)


class SessionHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        self.send(await self.manager.describe(session_id))

    async def patch(self, session_id: str) -> None:
        session = await self.manager.update(session_id, self.json_body())
        self.send(session.to_json())

    async def delete(self, session_id: str) -> None:
        await self.manager.delete(session_id)
        self.set_status(204)
        self.finish()


class ExecuteHandler(JSONHandler):
    async def post(self, session_id: str) -> None:
        body = self.json_body()
        result = await self.manager.execute(
            session_id, body.get("code"), body.get("timeout"), description=body.get("description")
        )
        self.send(result.to_json())


class InterruptHandler(JSONHandler):
    async def post(self, session_id: str) -> None:
        session = await self.manager.interrupt(session_id)
        self.send(session.to_json())


class RestartHandler(JSONHandler):
    async def post(self, session_id: str) -> None:
        session = await self.manager.restart(session_id)
        self.send(session.to_json())


class HistoryHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        self.send({"executions": await self.manager.history(session_id)})


routes = [
    (r"/v1/sessions", SessionsHandler),
    (rf"/v1/sessions/{_ID}", SessionHandler),
    (rf"/v1/sessions/{_ID}/execute", ExecuteHandler),
    (rf"/v1/sessions/{_ID}/interrupt", InterruptHandler),
    (rf"/v1/sessions/{_ID}/restart", RestartHandler),
    (rf"/v1/sessions/{_ID}/history", HistoryHandler),
]
