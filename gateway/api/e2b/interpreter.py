"""The code interpreter's port: ``/execute`` streamed as NDJSON, and code contexts.

Each kernel output becomes one line as it happens, in the shapes the SDK's
``parse_output`` reads: ``stdout`` / ``stderr``, ``result`` (every MIME type
under its E2B name, the rest in ``extra``), ``error``, then
``number_of_executions``. A client that goes away mid-run interrupts the
kernel; the session stays usable.

A sandbox is one session; its default context is the session's own kernel
(its id is the sandbox's). ``create_code_context`` starts another kernel in
the same sandbox (``sessions.contexts``): same files, its own variables, in
any language the sandbox's image holds. ``run_code(language=...)`` in another
language than the default context's runs in that language's first context,
made on first use, as E2B does.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...access.audit import code_facts
from ...errors import BadRequest
from ...sessions.model import CodeContext, Session
from ...sessions.requests import ExecuteCode
from ...validation import env_vars
from .base import JUPYTER_PORT, SandboxHandler
from .templates import HOME, LANGUAGES, language_of

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

    def session(self) -> Session:
        return self.manager.get(self.sandbox_id, self.principal)

    def context_id(self, context_id: str | None) -> str | None:
        """The domain's id of a context the SDK names (the sandbox's id: its default one)."""
        return None if context_id == self.sandbox_id else context_id

    def view(self, session: Session, context: CodeContext | None) -> dict[str, Any]:
        """A context in the SDK's shape (its cwd under the SDK's home)."""
        if context is None:
            return {"id": session.id, "language": language_of(session.kernel_name), "cwd": HOME}
        cwd = HOME + (f"/{context.cwd}" if context.cwd else "")
        return {"id": context.id, "language": context.language, "cwd": cwd}

    async def context_for(self, session: Session, context_id: Any, language: Any) -> str | None:
        """The context an execute runs in: the one named, else the first of its language
        (made on first use), else the default one."""
        if context_id is not None:
            return self.context_id(str(context_id))
        if language is None or LANGUAGES.get(str(language).lower()) == session.kernel_name:
            return None
        wanted = _language(language)
        if wanted == language_of(session.kernel_name):
            return None
        contexts = self.manager.contexts
        found = next((c for c in session.contexts.values() if c.language == wanted), None)
        if found is None:
            found = await contexts.create(session, language=wanted)
        return found.id


class ExecuteHandler(InterpreterHandler):
    actions = {"POST": "session.execute"}
    running = False
    gone = False
    ran_in: str | None = None  # the context it runs in (None: the default one)

    async def post(self) -> None:
        body = self.json_body()
        session = self.session()
        if not isinstance(body.get("code"), str):
            raise BadRequest("code must be a string of source code")
        context = await self.context_for(session, body.get("context_id"), body.get("language"))
        self.audit_detail.update(code_facts(body["code"]))
        env = env_vars(body.get("env_vars"))
        request = ExecuteCode(body["code"], env=env, context=context)
        self.ran_in = context
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
            interrupt = self.manager.contexts.interrupt(self.session(), self.ran_in)
            self.manager.spawn(interrupt)


class ContextsHandler(InterpreterHandler):
    actions = {"POST": "session.context"}

    async def get(self) -> None:
        session = self.session()
        self.send(
            [self.view(session, None), *(self.view(session, c) for c in session.contexts.values())]
        )

    async def post(self) -> None:
        body = self.json_body()
        language = body.get("language")
        context = await self.manager.contexts.create(
            self.session(),
            language=None if language is None else _language(language),
            cwd=body.get("cwd"),
        )
        self.send(self.view(self.session(), context))


class ContextHandler(InterpreterHandler):
    """Removing the default context leaves it as it is: it lives as long as the sandbox."""

    actions = {"DELETE": "session.context"}

    async def delete(self, context_id: str) -> None:
        session = self.session()
        found = self.context_id(context_id)
        if found is not None:
            await self.manager.contexts.remove(session, found)
        self.set_status(204)
        self.finish()


class ContextRestartHandler(InterpreterHandler):
    actions = {"POST": "session.restart"}

    async def post(self, context_id: str) -> None:
        found = self.context_id(context_id)
        if found is None:
            await self.manager.restart(self.sandbox_id, self.principal)
        else:
            await self.manager.contexts.restart(self.session(), found)
        self.set_status(204)
        self.finish()


def _language(language: Any) -> str:
    """An SDK language as the kernelspecs name it (``js`` is JavaScript)."""
    if not isinstance(language, str):
        raise BadRequest("language must be a string such as 'python', 'r', 'javascript', 'bash'")
    name = language.lower()
    return "javascript" if name == "js" else name


routes = [
    (r"/execute", ExecuteHandler),
    (r"/contexts", ContextsHandler),
    (r"/contexts/(?P<context_id>[^/]+)", ContextHandler),
    (r"/contexts/(?P<context_id>[^/]+)/restart", ContextRestartHandler),
]
