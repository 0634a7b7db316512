"""A session's tools: what its code may call (``GET``), and giving it others (``PUT``)."""

from __future__ import annotations

from ..sessions.requests import SetTools
from .base import JSONHandler

_ID = r"(?P<session_id>[^/]+)"


class ToolsHandler(JSONHandler):
    actions = {"PUT": "session.tools"}

    async def get(self, session_id: str) -> None:
        self.send(self.tools.view(session_id, self.principal))

    async def put(self, session_id: str) -> None:
        request = SetTools.from_json(self.json_body())
        await self.tools.give(session_id, self.principal, request.tools)
        self.send(self.tools.view(session_id, self.principal))


routes = [(rf"/v1/sessions/{_ID}/tools", ToolsHandler)]
