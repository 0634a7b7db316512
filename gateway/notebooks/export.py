"""Sessions as notebooks: export the recorded history, and replay it.

Export reads only the store, so it works for live and ended sessions alike,
and copies outputs exactly as the client got them. Replay runs a notebook's
code cells in a fresh session of the recorded kernel, image and limits and
says, cell by cell, whether the outputs reproduced (rules in ``compare``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .. import __version__
from ..access.auth import Principal
from ..errors import BadRequest, NotFound
from ..execution.recorder import CELL, CUT_BY_RESTART, context_of, kind_of
from ..sessions.executions import Executions
from ..sessions.manager import SessionManager
from ..sessions.reports import Reports
from ..sessions.requests import CreateSession, ExecuteCode
from ..sessions.workspaces import Workspaces
from ..validation import image_ref
from .compare import IGNORE_OUTPUT_TAGS, SKIP_TAGS, diff_outputs, float_tolerance

log = logging.getLogger(__name__)

# Statuses whose cells a notebook runner must not stop at ("running": exported mid-run).
_FAILED = ("error", "timeout", "interrupted", "dead", "denied", CUT_BY_RESTART, "running")


async def export_chunks(
    manager: SessionManager,
    reports: Reports,
    session_id: str,
    who: Principal,
    descriptions: bool = True,
    context: str | None = None,
) -> AsyncIterator[str]:
    """The session as nbformat v4 JSON text, a page of history at a time.

    A notebook holds one kernel's cells: the session's own (``context`` None),
    or those of the code context named (a notebook per context, replayed in a
    session of its kernel).

    Memory is bounded by a page of history (``Store.history``), not by the
    session; cells are built (nbformat validates each) and encoded off the
    event loop. The text is what ``json.dumps(notebook, indent=1)`` would
    write, with the cells last.
    """
    session = _as_context(await manager.record(session_id, who), context)
    inputs = await reports.uploads(session_id, who)
    chain = await reports.chain_head(session_id, who)  # what `sbx audit check-notebook` checks
    head = json.dumps(_notebook(session, inputs, chain), indent=1)
    yield head.removesuffix("\n}") + ',\n "cells": ['
    after: int | None = 0
    first = True
    while after is not None:
        page = await reports.history(session_id, who, after=after)
        if page.executions:
            ran = [e for e in page.executions if context_of(e) == context]
            yield await asyncio.to_thread(_cells_json, ran, descriptions, first)
            first = first and not ran
        after = page.next
    yield "\n ]\n}\n"


def _as_context(session: dict[str, Any], context: str | None) -> dict[str, Any]:
    """A session record as the notebook of one of its code contexts shows it (its kernel)."""
    contexts = {c["id"]: c for c in session.get("contexts") or ()}
    if context is None:
        return {**session, "context_ids": list(contexts)}
    found = contexts.get(context)
    if found is None:
        raise NotFound(
            f"session {session['id']} has no code context {context[:64]!r} (a removed one's "
            "cells stay in its history); GET /v1/sessions/{id}/contexts lists them"
        )
    return {
        **session,
        "kernel": found["kernel"],
        "display_name": found["kernel"],
        "language_info": {"name": found["language"]},
        "context": context,
    }


def _notebook(
    session: dict[str, Any], inputs: list[dict[str, Any]], chain: dict[str, Any]
) -> dict[str, Any]:
    """A notebook's top level from a session record, without its cells.

    ``inputs``: the files uploaded to the session, which a replay has to bring;
    ``chain``: the head of the session's hash chain of records when exported.
    """
    language_info = session.get("language_info") or {}
    nb = new_notebook(
        metadata={
            "kernelspec": {
                "name": session["kernel"],
                "display_name": session.get("display_name") or session["kernel"],
                "language": language_info.get("name", ""),
            },
            "language_info": language_info,
            "sbx": {
                "session_id": session["id"],
                "image": session["image"],
                "image_digest": session.get("image_digest"),
                "limits": session["limits"],
                "created_at": session["created_at"],
                "ended_at": session.get("ended_at"),
                "state": session["state"],
                "reason": session.get("reason"),
                "packages": session.get("packages", []),
                "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "gateway_version": __version__,
                "inputs": inputs,
                "chain": chain,
                **({"forked_from": session["forked_from"]} if session.get("forked_from") else {}),
                # The code context whose cells these are; or, in the session's own, the others.
                **({"context": session["context"]} if "context" in session else {}),
                **({"contexts": session["context_ids"]} if session.get("context_ids") else {}),
            },
        }
    )
    del nb["cells"]
    return nb


def _cells_json(executions: list[dict[str, Any]], descriptions: bool, first: bool) -> str:
    """Executions as the JSON of their cells, indented to sit in the notebook's list."""
    cells = []
    for execution in executions:
        if kind_of(execution) != CELL:
            continue  # a client's silent execute or a command: in the history, not a cell
        if descriptions and execution.get("description"):
            cells.append(new_markdown_cell(execution["description"], id=f"note-{execution['id']}"))
        cells.append(_code_cell(execution))
    # json.dumps escapes newlines inside strings: every newline here is layout.
    text = ",".join("\n  " + json.dumps(cell, indent=1).replace("\n", "\n  ") for cell in cells)
    return text if first else "," + text


def _code_cell(execution: dict[str, Any]) -> Any:
    status = execution["status"]
    cell = new_code_cell(
        execution["code"],
        id=f"exec-{execution['id']}",
        execution_count=execution["execution_count"],
        outputs=[nbformat.from_dict(o) for o in execution["outputs"]],
    )
    started, ended = execution["started_at"], execution["ended_at"]
    # The keys JupyterLab's "record timing" writes, so its tooling reads ours.
    timing = {
        "iopub.status.busy": started,
        "iopub.execute_input": started,
        "shell.execute_reply": ended,
        "iopub.status.idle": ended,
    }
    cell.metadata["execution"] = {k: v for k, v in timing.items() if v is not None}
    sbx: dict[str, Any] = {"status": status, "duration_ms": execution["duration_ms"]}
    if execution.get("truncated"):
        sbx["truncated"] = True
    if execution.get("network"):
        sbx["network"] = execution["network"]  # the connections the cell made
    if status in _FAILED:
        sbx["error"] = execution["error"]
        cell.metadata["tags"] = ["raises-exception"]
    review = execution.get("review")
    if review and (review["decision"]["findings"] or review["decision"]["reasons"]):
        sbx["review"] = review  # the policy's findings and decision, and who approved
    if review and review.get("tools"):
        sbx["tools"] = review["tools"]  # the tool calls its code made, each as decided
    cell.metadata["sbx"] = sbx
    return cell


async def read_notebook(body: Any) -> Any:
    """Parse and validate a client's notebook off the event loop, as a 400 when it is not one.

    Its size is the request body's limit (``max_request_body``).
    """
    return await asyncio.to_thread(_parse_notebook, body)


def _parse_notebook(body: Any) -> Any:
    """Only version 4 is taken, as exports are: nbformat would read anything
    without a version as a version 1 notebook and convert it, so a stray JSON
    object would replay as an empty notebook.
    """
    try:
        if isinstance(body, bytes):
            body = body.decode()
        data = json.loads(body) if isinstance(body, str) else body
        if not isinstance(data, dict) or data.get("nbformat") != 4:
            version = data.get("nbformat") if isinstance(data, dict) else None
            raise ValueError(f"nbformat is {version!r}, not 4 (save it in a current Jupyter)")
        nb = nbformat.from_dict(data)
        nbformat.validate(nb)
    except Exception as e:  # nbformat raises several unrelated types
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise BadRequest(f"not a valid nbformat v4 notebook: {reason}") from e
    return nb


async def replay_notebook(
    manager: SessionManager,
    executions: Executions,
    workspaces: Workspaces,
    nb: Any,
    who: Principal,
    image_tolerance: float | None = None,
    inputs: dict[str, bytes] | None = None,
    on_cell: Callable[[dict[str, Any], int, int], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run a notebook's code cells in a fresh session of ``who``'s and compare every cell.

    ``inputs`` (workspace path -> content) are written before the first cell;
    one whose SHA-256 differs from the notebook's record is refused first.
    ``on_cell(verdict, done, total)`` hears of each code cell as it is decided,
    so a person watching a long replay sees it move.
    """
    recorded = nb.metadata.get("sbx", {})
    kernel = nb.metadata.get("kernelspec", {}).get("name") or "python3"
    inputs = {path.strip("/"): data for path, data in (inputs or {}).items()}
    warnings = _check_inputs(recorded.get("inputs") or [], inputs)
    for cell in nb.cells:  # a malformed tag is the caller's to fix, before anything runs
        try:
            float_tolerance(cell.metadata.get("tags") or [])
        except ValueError as e:
            raise BadRequest(f"cell {cell.get('id')}: {e}") from None
    image = await _recorded_image(manager, recorded.get("image"), warnings)
    request = CreateSession.from_json(
        {
            "kernel": kernel,
            "image": image,
            "limits": recorded.get("limits"),
            "metadata": {"replay_of": str(recorded.get("session_id", ""))},
        }
    )
    session = await manager.create(request, who)
    warnings += _environment_warnings(recorded, session.image_digest, session.packages)
    executed = await asyncio.to_thread(nbformat.from_dict, nb)  # a deep copy
    cells = []
    try:
        if inputs:
            workspaces.check_file(session.id, who, "upload", sum(map(len, inputs.values())))
            workspace = workspaces.files(session.id, who)
            for path, data in sorted(inputs.items()):
                await workspace.save(path, data)
        total = sum(cell.cell_type == "code" for cell in executed.cells)
        for index, cell in enumerate(executed.cells):
            if cell.cell_type != "code":
                continue
            tags = set(cell.metadata.get("tags") or [])
            if tags & SKIP_TAGS:
                cells.append({"index": index, "cell_id": cell.get("id"), "result": "skipped",
                              "status": None, "recorded_status": None, "diff": ""})  # fmt: skip
                if on_cell is not None:
                    await on_cell(cells[-1], len(cells), total)
                continue
            result = await executions.execute(session.id, who, ExecuteCode(cell.source))
            # Images are decoded and compared, text normalised: not on the event loop.
            verdict = await asyncio.to_thread(
                _verdict, cell, result.status, result.outputs, image_tolerance, tags
            )
            cells.append({"index": index, "cell_id": cell.get("id"), **verdict})
            cell.outputs = [nbformat.from_dict(o) for o in result.outputs]
            cell.execution_count = result.execution_count
            cell.metadata["sbx"] = {"status": result.status, "duration_ms": result.duration_ms}
            if on_cell is not None:
                await on_cell(cells[-1], len(cells), total)
    finally:
        await manager.delete(session.id, who)
    executed.metadata["sbx"] = {
        **recorded,
        "replayed_in": session.id,
        "replay_image": session.image,
    }
    counts = {
        kind: sum(c["result"] == kind for c in cells)
        for kind in ("same", "different", "error", "skipped")
    }
    return {
        "reproduced": counts["different"] == counts["error"] == 0,
        "summary": counts,
        "cells": cells,
        "warnings": warnings,
        "inputs": sorted(inputs),
        "image": session.image,
        "image_digest": session.image_digest,
        "notebook": executed,
    }


async def _recorded_image(manager: SessionManager, image: Any, warnings: list[str]) -> str | None:
    """The notebook's image if this gateway built it, else None (the kernel's own) and a warning.

    The name is checked before the engine is asked about it: ``GET /images/<name>/json``
    with a name like ``../containers/x`` would reach another endpoint.
    """
    if not image:
        return None
    try:
        ref = image_ref(image)
    except BadRequest:
        ref = None
    if ref is None or not await manager.image_available(ref):
        warnings.append(
            f"the recorded image {str(image)[:200]} is not available here; using the current one"
        )
        return None
    return ref


def _verdict(
    cell: Any,
    status: str,
    outputs: list[dict[str, Any]],
    image_tolerance: float | None,
    tags: set[str],
) -> dict[str, Any]:
    """How a replayed cell compares, as its tags ask (compare.py's docstring)."""
    recorded_status = cell.metadata.get("sbx", {}).get("status") or (
        "error" if any(o.get("output_type") == "error" for o in cell.outputs) else "ok"
    )
    diff = ""
    if not tags & IGNORE_OUTPUT_TAGS:
        diff = diff_outputs(cell.outputs, outputs, image_tolerance, float_tolerance(tags))
    if status != recorded_status and status in _FAILED:
        result = "error"  # it failed now where it had not, or failed differently
    else:
        result = "different" if diff else "same"
    return {"result": result, "status": status, "recorded_status": recorded_status, "diff": diff}


def _check_inputs(recorded: list[dict[str, Any]], inputs: dict[str, bytes]) -> list[str]:
    """Refuse an input that is not the file the session read; warn of recorded ones missing."""
    wanted = {str(r.get("path")): r for r in recorded if isinstance(r, dict)}
    for path, data in inputs.items():
        want = wanted.get(path, {}).get("sha256")
        got = hashlib.sha256(data).hexdigest()
        if want is not None and got != want:
            raise BadRequest(
                f"input {path!r} ({len(data)} bytes) has sha256 {got}, but the session read "
                f"one with sha256 {want} ({wanted[path].get('size')} bytes): not the same file"
            )
    missing = sorted(set(wanted) - set(inputs))
    if not missing:
        return []
    return [
        f"the session read uploaded files not given to this replay: {', '.join(missing)}; "
        "send them (sbx replay NOTEBOOK --inputs DIR, or a bundle from sbx export --with-inputs)"
    ]


def _environment_warnings(
    recorded: dict[str, Any], digest: str | None, packages: list[str]
) -> list[str]:
    warnings = []
    if recorded.get("image_digest") and recorded["image_digest"] != digest:
        warnings.append(
            f"image digest differs: recorded {recorded['image_digest']}, replaying on {digest}; "
            "differences may come from the environment"
        )
    before, after = set(recorded.get("packages") or []), set(packages)
    if before and before != after:
        changed = sorted(before ^ after)
        warnings.append(f"installed packages differ: {', '.join(changed[:10])}")
    return warnings
