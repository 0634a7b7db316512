"""Notebook export of a session, and replay of a notebook."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.iostream

from ..errors import BadRequest, GatewayError
from ..notebooks.export import export_chunks, read_notebook, replay_notebook
from .base import JSONHandler
from .files import MAX_BATCH


class NotebookHandler(JSONHandler):
    async def get(self, session_id: str) -> None:
        descriptions = self.get_argument("descriptions", "true").lower() not in ("false", "0")
        context = self.get_argument("context", None)  # a code context's notebook
        chunks = export_chunks(
            self.manager, self.reports, session_id, self.principal, descriptions, context
        )
        async with contextlib.aclosing(chunks):
            head = await anext(chunks)  # a missing session is a 404 before anything is sent
            self.set_header("Content-Type", "application/x-ipynb+json")
            name = session_id + (f"-{context}" if context else "")
            disposition = f'attachment; filename="session-{name}.ipynb"'
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
        if self.get_argument("progress", "false") not in ("true", "false"):
            raise BadRequest("progress must be true or false")
        if self.get_argument("progress", "false") == "true":
            await self._replay_with_progress(nb, image_tolerance, inputs)
            return
        report = await self._replay(nb, image_tolerance, inputs)
        self.audit_session = report["notebook"]["metadata"]["sbx"]["replayed_in"]
        self.send(report)

    async def _replay(
        self,
        nb: Any,
        image_tolerance: float | None,
        inputs: dict[str, bytes],
        on_cell: Callable[[dict[str, Any], int, int], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        return await replay_notebook(
            self.manager,
            self.executions,
            self.workspaces,
            nb,
            self.principal,
            image_tolerance,
            inputs,
            on_cell,
        )

    async def _replay_with_progress(
        self, nb: Any, image_tolerance: float | None, inputs: dict[str, bytes]
    ) -> None:
        """NDJSON: a ``cell`` line as each cell is decided, then the ``report`` line.

        The 200 is sent with the first cell: a refusal before it (a bad input,
        quota) is still an ordinary error answer; a failure after it is an
        ``error`` line, as the status has gone.
        """

        self.set_header("Content-Type", "application/x-ndjson")  # an error answer resets it
        sent = False

        async def on_cell(cell: dict[str, Any], done: int, total: int) -> None:
            nonlocal sent
            sent = True
            line = {"event": "cell", "done": done, "total": total, "cell": cell}
            self.write(json.dumps(line) + "\n")
            await self.flush()

        try:
            report = await self._replay(nb, image_tolerance, inputs, on_cell)
        except tornado.iostream.StreamClosedError:
            return  # the client went away; the replay's session has been ended
        except GatewayError as e:
            if not sent:
                raise
            error = {"code": e.code, "message": e.message}
            self.finish(json.dumps({"event": "error", "error": error}) + "\n")
            return
        self.audit_session = report["notebook"]["metadata"]["sbx"]["replayed_in"]
        self.finish(json.dumps({"event": "report", "report": report}) + "\n")


class NotebookVerifyHandler(JSONHandler):
    """``POST`` an exported notebook: does its chain head match the gateway's records?"""

    async def post(self) -> None:
        recorded = (await read_notebook(self.request.body)).metadata.get("sbx", {})
        if not isinstance(recorded.get("session_id"), str):
            raise BadRequest("the notebook names no session (metadata.sbx.session_id)")
        head = recorded.get("chain")
        self.send(await self.reports.check_head(recorded["session_id"], self.principal, head))


routes = [
    (r"/v1/sessions/(?P<session_id>[^/]+)/notebook", NotebookHandler),
    (r"/v1/notebooks/replay", ReplayHandler),
    (r"/v1/notebooks/verify", NotebookVerifyHandler),
]
