"""What the CLI shows a person: tables, progress bars, and executions as they stream.

Built on ``rich``. Program output (the code's stdout, results) goes to
stdout; what the CLI itself says (progress, saved files, the summary line)
goes to stderr, so ``sbx exec ... > out.txt`` captures only the program's.
Animations appear only on a terminal; piped output stays plain.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ..client import Approval, Execution, ExecutionError, FileInfo, Result, SessionInfo
from ..client.models import strip_ansi
from ..limits import format_size

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
if not out.is_terminal:
    out.width = 10_000  # piped tables keep whole rows instead of shrinking to 80 columns

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg"}


def print_json(value: Any) -> None:
    out.out(json.dumps(value, indent=2, default=str), highlight=False)


def snapshot_lines(snapshots: list[Any]) -> None:
    """One line per snapshot: id, when, size, strategy, name."""
    for s in snapshots:
        print(f"{s.id}  {s.created_at}  {s.size_bytes:>12}  {s.strategy:<9}  {s.name or ''}")


def _when(iso: str | None) -> str:
    """An API timestamp as ``YYYY-MM-DD HH:MM:SS`` (UTC), compact for tables."""
    return (iso or "-").replace("T", " ").split(".")[0].removesuffix("Z")


def _until(iso: str | None) -> str:
    """How long until an API timestamp, as people say it: ``in 59 min``."""
    if not iso:
        return "-"
    left = (datetime.fromisoformat(iso.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()
    if left <= 0:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if left >= size:
            return f"in {left / size:.0f} {unit}"
    return f"in {left:.0f} s"


def _metadata(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


def sessions_table(sessions: list[SessionInfo]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("ID", "STATE", "KERNEL", "CREATED (UTC)", "EXPIRES", "EXECS", "METADATA"):
        table.add_column(name, no_wrap=name in ("ID", "STATE"), justify="right" * (name == "EXECS"))
    for s in sessions:
        table.add_row(
            s.id,
            s.state,
            s.kernel,
            _when(s.created_at),
            _until(s.expires_at),
            str(s.executions),
            escape(_metadata(s.metadata)),
        )
    return table


def approvals_table(approvals: list[Approval]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("ID", "STATE", "SESSION", "REASONS", "CODE"):
        table.add_column(name, no_wrap=name in ("ID", "STATE", "SESSION"))
    for a in approvals:
        first_line = a.code.strip().splitlines()[0] if a.code.strip() else ""
        table.add_row(
            a.id, a.state, a.session_id[:8], escape("; ".join(a.reasons)), escape(first_line)
        )
    return table


def session_table(info: SessionInfo) -> Table:
    """One session as a two-column table of its fields."""
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    limits = dict(info.limits)
    for key in ("memory", "disk", "output_bytes"):
        if isinstance(limits.get(key), int):
            limits[key] = format_size(limits[key])
    rows = {
        "id": info.id,
        "state": info.state + (f" ({info.reason})" if info.reason else ""),
        "kernel": info.kernel,
        "image": info.raw.get("image"),
        "limits": ", ".join(f"{k} {v}" for k, v in limits.items()),
        "ttl": f"{info.ttl:g} s (expires {_when(info.expires_at)} UTC)" if info.ttl else None,
        "idle timeout": f"{info.idle_timeout:g} s" if info.idle_timeout else None,
        "created": f"{_when(info.created_at)} UTC",
        "last activity": f"{_when(info.last_activity)} UTC",
        "executions": str(info.executions),
        "env": ", ".join(info.raw.get("env") or {}),
        "metadata": _metadata(info.metadata),
    }
    for key, value in rows.items():
        if value:
            table.add_row(key, escape(str(value)))
    return table


def files_table(entries: list[FileInfo]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("PATH", no_wrap=True)
    table.add_column("TYPE")
    table.add_column("SIZE", justify="right")
    table.add_column("MODIFIED (UTC)")
    for e in entries:
        size = format_size(e.size) if e.size is not None else "-"
        path = e.path + ("/" if e.type == "directory" else "")
        table.add_row(escape(path), e.type, size, _when(e.modified))
    return table


@contextlib.contextmanager
def transfer(
    description: str, total: int | None = None
) -> Iterator[Callable[[int, int | None], None]]:
    """A progress bar for an upload or download; yields the SDK's ``on_progress`` callback."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    with progress:
        task = progress.add_task(escape(description), total=total)

        def update(done: int, size: int | None) -> None:
            progress.update(task, completed=done, total=size)

        yield update


@contextlib.contextmanager
def replay_progress(description: str) -> Iterator[Callable[[Any, int, int], None] | None]:
    """A bar over a replay's code cells, a line per cell decided above it, on a terminal.

    Yields the SDK's ``on_cell`` callback, or None when stderr is not a terminal
    (piped output stays as it was: the report alone).
    """
    if not err.is_terminal:
        yield None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("cells"),
        console=err,
        transient=True,
    )
    with progress:
        task = progress.add_task(escape(description), total=None)
        colours = {"same": "green", "skipped": "dim", "different": "yellow", "error": "red"}

        def on_cell(cell: Any, done: int, total: int) -> None:
            colour = colours.get(cell.result, "red")
            name = escape(f"cell {done}/{total} [{cell.cell_id}]")
            err.print(f"{name}: [{colour}]{cell.result}[/{colour}]")
            progress.update(task, completed=done, total=total)

        yield on_cell


def waiting(message: str) -> contextlib.AbstractContextManager[Any]:
    """A spinner while a person waits (starting a session, a replay); silent when piped."""
    if not err.is_terminal:
        return contextlib.nullcontext()
    return err.status(escape(message))


class ExecutionPrinter:
    """SDK callbacks that show an execution as it streams; images are saved to files."""

    def __init__(self, directory: Path, stem: str) -> None:
        self.directory = directory
        self.stem = stem

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_stdout": self.stdout,
            "on_stderr": self.stderr,
            "on_result": self.result,
            "on_error": self.error,
            "on_pending": self.pending,
        }

    @staticmethod
    def pending(approval: Approval) -> None:
        """Say why the run waits, and how an approver lets it go on."""
        err.print(f"held for approval {approval.id}; waiting for an approver:")
        for reason in approval.reasons:
            err.print(f"  {escape(reason)}")
        err.print(f"  (sbx approve {approval.id} | sbx deny {approval.id}, with another token)")

    @staticmethod
    def stdout(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    @staticmethod
    def stderr(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def result(self, result: Result) -> None:
        images = [mime for mime in _EXTENSIONS if mime in result.data]
        for mime in images:
            path = self._save(result, mime)
            err.print(f"[dim]saved {mime} to {escape(str(path))}[/dim]")
        if images:
            return
        text = result.text or result.markdown
        if text is not None:
            self.stdout(text.rstrip("\n") + "\n")
        elif result.formats:
            err.print(f"[dim]\\[{', '.join(result.formats)} result not shown][/dim]")

    def _save(self, result: Result, mime: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        n = 1
        while (path := self.directory / f"{self.stem}-{n}.{_EXTENSIONS[mime]}").exists():
            n += 1
        if mime == "image/svg+xml":  # SVG is text
            path.write_text(result.svg or "")
        else:
            path.write_bytes(result.binary(mime) or b"")
        return path

    @staticmethod
    def error(error: ExecutionError) -> None:
        text = "\n".join(error.traceback) or str(error)
        sys.stderr.write((text if err.is_terminal else strip_ansi(text)) + "\n")
        sys.stderr.flush()


def summary(execution: Execution) -> None:
    """One line on stderr: how it ended, how long it took, which files it made."""
    style = "green" if execution.ok else "red"
    parts = [f"[{style}]{execution.status}[/{style}]"]
    if execution.execution_count is not None:
        parts.append(f"execution {execution.execution_count}")
    parts.append(f"{execution.duration_ms:.0f} ms")
    if execution.truncated:
        parts.append("[yellow]output truncated[/yellow]")
    if execution.status != "error" and execution.error is not None:
        parts.append(escape(f"{execution.error.name}: {execution.error.value}"))
    if execution.artifacts:
        files = ", ".join(f"{a.path} ({format_size(a.size)})" for a in execution.artifacts)
        parts.append(escape(f"files: {files}"))
    err.print(" · ".join(parts))
