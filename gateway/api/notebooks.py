"""Notebook export of a session, and replay of a notebook."""

from __future__ import annotations

import json

from ..errors import BadRequest
from ..notebooks.export import export_notebook, read_notebook, replay_notebook
from .base import JSONHandler


class NotebookHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        session = await self.manager.record(session_id, self.principal)
        history = await self.manager.history(session_id, self.principal)
        descriptions = self.get_argument("descriptions", "true").lower() not in ("false", "0")
        nb = export_notebook(session, history, descriptions=descriptions)
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.set_header("Content-Disposition", f'attachment; filename="session-{session_id}.ipynb"')
        self.finish(json.dumps(nb, indent=1))


class ReplayHandler(JSONHandler):
    actions = {"POST": "notebook.replay"}

    async def post(self) -> None:
        tolerance = self.get_argument("image_tolerance", None)
        try:
            image_tolerance = None if tolerance is None else float(tolerance)
        except ValueError:
            image_tolerance = -1.0
        if image_tolerance is not None and not 0 <= image_tolerance <= 1:
            raise BadRequest("image_tolerance must be a number between 0 and 1")
        nb = read_notebook(self.request.body)
        report = await replay_notebook(self.manager, nb, self.principal, image_tolerance)
        self.audit_session = report["notebook"]["metadata"]["sbx"]["replayed_in"]
        self.send(report)


routes = [
    (r"/v1/sessions/(?P<session_id>[^/]+)/notebook", NotebookHandler),
    (r"/v1/notebooks/replay", ReplayHandler),
]
