"""The code interpreter's port: ``/execute`` streamed as NDJSON, and code contexts.

Each kernel output becomes one line as it happens, in the shapes the SDK's
``parse_output`` reads: ``stdout`` / ``stderr``, ``result`` (every MIME type
under its E2B name, the rest in ``extra``), ``error``, then
``number_of_executions``. A client that goes away mid-run interrupts the
kernel; the session stays usable.

A sandbox is one session with one kernel, so it has one context: the
default one, in its kernel's language. Creating a context in that language
answers with it (state is shared); another language needs a sandbox of its own.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...access.audit import code_facts
from ...errors import BadRequest, NotFound
from ...sessions.requests import ExecuteCode
from ...validation import env_vars
from .base import JUPYTER_PORT, SandboxHandler
from .templates import HOME, check_language, language_of

# nbformat MIME types by the name the SDK's Result takes them under.
MIME_NAMES = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "application/vnd.e2b.chart+json": "chart",
    "application/vnd.dataresource+json": "data",
}


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def event(output: dict[str, Any]) -> dict[str, Any] | None:
    """One nbformat output as the SDK's stream line; None for what it has no line for."""
    kind = output.get("output_type")
    if kind == "stream":
        name = "stderr" if output.get("name") == "stderr" else "stdout"
        return {"type": name, "text": _text(output.get("text", "")), "timestamp": time.time_ns()}
    if kind == "error":
        return error_event(output)
    if kind in ("display_data", "execute_result"):
        line: dict[str, Any] = {"type": "result", "is_main_result": kind == "execute_result"}
        extra = {}
        for mime, value in (output.get("data") or {}).items():
            name = MIME_NAMES.get(mime)
            if name is None:
                extra[mime] = value
            else:
                line[name] = value if name in ("json", "chart", "data") else _text(value)
        if extra:
            line["extra"] = extra
        return line
    return None


def error_event(error: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "error",
        "name": error.get("ename", ""),
        "value": error.get("evalue", ""),
        "traceback": "\n".join(error.get("traceback") or []),
    }


class InterpreterHandler(SandboxHandler):
    port = JUPYTER_PORT

    def context(self) -> dict[str, Any]:
        session = self.manager.get(self.sandbox_id, self.principal)
        return {"id": session.id, "language": language_of(session.kernel_name), "cwd": HOME}

    def check_context(self, context_id: str | None) -> None:
        if context_id is not None and context_id != self.sandbox_id:
            raise NotFound(f"context {context_id!r} does not exist in this sandbox")


class ExecuteHandler(InterpreterHandler):
    actions = {"POST": "session.execute"}
    running = False
    gone = False

    async def post(self) -> None:
        body = self.json_body()
        session = self.manager.get(self.sandbox_id, self.principal)
        self.check_context(body.get("context_id"))
        check_language(body.get("language"), session.kernel_name)
        if not isinstance(body.get("code"), str):
            raise BadRequest("code must be a string of source code")
        self.audit_detail.update(code_facts(body["code"]))
        request = ExecuteCode(body["code"], env=env_vars(body.get("env_vars")))
        self.set_header("Content-Type", "application/x-ndjson")
        self.running = True
        try:
            result = await self.executions.execute(
                self.sandbox_id, self.principal, request, on_output=self.emit
            )
        finally:
            self.running = False
        self.audit_detail["execution_status"] = result.status
        if result.truncated:
            self.emit(result.outputs[-1])  # the note saying what was cut, made at the end
        if result.error and not any(o.get("output_type") == "error" for o in result.outputs):
            self.send_line(error_event(result.error))  # a timeout or a dead kernel
        self.send_line({"type": "number_of_executions", "execution_count": result.execution_count})
        self.send_line({"type": "end_of_execution"})
        self.finish()

    def emit(self, output: dict[str, Any] | None) -> None:
        line = event(output) if output is not None else None
        if line is not None:
            self.send_line(line)

    def send_line(self, line: dict[str, Any]) -> None:
        if self.gone:
            return
        self.write(json.dumps(line) + "\n")
        self.flush()

    def on_connection_close(self) -> None:
        """The client went away: stop its code, as E2B does, so the sandbox is free again."""
        self.gone = True
        if self.running:
            self.manager.spawn(self.manager.interrupt(self.sandbox_id, self.principal))


class ContextsHandler(InterpreterHandler):
    async def get(self) -> None:
        self.send([self.context()])

    async def post(self) -> None:
        body = self.json_body()
        session = self.manager.get(self.sandbox_id, self.principal)
        check_language(body.get("language"), session.kernel_name)
        cwd = body.get("cwd")
        if cwd not in (None, HOME, HOME + "/"):
            raise BadRequest(f"contexts start in {HOME} (the sandbox's workspace), not {cwd!r}")
        self.send(self.context())


class ContextHandler(InterpreterHandler):
    """Removing the sandbox's one context leaves it as it is: it lives as long as the sandbox."""

    async def delete(self, context_id: str) -> None:
        self.check_context(context_id)
        self.manager.get(self.sandbox_id, self.principal)
        self.set_status(204)
        self.finish()


class ContextRestartHandler(InterpreterHandler):
    actions = {"POST": "session.restart"}

    async def post(self, context_id: str) -> None:
        self.check_context(context_id)
        await self.manager.restart(self.sandbox_id, self.principal)
        self.set_status(204)
        self.finish()


routes = [
    (r"/execute", ExecuteHandler),
    (r"/contexts", ContextsHandler),
    (r"/contexts/(?P<context_id>[^/]+)", ContextHandler),
    (r"/contexts/(?P<context_id>[^/]+)/restart", ContextRestartHandler),
]
