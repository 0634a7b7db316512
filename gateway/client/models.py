"""What the SDK hands back: executions, their results and errors, files, session views.

Each is built from the gateway's JSON and keeps it (``raw``), so fields the
server adds later are never lost; parsing ignores what it does not know.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Raster images, base64 in a MIME bundle (SVG is text); replays compare them as pixels.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def strip_ansi(text: str) -> str:
    """Drop terminal colour codes, as kernels put in tracebacks."""
    return _ANSI.sub("", text)


def join_text(value: Any) -> str:
    """A MIME bundle or stream value as text: nbformat allows a string or a list of lines."""
    return "".join(value) if isinstance(value, list) else str(value)


@dataclasses.dataclass
class Result:
    """One rich output (``display_data`` or ``execute_result``) and its MIME bundle."""

    data: dict[str, Any]
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    is_main: bool = False  # the cell's value (execute_result), not a display() call

    @classmethod
    def from_output(cls, output: dict[str, Any]) -> Result:
        kind = output.get("output_type") or output.get("type")
        return cls(
            data=dict(output.get("data") or {}),
            metadata=dict(output.get("metadata") or {}),
            is_main=kind == "execute_result",
        )

    @property
    def formats(self) -> list[str]:
        return list(self.data)

    def get(self, mime: str) -> str | None:
        """The bundle's value for ``mime`` as text, or None."""
        value = self.data.get(mime)
        return None if value is None else join_text(value)

    def binary(self, mime: str) -> bytes | None:
        """The bundle's base64 value for ``mime`` decoded, or None."""
        value = self.get(mime)
        return None if value is None else base64.b64decode(value)

    @property
    def text(self) -> str | None:
        return self.get("text/plain")

    @property
    def html(self) -> str | None:
        return self.get("text/html")

    @property
    def markdown(self) -> str | None:
        return self.get("text/markdown")

    @property
    def svg(self) -> str | None:
        return self.get("image/svg+xml")

    @property
    def png(self) -> bytes | None:
        return self.binary("image/png")

    @property
    def jpeg(self) -> bytes | None:
        return self.binary("image/jpeg")

    @property
    def json(self) -> Any:
        """The ``application/json`` value, decoded (kernels send it as an object)."""
        value = self.data.get("application/json")
        return json.loads(value) if isinstance(value, str) else value

    @property
    def images(self) -> dict[str, bytes]:
        """Every raster image in the bundle, by MIME type."""
        return {
            mime: base64.b64decode(join_text(value))
            for mime, value in self.data.items()
            if mime.startswith("image/") and mime != "image/svg+xml"
        }

    # IPython's display hooks: a Result shown in Jupyter renders as the kernel's output did.
    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return dict(self.data), dict(self.metadata)

    def _repr_html_(self) -> str | None:
        return self.html

    def _repr_markdown_(self) -> str | None:
        return self.markdown

    def _repr_svg_(self) -> str | None:
        return self.svg

    def _repr_png_(self) -> bytes | None:
        return self.png

    def _repr_jpeg_(self) -> bytes | None:
        return self.jpeg


@dataclasses.dataclass
class ExecutionError:
    """What the code raised (or why it stopped: timeout, interrupt, dead kernel)."""

    name: str
    value: str
    traceback: list[str]  # as the kernel sent it, with colour codes

    @classmethod
    def from_json(cls, error: dict[str, Any]) -> ExecutionError:
        return cls(
            name=str(error.get("ename", "")),
            value=str(error.get("evalue", "")),
            traceback=[str(line) for line in error.get("traceback") or []],
        )

    @property
    def text(self) -> str:
        """The traceback as plain text, to show or to feed back to a model."""
        body = strip_ansi("\n".join(self.traceback))
        return body or f"{self.name}: {self.value}"

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclasses.dataclass
class Artifact:
    """A file an execution created or modified in the workspace."""

    path: str
    size: int
    mime_type: str
    change: str  # "created" | "modified"
    sha256: str | None = None  # None past the gateway's hashing budget

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Artifact:
        return cls(
            path=str(row["path"]),
            size=int(row.get("size") or 0),
            mime_type=str(row.get("mime_type") or "application/octet-stream"),
            change=str(row.get("change") or "created"),
            sha256=row.get("sha256"),
        )


@dataclasses.dataclass
class Execution:
    """One finished execution: outputs in nbformat shape plus helpers to read them."""

    status: str  # ok | error | timeout | interrupted | dead
    execution_count: int | None
    outputs: list[dict[str, Any]] = dataclasses.field(repr=False)
    error: ExecutionError | None
    duration_ms: float
    truncated: bool
    artifacts: list[Artifact]
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, reply: dict[str, Any]) -> Execution:
        error = reply.get("error")
        return cls(
            status=str(reply.get("status", "")),
            execution_count=reply.get("execution_count"),
            outputs=list(reply.get("outputs") or []),
            error=ExecutionError.from_json(error) if isinstance(error, dict) else None,
            duration_ms=float(reply.get("duration_ms") or 0.0),
            truncated=bool(reply.get("truncated")),
            artifacts=[Artifact.from_json(a) for a in reply.get("artifacts") or []],
            raw=reply,
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def _stream(self, name: str) -> str:
        return "".join(self._chunks(name))

    @property
    def stdout(self) -> str:
        return self._stream("stdout")

    @property
    def stderr(self) -> str:
        return self._stream("stderr")

    @property
    def results(self) -> list[Result]:
        return [
            Result.from_output(o)
            for o in self.outputs
            if o.get("output_type") in ("display_data", "execute_result")
        ]

    @property
    def result(self) -> Result | None:
        """The cell's value (its last expression), if it had one."""
        return next((r for r in self.results if r.is_main), None)

    @property
    def text(self) -> str | None:
        """The cell's value as text (``text/plain`` of the main result), if it had one."""
        result = self.result
        return None if result is None else result.text

    @property
    def logs(self) -> Logs:
        """The stream outputs as E2B's ``Execution.logs``: lists of chunks, as written."""
        return Logs(self._chunks("stdout"), self._chunks("stderr"))

    def _chunks(self, name: str) -> list[str]:
        return [
            join_text(o.get("text", ""))
            for o in self.outputs
            if o.get("output_type") == "stream" and o.get("name") == name
        ]

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Shown in Jupyter: the cell's value as it rendered, else its text and error."""
        if self.result is not None:
            return self.result._repr_mimebundle_()
        text = self.stdout + self.stderr + (self.error.text if self.error else "")
        return {"text/plain": text or f"<Execution {self.status}>"}, {}


@dataclasses.dataclass
class RecordedExecution(Execution):
    """One execution as the session's history recorded it (``session.history()``)."""

    id: int = 0
    code: str = ""
    description: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    files: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # created, changed...

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RecordedExecution:
        base = Execution.from_json(doc)
        return cls(
            **{f.name: getattr(base, f.name) for f in dataclasses.fields(Execution)},
            id=int(doc.get("id") or 0),
            code=str(doc.get("code") or ""),
            description=doc.get("description"),
            started_at=doc.get("started_at"),
            ended_at=doc.get("ended_at"),
            files=list(doc.get("files") or []),
        )


@dataclasses.dataclass
class ReplayCell:
    """How one code cell replayed: ``same``, ``different``, ``error`` or ``skipped``."""

    index: int
    cell_id: str | None
    result: str
    status: str | None
    recorded_status: str | None
    diff: str

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ReplayCell:
        return cls(**{f.name: doc.get(f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass
class ReplayReport:
    """A notebook's replay (``client.replay``): the verdict, per cell, and the run notebook."""

    reproduced: bool
    summary: dict[str, int]
    cells: list[ReplayCell]
    warnings: list[str]
    inputs: list[str]
    image: str | None
    image_digest: str | None
    notebook: dict[str, Any] = dataclasses.field(repr=False)
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ReplayReport:
        return cls(
            reproduced=bool(doc.get("reproduced")),
            summary=dict(doc.get("summary") or {}),
            cells=[ReplayCell.from_json(c) for c in doc.get("cells") or []],
            warnings=list(doc.get("warnings") or []),
            inputs=list(doc.get("inputs") or []),
            image=doc.get("image"),
            image_digest=doc.get("image_digest"),
            notebook=doc.get("notebook") or {},
            raw=doc,
        )


@dataclasses.dataclass
class Logs:
    """What the code wrote to stdout and stderr, chunk by chunk."""

    stdout: list[str]
    stderr: list[str]


@dataclasses.dataclass
class Approval:
    """An execute held for an approver, or the decision on it (docs/approvals.md)."""

    id: str
    state: str  # pending | approved | denied
    session_id: str = ""
    code: str = ""
    reasons: list[str] = dataclasses.field(default_factory=list)
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reason: str | None = None  # the approver's, or why the gateway denied it
    decided_by: str | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Approval:
        """From an approval document, or a ``pending_approval`` event (202 body) of its id."""
        return cls(
            id=str(doc.get("approval_id") or doc.get("id")),  # an event's id is its request's
            state=str(doc.get("state", "pending")).replace("pending_approval", "pending"),
            session_id=str(doc.get("session_id", "")),
            code=str(doc.get("code", "")),
            reasons=list(doc.get("reasons") or []),
            findings=list(doc.get("findings") or []),
            reason=doc.get("reason"),
            decided_by=doc.get("decided_by"),
            raw=doc,
        )


@dataclasses.dataclass
class FileInfo:
    """An entry of the session's workspace."""

    name: str
    path: str
    type: str  # file | directory | symlink | other
    size: int | None
    modified: str | None

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> FileInfo:
        path = str(row["path"])
        return cls(
            name=str(row.get("name") or path.rsplit("/", 1)[-1]),
            path=path,
            type=str(row.get("type") or "file"),
            size=row.get("size"),
            modified=row.get("modified"),
        )


@dataclasses.dataclass
class SessionInfo:
    """The gateway's view of a session when it was last fetched."""

    id: str
    state: str
    kernel: str
    reason: str | None
    limits: dict[str, Any]
    ttl: float | None
    idle_timeout: float | None
    metadata: dict[str, Any]
    created_at: str | None
    expires_at: str | None
    last_activity: str | None
    executions: int
    raw: dict[str, Any] = dataclasses.field(repr=False)
    network: str | dict[str, list[str]] = "none"  # "none", or its allow (and deny) lists

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SessionInfo:
        return cls(
            id=str(doc["id"]),
            state=str(doc.get("state", "")),
            kernel=str(doc.get("kernel", "")),
            reason=doc.get("reason"),
            limits=dict(doc.get("limits") or {}),
            ttl=doc.get("ttl"),
            idle_timeout=doc.get("idle_timeout"),
            metadata=dict(doc.get("metadata") or {}),
            created_at=doc.get("created_at"),
            expires_at=doc.get("expires_at"),
            last_activity=doc.get("last_activity"),
            executions=int(doc.get("executions") or 0),
            raw=doc,
            network=doc.get("network") or "none",
        )


@dataclasses.dataclass(frozen=True)
class CodeContext:
    """A kernel in a session's sandbox: its own (id ``default``) or another, with variables of
    its own over the same files (``Session.create_context``)."""

    id: str
    kernel: str
    language: str
    cwd: str
    state: str  # running, or stopped (its next run starts it empty: ``raw["stopped"]`` says why)
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CodeContext:
        return cls(
            id=str(doc["id"]),
            kernel=str(doc.get("kernel", "")),
            language=str(doc.get("language", "")),
            cwd=str(doc.get("cwd", "")),
            state=str(doc.get("state", "")),
            raw=doc,
        )


@dataclasses.dataclass(frozen=True)
class Port:
    """A TCP port something listens on in a sandbox, and its preview URL (path form)."""

    port: int
    url: str


@dataclasses.dataclass(frozen=True)
class PreviewLink:
    """A signed, expiring link to one port of a session, for a person in a browser."""

    port: int
    url: str  # the host form (PORT-ID.<host>) when the gateway was reached by name
    path_url: str
    expires_at: int


@dataclasses.dataclass
class SessionMetrics:
    """What a session uses now (``session.get_metrics()``); None where it cannot be told."""

    cpu_seconds: float | None
    memory_bytes: int | None
    memory_peak_bytes: int | None
    memory_limit_bytes: int | None
    network_bytes_sent: int
    network_bytes_received: int
    disk_bytes: int | None
    disk_limit_bytes: int | None
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SessionMetrics:
        network = doc.get("network") or {}
        return cls(
            cpu_seconds=doc.get("cpu_seconds"),
            memory_bytes=doc.get("memory_bytes"),
            memory_peak_bytes=doc.get("memory_peak_bytes"),
            memory_limit_bytes=doc.get("memory_limit_bytes"),
            network_bytes_sent=int(network.get("bytes_sent") or 0),
            network_bytes_received=int(network.get("bytes_received") or 0),
            disk_bytes=doc.get("disk_bytes"),
            disk_limit_bytes=doc.get("disk_limit_bytes"),
            raw=doc,
        )


@dataclasses.dataclass
class CommandResult:
    """A shell command's end (``session.commands.run``).

    A command that fails is not an exception, as a failing cell is not: read
    ``exit_code`` (None when it was killed at its time limit: ``timed_out``).
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool  # output past the session's limits.output_bytes was dropped
    pid: int | None
    duration_ms: float | None
    raw: dict[str, Any] = dataclasses.field(repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CommandResult:
        return cls(
            exit_code=doc.get("exit_code"),
            stdout=str(doc.get("stdout") or ""),
            stderr=str(doc.get("stderr") or ""),
            timed_out=bool(doc.get("timed_out")),
            truncated=bool(doc.get("truncated")),
            pid=doc.get("pid"),
            duration_ms=doc.get("duration_ms"),
            raw=doc,
        )
