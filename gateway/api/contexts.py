"""A session's code contexts over ``/v1``: more kernels in its sandbox (``sessions.contexts``).

An execute names its context with ``"context": ID`` (``/v1/sessions/{id}/execute``);
``default`` (or none) is the session's own kernel.
"""

from __future__ import annotations

from ..sessions.requests import CreateContext
from .base import JSONHandler

SESSION = r"/v1/sessions/(?P<session_id>[^/]+)/contexts"


class ContextsHandler(JSONHandler):
    actions = {"POST": "session.context"}

    async def get(self, session_id: str) -> None:
        session = self.manager.get(session_id, self.principal)
        self.send({"contexts": self.manager.contexts.views(session)})

    async def post(self, session_id: str) -> None:
        request = CreateContext.from_json(self.json_body())
        session = self.manager.get(session_id, self.principal)
        context = await self.manager.contexts.create(
            session, request.kernel, request.language, request.cwd
        )
        self.audit_detail["context"] = context.id
        self.send(context.to_json(), status=201)


class ContextHandler(JSONHandler):
    actions = {"DELETE": "session.context"}

    async def get(self, session_id: str, context_id: str) -> None:
        session = self.manager.get(session_id, self.principal)
        self.send(self.manager.contexts.view(session, context_id))

    async def delete(self, session_id: str, context_id: str) -> None:
        session = self.manager.get(session_id, self.principal)
        await self.manager.contexts.remove(session, context_id)
        self.set_status(204)
        self.finish()


class ContextRestartHandler(JSONHandler):
    actions = {"POST": "session.restart"}

    async def post(self, session_id: str, context_id: str) -> None:
        session = self.manager.get(session_id, self.principal)
        context = await self.manager.contexts.restart(session, context_id)
        self.send(context.to_json())


class ContextInterruptHandler(JSONHandler):
    actions = {"POST": "session.interrupt"}

    async def post(self, session_id: str, context_id: str) -> None:
        session = self.manager.get(session_id, self.principal)
        await self.manager.contexts.interrupt(session, context_id)
        self.send(self.manager.contexts.view(session, context_id))


routes = [
    (SESSION, ContextsHandler),
    (SESSION + r"/(?P<context_id>[^/]+)", ContextHandler),
    (SESSION + r"/(?P<context_id>[^/]+)/restart", ContextRestartHandler),
    (SESSION + r"/(?P<context_id>[^/]+)/interrupt", ContextInterruptHandler),
]
