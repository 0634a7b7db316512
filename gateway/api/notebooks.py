"""Notebook export of a session, and replay of a notebook."""

from __future__ import annotations

import contextlib

import tornado.iostream

from ..errors import BadRequest
from ..notebooks.export import export_chunks, read_notebook, replay_notebook
from .base import JSONHandler
from .files import MAX_BATCH


class NotebookHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        descriptions = self.get_argument("descriptions", "true").lower() not in ("false", "0")
        chunks = export_chunks(self.manager, session_id, self.principal, descriptions)
        async with contextlib.aclosing(chunks):
            head = await anext(chunks)  # a missing session is a 404 before anything is sent
            self.set_header("Content-Type", "application/x-ipynb+json")
            disposition = f'attachment; filename="session-{session_id}.ipynb"'
            self.set_header("Content-Disposition", disposition)
            self.write(head)
            try:
                async for chunk in chunks:  # each sent before the next is built
                    self.write(chunk)
                    await self.flush()
            except tornado.iostream.StreamClosedError:
                return  # the client went away mid-export
        self.finish()


class ReplayHandler(JSONHandler):
    """``POST``: a notebook as the body, or multipart: a ``notebook`` part and ``inputs``
    parts (each part's filename is its workspace path), written before the first cell."""

    actions = {"POST": "notebook.replay"}

    def body_limit(self) -> int:
        """A notebook alone is bounded as any body; one sent with its inputs as a batch is."""
        if self.request.headers.get("Content-Type", "").startswith("multipart/form-data"):
            return max(MAX_BATCH, super().body_limit())
        return super().body_limit()

    async def post(self) -> None:
        tolerance = self.get_argument("image_tolerance", None)
        try:
            image_tolerance = None if tolerance is None else float(tolerance)
        except ValueError:
            image_tolerance = -1.0
        if image_tolerance is not None and not 0 <= image_tolerance <= 1:
            raise BadRequest("image_tolerance must be a number between 0 and 1")
        body, inputs = self.request.body, {}
        if self.request.files:
            notebooks = self.request.files.get("notebook") or []
            if len(notebooks) != 1:
                raise BadRequest("a multipart replay needs one 'notebook' part")
            body = notebooks[0].body
            inputs = {part.filename: part.body for part in self.request.files.get("inputs", [])}
        nb = await read_notebook(body)
        report = await replay_notebook(self.manager, nb, self.principal, image_tolerance, inputs)
        self.audit_session = report["notebook"]["metadata"]["sbx"]["replayed_in"]
        self.send(report)


routes = [
    (r"/v1/sessions/(?P<session_id>[^/]+)/notebook", NotebookHandler),
    (r"/v1/notebooks/replay", ReplayHandler),
]
