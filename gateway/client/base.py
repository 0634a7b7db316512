"""What both halves of the SDK share: settings, URLs, payloads, parsing, errors, retries.

A method of the API is written once here as a ``Call`` (the request, whether
it is idempotent, and how to read the answer); ``Client`` and ``AsyncClient``
only send calls, so the sync and async halves cannot drift apart.

Over 600 lines on purpose: each of the API's calls is written here once, for
both halves; split by topic, a half would import calls from several places.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import json
import logging
import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Generic, Self, TypedDict, TypeVar
from urllib.parse import quote

import httpx
from websockets.exceptions import InvalidMessage, InvalidStatus

from .. import __version__
from ..errors import BadRequest, FileTooLarge, GatewayError, NotFound, SessionEnded
from .errors import GatewayUnreachable, error_from_body, error_from_event
from .models import (
    Approval,
    CodeContext,
    CommandResult,
    FileInfo,
    Port,
    PreviewLink,
    RecordedExecution,
    ReplayCell,
    ReplayReport,
    SessionInfo,
    SessionMetrics,
)
from .settings import ClientSettings
from .stream import Run
from .tools import ClientTools

log = logging.getLogger(__name__)

T = TypeVar("T")
CHUNK = 1 << 16
# Failures of the connection itself: the request may not have been handled.
_CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
Progress = Callable[[int, int | None], Any]  # (bytes done, total bytes or None)
ReplayProgress = Callable[[ReplayCell, int, int], Any]  # (cell decided, done, code cells)


class SessionOptions(TypedDict, total=False):
    """What a new session may ask for; anything left out gets the server's default."""

    kernel: str  # kernelspec name, e.g. "python3"
    image: str  # an image the gateway built (sbx/...), instead of the kernel's own
    memory: str | int  # "512m", or bytes
    cpus: float
    pids: int
    disk: str | int  # size of the writable workspace
    execution_timeout: float  # each run's default time limit, seconds (limits.timeout)
    output_bytes: str | int  # output kept per execution
    limits: dict[str, Any]  # the same limits as a dict (the keyword forms win)
    ttl: float  # lifetime in seconds from creation
    idle_timeout: float  # seconds without activity before the session ends
    idle_action: str  # what the idle timeout does: "end" (default) or "pause"
    survive_crashes: bool  # checkpoint the kernel when idle; bring it back if it dies
    from_snapshot: str  # a fork: start holding this snapshot's state (its kernel and image)
    env: dict[str, str]
    secrets: list[str]  # names of the tenant's sealed secrets (POST /v1/secrets)
    secrets_as: str  # "env" (the default) or "files" (/run/secrets, on a tmpfs)
    metadata: dict[str, str | int | float | bool]
    runtime: str  # "runc" or "gvisor", as the gateway allows
    network: str | dict[str, Any]  # "none", or {"allow": ["pypi.org", "*.example.com", ...]}
    # Secrets the egress proxy adds to requests to their hosts; the sandbox holds placeholders:
    # [{"secret": "GH_TOKEN", "hosts": ["api.github.com"], "format": "Bearer {value}"}]
    credentials: list[dict[str, Any]]
    # The tenant's named volumes under the workspace (create_volume):
    # [{"name": "datasets", "path": "data", "read_only": True}]
    volumes: list[dict[str, Any]]
    # One of the tenant's templates (build_template): "geo-stack" or "geo-stack:2"
    template: str
    # MCP servers its code calls ({"mcp": [{"url": ...}], "rules": ...}), or client tools:
    # functions of this process its code calls during every run (session.tools.register)
    tools: dict[str, Any] | list[Callable[..., Any]]


# Keyword -> key in the API's limits.
_LIMITS = {
    "memory": "memory",
    "cpus": "cpus",
    "pids": "pids",
    "disk": "disk",
    "execution_timeout": "timeout",
    "output_bytes": "output_bytes",
}


def session_request(options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``POST /v1/sessions`` body for SessionOptions."""
    if "timeout" in options:  # E2B's create(timeout=) is a lifetime; ours was each run's limit
        raise TypeError(
            "timeout= is ambiguous: say ttl= for the session's lifetime in seconds (what E2B's "
            "Sandbox.create(timeout=) means) or execution_timeout= for each run's time limit"
        )
    unknown = set(options) - set(SessionOptions.__annotations__)
    if unknown:
        raise TypeError(f"unknown session option(s) {sorted(unknown)}")
    if _client_tools(options):
        options = {k: v for k, v in options.items() if k != "tools"}
    limits = dict(options.get("limits") or {})
    limits.update({key: options[k] for k, key in _LIMITS.items() if options.get(k) is not None})
    body = {k: v for k, v in options.items() if k not in (*_LIMITS, "limits") and v is not None}
    if limits:
        body["limits"] = limits
    return body


def _client_tools(options: Mapping[str, Any]) -> list[Callable[..., Any]]:
    """The functions ``tools=`` names as client tools ([] when it is an MCP config)."""
    tools = options.get("tools")
    if isinstance(tools, list | tuple) and all(callable(t) for t in tools):
        return list(tools)
    return []


def _nothing(response: httpx.Response) -> None:
    return None


def replay_event(line: str) -> tuple[ReplayCell, int, int] | ReplayReport | None:
    """One line of a replay with progress: a decided cell (with done and total), the
    report, or None for a blank line; an ``error`` line raises the gateway's error."""
    if not line.strip():
        return None
    event = json.loads(line)
    if event.get("event") == "report":
        return ReplayReport.from_json(event["report"])
    if event.get("event") == "cell":
        cell = ReplayCell.from_json(event["cell"])
        return cell, int(event["done"]), int(event["total"])
    raise error_from_event(event.get("error"))


def _json(response: httpx.Response) -> Any:
    return response.json()


@dataclasses.dataclass
class Call(Generic[T]):
    """One request to the gateway and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T] = _nothing  # type: ignore[assignment]
    params: dict[str, Any] | None = None
    json: Any = None
    content: Any = None
    headers: dict[str, str] | None = None
    timeout: Any = httpx.USE_CLIENT_DEFAULT
    # Safe to send twice; only such calls are retried. Streamed bodies cannot be resent.
    idempotent: bool | None = None

    def __post_init__(self) -> None:
        if self.idempotent is None:
            self.idempotent = self.method in ("GET", "PUT", "DELETE")

    def request_args(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "url": self.path,
            "params": self.params,
            "json": self.json,
            "content": self.content,
            "headers": self.headers,
            "timeout": self.timeout,
        }


@dataclasses.dataclass(frozen=True)
class Retry:
    """Retry policy: idempotent calls are retried on connection errors only, with backoff."""

    retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 4.0

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2**attempt)


def resolve(url: str | None, token: str | None) -> tuple[str, str]:
    """Fill what the caller left out from the settings (``SBX_URL``, ``SBX_TOKEN``, config)."""
    if url is None or token is None:
        settings = ClientSettings.load()
        url = settings.url if url is None else url
        token = settings.token if token is None else token
    return url.rstrip("/"), token


# A code context, or its id (None: the session's own kernel).
Contextual = CodeContext | str | None


def context_id(context: Contextual) -> str | None:
    return context.id if isinstance(context, CodeContext) else context


def _code_context(response: httpx.Response) -> CodeContext:
    return CodeContext.from_json(response.json())


def _segment(value: str) -> str:
    """One path segment whatever the id: '.' and '..' are escaped too, else the URL folds them
    away and a call meant for a context reaches its session (remove_context(s, '..'))."""
    quoted = quote(str(value), safe="")
    return quoted.replace(".", "%2E") if quoted.strip(".") == "" else quoted


def file_path(path: str) -> str:
    """A workspace path as a URL path, each segment quoted, its dot segments folded here: sent
    as is, the URL folds them itself, and '../tools' reached the session's tools route."""
    kept: list[str] = []
    for segment in str(path).split("/"):
        if segment == "..":
            if not kept:
                raise BadRequest(
                    f"workspace path {path!r} goes above the workspace; name one in it"
                )
            kept.pop()
        elif segment not in ("", "."):
            kept.append(segment)
    return quote("/".join(kept), safe="/")


class BaseClient:
    """Settings, request building and error/retry policy for ``Client`` and ``AsyncClient``.

    ``url``/``token`` default to the settings (``SBX_URL``/``SBX_TOKEN``, config file);
    ``timeout`` bounds each HTTP request (streamed runs are bounded by the gateway);
    ``retry`` is a ``Retry`` policy or a number of retries.
    """

    http_class: Any = None  # httpx.Client or httpx.AsyncClient, set by each half
    snapshot_class: Any = None  # Snapshot or AsyncSnapshot, set by each half

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 120.0,
        retry: Retry | int = 3,
    ) -> None:
        self.url, self.token = resolve(url, token)
        self.retry = retry if isinstance(retry, Retry) else Retry(retries=retry)
        self.timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self._http = self.http_class(base_url=self.url, headers=self.headers, timeout=self.timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": f"sandbox-gateway-sdk/{__version__}"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def ws_url(self, path: str) -> str:
        return "ws" + self.url.removeprefix("http") + path

    def _ws_options(self) -> dict[str, Any]:
        # Events carry whole outputs (images, the done summary): no frame size cap.
        return {"additional_headers": self.headers, "max_size": None, "open_timeout": 30}

    def _retry_delay(self, what: str, retryable: bool, error: Exception, attempt: int) -> float:
        """Seconds to wait before trying again; raise when the failure is final."""
        if retryable and attempt < self.retry.retries:
            delay = self.retry.delay(attempt)
            log.info("%s failed (%s); retrying in %.2f s", what, error, delay)
            return delay
        raise self.unreachable(error) from error

    def _http_retry(self, call: Call[Any], error: Exception, attempt: int) -> float:
        retryable = bool(call.idempotent) and isinstance(error, _CONNECTION_ERRORS)
        return self._retry_delay(f"{call.method} {call.path}", retryable, error, attempt)

    def _stream_retry(self, url: str, error: Exception, attempt: int) -> float:
        """Opening a stream sends nothing yet, so any failure to connect may be retried."""
        if isinstance(error, InvalidStatus):
            response = error.response
            raise error_from_body(
                response.status_code, response.body or b"", response.reason_phrase
            ) from error
        retryable = isinstance(error, OSError | TimeoutError | InvalidMessage)
        return self._retry_delay(f"opening {url}", retryable, error, attempt)

    def unreachable(self, error: BaseException) -> GatewayUnreachable:
        detail = str(error) or type(error).__name__
        if isinstance(error, httpx.TimeoutException | TimeoutError):
            detail = f"no answer in time ({detail})"
        return GatewayUnreachable(
            f"cannot reach the gateway at {self.url}: {detail}; "
            "check that it runs (sbx serve) and the URL (--url / SBX_URL)"
        )

    @staticmethod
    def _error(response: httpx.Response, body: bytes) -> GatewayError:
        return error_from_body(response.status_code, body, response.reason_phrase)

    # -- calls --------------------------------------------------------------------------

    def _create_call(self, options: Mapping[str, Any]) -> Call[SessionInfo]:
        return Call("POST", "/v1/sessions", _session_info, json=session_request(options))

    def _describe_call(
        self, session_id: str, parse: Callable[[httpx.Response], SessionInfo] | None = None
    ) -> Call[SessionInfo]:
        return Call("GET", f"/v1/sessions/{_segment(session_id)}", parse or _session_info)

    def _list_call(
        self, state: str | None, metadata: Mapping[str, Any] | None, page: str | None = None
    ) -> Call[tuple[list[SessionInfo], str | None]]:
        """A page of the deployment's live sessions, and the next page's token (None: done)."""
        params = {f"metadata.{k}": str(v) for k, v in (metadata or {}).items()}
        if state is not None:
            params["state"] = state
        if page is not None:
            params["after"] = page
        return Call("GET", "/v1/sessions", _session_list, params=params)

    def _replay_call(
        self,
        notebook: dict[str, Any] | str | bytes | Path,
        image_tolerance: float | None,
        inputs: Mapping[str, bytes] | None = None,
        progress: bool = False,
    ) -> Call[ReplayReport]:
        """The replay request; with ``inputs`` (workspace path -> content), a multipart one.

        With ``progress`` the answer is NDJSON, read line by line with ``replay_event``.
        """
        if isinstance(notebook, Path):
            content = notebook.read_bytes()
        elif isinstance(notebook, dict):
            content = json.dumps(notebook).encode()
        else:
            content = notebook.encode() if isinstance(notebook, str) else notebook
        params: dict[str, Any] = {}
        if image_tolerance is not None:
            params["image_tolerance"] = image_tolerance
        if progress:
            params["progress"] = "true"
        headers = None
        if inputs:  # encoded by httpx's own multipart writer, as a request it would send
            parts = [("notebook", ("notebook.ipynb", content, "application/x-ipynb+json"))]
            parts += [
                ("inputs", (path, data, "application/octet-stream"))
                for path, data in inputs.items()
            ]
            encoded = httpx.Request("POST", "http://multipart.invalid/", files=parts)
            content, headers = encoded.read(), {"Content-Type": encoded.headers["Content-Type"]}
        # A replay runs a whole notebook: no read timeout.
        return Call(
            "POST",
            "/v1/notebooks/replay",
            lambda r: ReplayReport.from_json(r.json()),
            params=params,
            content=content,
            headers=headers,
            timeout=None,
        )

    def _snapshot_call(self, snapshot_id: str) -> Call[Any]:
        return Call("GET", f"/v1/snapshots/{_segment(snapshot_id)}", self._snapshot)

    def _snapshot(self, response: httpx.Response) -> Any:
        return self.snapshot_class(self, response.json())

    def _build_template_call(
        self,
        name: str,
        dockerfile: str,
        context: bytes | None,
        kernel: str | None,
        tags: list[str] | None = None,
    ) -> Call[dict[str, Any]]:
        body: dict[str, Any] = {"name": name, "dockerfile": dockerfile}
        if context is not None:
            body["context"] = base64.b64encode(context).decode()
        if kernel is not None:
            body["kernel"] = kernel
        if tags:
            body["tags"] = list(tags)
        return Call("POST", "/v1/templates", _json, json=body)

    def _template_tags_call(
        self, name: str, method: str = "GET", body: dict[str, Any] | None = None
    ) -> Call[Any]:
        """A template's tags (GET), moved to a version (POST) or removed (DELETE)."""
        parse = {"GET": lambda r: r.json()["tags"], "POST": _json}.get(method, _nothing)
        return Call(method, f"/v1/templates/{_segment(name)}/tags", parse, json=body)

    def _templates_call(self) -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/templates", lambda r: r.json()["templates"])

    def _template_call(self, name: str, method: str = "GET") -> Call[Any]:
        """A template's builds, newest first (GET), or all of them deleted (DELETE)."""
        parse = _nothing if method == "DELETE" else (lambda r: r.json()["versions"])
        return Call(method, f"/v1/templates/{_segment(name)}", parse)

    def _template_pool_call(self, name: str, size: int | None = None) -> Call[dict[str, Any]]:
        """A template's warm pool as it is (from its view), or sized (PUT)."""
        if size is None:
            return Call("GET", f"/v1/templates/{_segment(name)}", lambda r: r.json()["pool"])
        return Call("PUT", f"/v1/templates/{_segment(name)}/pool", _json, json={"size": size})

    def _health_call(self) -> Call[dict[str, Any]]:
        return Call("GET", "/healthz", _json)

    def _create_volume_call(self, name: str, size: str | int | None) -> Call[dict[str, Any]]:
        body = {"name": name, **({"size": size} if size is not None else {})}
        return Call("POST", "/v1/volumes", _json, json=body)

    def _volumes_call(self) -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/volumes", lambda r: r.json()["volumes"])

    def _volume_call(self, name: str, method: str = "GET") -> Call[Any]:
        """Inspect (GET) or delete (DELETE) one volume."""
        return Call(
            method, f"/v1/volumes/{_segment(name)}", _nothing if method == "DELETE" else _json
        )

    def _verify_audit_call(self, tenant: str | None, session: str | None) -> Call[dict[str, Any]]:
        params = {k: v for k, v in (("tenant", tenant), ("session", session)) if v is not None}
        # A whole store's chains are walked a page at a time: no read timeout.
        return Call("GET", "/v1/admin/audit/verify", _json, params=params, timeout=None)

    def _check_notebook_call(self, notebook: str | bytes) -> Call[dict[str, Any]]:
        return Call("POST", "/v1/notebooks/verify", _json, content=notebook)

    def _approvals_call(self, state: str | None) -> Call[list[Approval]]:
        params = {"state": state} if state else {}
        return Call("GET", "/v1/approvals", _approval_list, params=params)

    def _approval_call(self, approval_id: str) -> Call[Approval]:
        return Call("GET", f"/v1/approvals/{_segment(approval_id)}", _approval)

    def _decide_call(self, approval_id: str, verb: str, reason: str | None) -> Call[Approval]:
        body = {"reason": reason} if reason else {}
        path = f"/v1/approvals/{_segment(approval_id)}/{verb}"
        return Call("POST", path, _approval, json=body)


def _approval(response: httpx.Response) -> Approval:
    return Approval.from_json(response.json())


def _approval_list(response: httpx.Response) -> list[Approval]:
    return [Approval.from_json(doc) for doc in response.json()["approvals"]]


def _session_info(response: httpx.Response) -> SessionInfo:
    return SessionInfo.from_json(response.json())


def _session_list(response: httpx.Response) -> tuple[list[SessionInfo], str | None]:
    body = response.json()
    return [SessionInfo.from_json(doc) for doc in body["sessions"]], body.get("next")


C = TypeVar("C", bound=BaseClient)


class BaseSession(Generic[C]):
    """A session's calls; ``Session`` and ``AsyncSession`` only send them.

    Used as a context manager a session is deleted on exit unless ``keep`` is
    true (the default for sessions you connect to rather than create).
    """

    files_class: Any = None  # Files or AsyncFiles, set by each half
    commands_class: Any = None  # Commands or AsyncCommands, set by each half

    def __init__(self, client: C, info: SessionInfo, *, keep: bool = False) -> None:
        self.client = client
        self.info = info
        self.keep = keep
        self._owns_client = False  # made by Session.create/connect: closed with the session
        self.files = self.files_class(self)
        self.commands = self.commands_class(self)
        self.tools = ClientTools()  # functions its code calls during a run (register)

    def _with_tools(self, options: Mapping[str, Any]) -> Self:
        """This session, given the client tools a create's ``tools=`` named."""
        for fn in _client_tools(options):
            self.tools.register(fn)
        return self

    @classmethod
    def handle(cls, client: C, session_id: str, *, keep: bool = True) -> Self:
        """A session by id without asking the gateway (``Client.session``).

        ``info`` is a placeholder holding only the id until ``refresh()``; an
        unknown id fails with ``SessionNotFound`` on the first real call.
        """
        return cls(client, SessionInfo.from_json({"id": session_id}), keep=keep)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def sandbox_id(self) -> str:
        """E2B's name for ``id``."""
        return self.info.id

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.info.state}>"

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sessions/{_segment(self.id)}{suffix}"

    def _remember(self, response: httpx.Response) -> SessionInfo:
        self.info = SessionInfo.from_json(response.json())
        return self.info

    def _refresh_call(self) -> Call[SessionInfo]:
        return self.client._describe_call(self.id, self._remember)

    def _action_call(self, action: str) -> Call[SessionInfo]:
        return Call("POST", self._path(f"/{action}"), self._remember)

    def _update_call(
        self, ttl: float | None, idle_timeout: float | None, expires_in: float | None = None
    ) -> Call[SessionInfo]:
        fields = (("ttl", ttl), ("idle_timeout", idle_timeout), ("expires_in", expires_in))
        body = {k: v for k, v in fields if v is not None}
        if not body:
            raise TypeError("set_ttl() needs ttl, idle_timeout or both")
        # Absolute values (expires_in barely moves): sending it twice changes nothing.
        return Call("PATCH", self._path(), self._remember, json=body, idempotent=True)

    def _network_call(self, allow: Sequence[str], deny: Sequence[str]) -> Call[SessionInfo]:
        if isinstance(allow, str) or isinstance(deny, str):
            raise TypeError("update_network() takes a list of hosts for allow and deny, not a str")
        body = {"allow": list(allow), "deny": list(deny)}
        return Call("PATCH", self._path("/network"), self._remember, json=body, idempotent=True)

    def _ports_call(self) -> Call[list[Port]]:
        return Call("GET", self._path("/ports"), lambda r: [Port(**p) for p in r.json()["ports"]])

    def _preview_link_call(self, port: int, expires_in: float) -> Call[PreviewLink]:
        body = {"port": port, "expires_in": expires_in}
        return Call("POST", self._path("/previews"), lambda r: PreviewLink(**r.json()), json=body)

    def preview_url(self, port: int) -> str:
        """Where ``port`` of the sandbox answers (path form; send the client's token)."""
        return f"{self.client.url}{self._path(f'/ports/{int(port)}/')}"

    def get_host(self, port: int) -> str:
        """E2B's name: ``PORT-ID.<the gateway's host>``, the host form of a preview."""
        return f"{int(port)}-{self.id}.{httpx.URL(self.client.url).netloc.decode()}"

    def _metrics_call(self) -> Call[SessionMetrics]:
        return Call("GET", self._path("/metrics"), lambda r: SessionMetrics.from_json(r.json()))

    def _history_call(self, after: int) -> Call[tuple[list[RecordedExecution], int | None]]:
        """One page of history and the cursor of the next (None: the last page).

        A gateway that does not page answers without ``next``: one page.
        """

        def parse(response: httpx.Response) -> tuple[list[RecordedExecution], int | None]:
            body = response.json()
            return [RecordedExecution.from_json(e) for e in body["executions"]], body.get("next")

        params = {"after": after} if after else None
        return Call("GET", self._path("/history"), parse, params=params)

    def _notebook_call(
        self, descriptions: bool, context: Contextual = None
    ) -> Call[dict[str, Any]]:
        params = {} if descriptions else {"descriptions": "false"}
        if context is not None:
            params["context"] = context_id(context)
        return Call("GET", self._path("/notebook"), _json, params=params)

    def _contexts_call(self) -> Call[list[CodeContext]]:
        def parse(response: httpx.Response) -> list[CodeContext]:
            return [CodeContext.from_json(c) for c in response.json()["contexts"]]

        return Call("GET", self._path("/contexts"), parse)

    def _create_context_call(
        self, kernel: str | None, language: str | None, cwd: str | None
    ) -> Call[CodeContext]:
        fields = (("kernel", kernel), ("language", language), ("cwd", cwd))
        body = {k: v for k, v in fields if v is not None}
        return Call("POST", self._path("/contexts"), _code_context, json=body)

    def _context_call(self, context: Contextual, action: str) -> Call[Any]:
        """``restart``, ``interrupt`` (the context's view back) or ``delete`` a context."""
        path = self._path(f"/contexts/{_segment(context_id(context))}")
        if action == "delete":
            return Call("DELETE", path)
        return Call("POST", f"{path}/{action}", _code_context)

    def _delete_call(self) -> Call[None]:
        return Call("DELETE", self._path())

    def _pause_call(self, strategy: str | None) -> Call[SessionInfo]:
        body = {"strategy": strategy} if strategy else {}
        return Call("POST", self._path("/pause"), self._remember, json=body)

    def _take_snapshot_call(self, name: str | None, strategy: str | None) -> Call[Any]:
        body = {k: v for k, v in (("name", name), ("strategy", strategy)) if v is not None}
        return Call("POST", self._path("/snapshots"), self.client._snapshot, json=body)

    def _snapshots_call(self) -> Call[list[Any]]:
        def parse(response: httpx.Response) -> list[Any]:
            make = self.client.snapshot_class
            return [make(self.client, doc) for doc in response.json()["snapshots"]]

        return Call("GET", self._path("/snapshots"), parse)

    def _stream_url(self) -> str:
        return self.client.ws_url(self._path("/stream"))

    def _resume_url(self, run: Run, error: Exception) -> str:
        """Where to pick a dropped stream up again; raise when it cannot be resumed."""
        if run.last_event_id is None or run.resumes >= self.client.retry.retries:
            raise GatewayUnreachable(
                f"the stream of session {self.id} closed before the execution finished "
                f"({error}); see session.history() for what ran"
            ) from error
        run.resumes += 1
        log.info("stream of %s dropped (%s); resuming", self.id, error)
        return f"{self._stream_url()}?last_event_id={quote(run.last_event_id)}"

    @staticmethod
    def _gone(error: GatewayError) -> bool:
        """Whether a delete failed only because the session is already gone."""
        return isinstance(error, NotFound | SessionEnded)

    @staticmethod
    def _write_notebook(notebook: dict[str, Any], path: str | Path | None) -> dict[str, Any]:
        if path is not None:
            Path(path).write_text(json.dumps(notebook, indent=1))
        return notebook


class VolumeOwner:
    """What ``Files`` asks of the session it belongs to, for a named volume's files instead:
    the same calls (streamed writes and reads, list, remove) on ``/v1/volumes/{name}/files``."""

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    def _path(self, suffix: str = "") -> str:
        return f"/v1/volumes/{_segment(self.name)}{suffix}"


class BaseFiles(abc.ABC):
    """A session's workspace calls; ``Files`` and ``AsyncFiles`` only send them."""

    def __init__(self, session: BaseSession[Any]) -> None:
        self.session = session

    def _path(self, path: str) -> str:
        return self.session._path(f"/files/{file_path(path)}")

    def _write_call(
        self, path: str, data: bytes | str | IO[bytes], on_progress: Progress | None
    ) -> Call[FileInfo]:
        """Bytes are sent whole (and may be retried); a file object is streamed."""
        streamed = not isinstance(data, bytes | bytearray | memoryview | str)
        if streamed:
            size = self._remaining(data)  # type: ignore[arg-type]
            content = self._chunks(data, size, on_progress)
        else:
            content = data.encode() if isinstance(data, str) else bytes(data)  # type: ignore[arg-type]
            size = len(content)

        def parse(response: httpx.Response) -> FileInfo:
            info = FileInfo.from_json({**response.json(), "type": "file"})
            if on_progress is not None and not streamed:
                on_progress(info.size or 0, size)
            return info

        headers = None if size is None else {"Content-Length": str(size)}
        return Call(
            "PUT",
            self._path(path),
            parse,
            content=content,
            headers=headers,
            idempotent=not streamed,
        )

    @abc.abstractmethod
    def _chunks(self, file: Any, size: int | None, on_progress: Progress | None) -> Any:
        """The file's content as the half's (sync or async) iterator of chunks."""

    def _read_call(self, path: str, archive: str | None = None) -> Call[bytes]:
        """A file's content, or with ``archive`` ("tar" or "zip") a directory's as one."""
        if archive not in (None, "tar", "zip"):
            raise ValueError(f"archive must be 'tar' or 'zip', not {archive!r}")
        params = {"format": archive} if archive else None
        return Call("GET", self._path(path.rstrip("/")), lambda r: r.content, params=params)

    @staticmethod
    def _check_size(path: str, response: httpx.Response, max_bytes: int) -> None:
        """Refuse a download over ``max_bytes`` from its header, before its body is read."""
        size = int(response.headers.get("Content-Length", 0))
        if size > max_bytes:
            raise FileTooLarge(f"{path} is {size} bytes, over the {max_bytes}-byte limit")

    @staticmethod
    def _parent(path: str) -> tuple[str, str]:
        """(the directory to list to find ``path``, ``path`` as listings spell it)."""
        clean = path.strip("/")
        return clean.rpartition("/")[0], clean

    @staticmethod
    def _local_tree(source: str | Path, into: str) -> list[tuple[Path, str]]:
        """(local file, workspace path) for every regular file under ``source``; links skipped."""
        root = Path(source)
        if not root.is_dir():
            raise NotADirectoryError(f"{source} is not a directory")
        prefix = into.strip("/")
        return [
            (local, "/".join(filter(None, (prefix, local.relative_to(root).as_posix()))))
            for local in sorted(root.rglob("*"))
            if local.is_file() and not local.is_symlink()
        ]

    @staticmethod
    def _extract(archive: Path, dest: Path) -> Path:
        """Unpack a downloaded directory archive into ``dest``, refusing paths that leave it."""
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(dest, filter="data")
        return dest

    def _list_call(self, path: str) -> Call[list[FileInfo]]:
        return Call(
            "GET",
            self.session._path("/files"),
            lambda r: [FileInfo.from_json(row) for row in r.json()["entries"]],
            params={"path": path},
        )

    def _remove_call(self, path: str) -> Call[None]:
        return Call("DELETE", self._path(path))

    def _rename_call(self, old: str, new: str) -> Call[FileInfo]:
        return Call(
            "POST",
            self.session._path("/rename"),
            lambda r: FileInfo.from_json(r.json()),
            json={"from": old, "to": new},
        )

    def _make_dir_call(self, path: str) -> Call[bool]:
        """True when it made the directory, False if it was there already."""
        return Call(
            "POST",
            self.session._path("/directories"),
            lambda r: r.status_code == 201,
            json={"path": path},
            idempotent=True,  # making a directory twice leaves one directory
        )

    @staticmethod
    def _remaining(file: IO[bytes]) -> int | None:
        """Bytes left to read in a file object, when it can tell."""
        try:
            return os.fstat(file.fileno()).st_size - file.tell()
        except (AttributeError, OSError, ValueError):
            return None

    @staticmethod
    def _cut(path: str, got: int, error: BaseException) -> GatewayUnreachable:
        """A download whose connection broke after its headers: some of it came, not all."""
        return GatewayUnreachable(
            f"the download of {path!r} broke off after {got} bytes "
            f"({error or type(error).__name__}); nothing of it is whole: download it again"
        )

    @staticmethod
    def _partial(dest: str | Path) -> tuple[Path, Path]:
        """The destination and the temporary name a download is written under first."""
        dest = Path(dest)
        return dest, dest.with_name(f".{dest.name}.sbx-part")


class CommandOptions(TypedDict, total=False):
    """How ``session.commands.run`` runs a command; anything left out: the gateway's default."""

    timeout: float  # seconds before it is killed (default: the session's limits.timeout)
    env: Mapping[str, str]
    cwd: str  # relative to the workspace


class BaseCommands:
    """Shell commands in the session's sandbox, beside its kernel; ``Commands`` and
    ``AsyncCommands`` only send them."""

    def __init__(self, session: BaseSession[Any]) -> None:
        self.session = session

    def _run_call(self, command: str, options: Mapping[str, Any]) -> Call[CommandResult]:
        """Run ``command`` with ``/bin/sh`` and wait for its end.

        Never retried (it may have started), and no read timeout: the gateway ends the
        command at its time limit and answers.
        """
        if not isinstance(command, str) or not command.strip():
            raise TypeError(f"a command is a shell command line such as 'ls -l', not {command!r}")
        unknown = set(options) - set(CommandOptions.__annotations__)
        if unknown:
            raise TypeError(
                f"unknown command option(s) {sorted(unknown)}: commands.run takes "
                f"{', '.join(CommandOptions.__annotations__)} and returns when the command ends"
            )
        body = {"command": command, **{k: v for k, v in options.items() if v is not None}}
        if body.get("env") is not None:
            body["env"] = dict(body["env"])
        return Call(
            "POST",
            self.session._path("/commands"),
            lambda r: CommandResult.from_json(r.json()),
            json=body,
            timeout=httpx.Timeout(None, connect=self.session.client.timeout.connect),
        )


class BaseSnapshot(Generic[C]):
    """A snapshot of a session's kernel state and files; ``Snapshot``/``AsyncSnapshot`` act on it.

    ``lost`` lists the names its kernel state could not keep; ``raw`` is the
    gateway's whole answer.
    """

    def __init__(self, client: C, doc: dict[str, Any]) -> None:
        self.client = client
        self.raw = doc
        self.id: str = str(doc["id"])
        self.session_id: str = str(doc.get("session_id", ""))
        self.name: str | None = doc.get("name")
        self.created_at: str | None = doc.get("created_at")
        self.size_bytes: int = int(doc.get("size_bytes") or 0)
        self.strategy: str = str(doc.get("strategy", ""))
        self.lost: list[dict[str, Any]] = list(doc.get("lost") or [])

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} of {self.session_id} ({self.strategy})>"

    def _delete_call(self) -> Call[None]:
        return Call("DELETE", f"/v1/snapshots/{_segment(self.id)}")
