"""The ``sbx`` commands that talk to a running gateway: a thin layer over the SDK.

``run``, ``exec``, ``sessions``, ``files``, ``pause``, ``resume``, ``restart``,
``interrupt``, ``extend``, ``network``, ``snapshot``, ``snapshots``, ``fork``, ``export``,
``replay``, ``approvals``, ``approve``, ``deny``, ``audit`` and ``mcp`` (their arguments:
``arguments.py``). Each takes ``--url``/``--token`` (or ``SBX_URL``/``SBX_TOKEN``)
and needs nothing else of the settings: handlers get the SDK's ``ClientSettings``.
With ``--json`` a command prints one JSON document on stdout and nothing else there.
Exit codes: 0 done, 1 the code (or a replay) failed, 2 the gateway refused, was
unreachable, or an argument was wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import shlex
import sys
import tarfile
import time
import urllib.parse
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..client import Client, Execution, ReplayReport, Session, SessionInfo
from ..client.settings import ClientSettings
from ..errors import BadRequest, GatewayError, NotAFile
from ..limits import format_size
from . import bundles, terminal
from .report import render_report

Handler = Callable[[ClientSettings, argparse.Namespace], int]


def _client(settings: ClientSettings) -> Client:
    return Client(settings.url, settings.token)


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a dict."""
    pairs = {}
    for value in values or []:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise BadRequest(f"{what} must look like KEY=VALUE, not {value!r}")
        pairs[key] = rest
    return pairs


def _read_code(source: str) -> str:
    """A script's text; ``-`` reads standard input."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text()
    except OSError as e:
        raise BadRequest(f"cannot read {source}: {e.strerror}") from None


def _session_options(args: argparse.Namespace) -> dict[str, Any]:
    """What the flags ask of a new session; the SDK leaves out those given as None."""
    return {
        "kernel": args.kernel,
        "template": args.template,
        "memory": args.memory,
        "disk": args.disk,
        "ttl": args.ttl,
        "env": _pairs(args.env, "--env") or None,
        "secrets": args.secret,
        "metadata": _pairs(args.metadata, "--metadata") or None,
        "runtime": args.runtime,
        "network": {"allow": args.allow} if args.allow else None,
        "volumes": [_volume_mount(v) for v in args.volume] if args.volume else None,
    }


def _volume_mount(value: str) -> dict[str, Any]:
    """``NAME:PATH[:ro]`` as a mount."""
    name, _, rest = value.partition(":")
    path, _, mode = rest.partition(":")
    if not name or not path or mode not in ("", "ro", "rw"):
        raise BadRequest(f"--volume {value!r}: give NAME:PATH or NAME:PATH:ro, e.g. data:in:ro")
    return {"name": name, "path": path, "read_only": mode == "ro"}


def _show(args: argparse.Namespace, doc: Any, human: Callable[[], object]) -> None:
    """Print ``doc`` as JSON with ``--json``; otherwise call ``human`` to say it to a person."""
    if args.json:
        terminal.print_json(doc)
    else:
        human()


def _show_state(args: argparse.Namespace, info: SessionInfo, done: str) -> None:
    """A session after an action: its record as JSON, or ``ID done`` on stderr."""
    _show(args, info.raw, lambda: terminal.err.print(f"{info.id} {done}"))


def _upload(session: Session, local: str, remote: str | None = None) -> dict[str, Any]:
    path = Path(local)
    if not path.is_file():
        raise BadRequest(f"{local} is not a file")
    target = remote or path.name
    with terminal.transfer(f"uploading {local}", path.stat().st_size) as progress:
        info = session.files.upload(path, target, on_progress=progress)
    terminal.err.print(f"[dim]uploaded {local} -> {info.path} ({info.size} bytes)[/dim]")
    return dataclasses.asdict(info)


def _download(
    session: Session, remote: str, local: Path | None, archive: str | None = None
) -> dict[str, Any]:
    """Fetch a file, or a directory as an archive (``remote`` ending in / means one).

    ``local`` is the file to write, or a directory to write it into under its own name.
    """
    if archive is None and remote.endswith("/"):
        archive = "tar"
    if archive is not None:
        return _fetch(session, remote, local, archive)
    try:
        return _fetch(session, remote, local, None)
    except NotAFile:  # a directory named without its slash: it comes as an archive too
        return _fetch(session, remote, local, "tar")


def _fetch(
    session: Session, remote: str, local: Path | None, archive: str | None
) -> dict[str, Any]:
    name = Path(remote.rstrip("/")).name or "workspace"
    name = {"tar": f"{name}.tar.gz", "zip": f"{name}.zip"}.get(archive or "", name)
    if local is None or local.is_dir():
        local = (local or Path()) / name
    with terminal.transfer(f"downloading {remote}") as progress:
        dest = session.files.download(remote, local, on_progress=progress, archive=archive)
    terminal.err.print(f"[dim]downloaded {remote} -> {dest}[/dim]")
    return {"path": remote, "local": str(dest), "size": dest.stat().st_size}


def _execute(
    session: Session, code: str, args: argparse.Namespace, stem: str, context: str | None = None
) -> Execution:
    """Run ``code`` in the session's kernel, or in its code ``context``."""
    if args.json:  # the reply as the gateway gave it, outputs and all, and nothing else
        execution = session.run(code, timeout=args.timeout, context=context)
        terminal.print_json(execution.raw)
        return execution
    printer = terminal.ExecutionPrinter(Path(args.out), stem)
    execution = session.run(code, timeout=args.timeout, context=context, **printer.callbacks())
    if restarted := (execution.raw.get("context") or {}).get("restarted"):
        terminal.err.print(f"context {context} started empty: {restarted}", markup=False)
    if not args.quiet:
        terminal.summary(execution)
    return execution


# -- commands ---------------------------------------------------------------------------


def run(settings: ClientSettings, args: argparse.Namespace) -> int:
    code = _read_code(args.script)
    stem = "stdin" if args.script == "-" else Path(args.script).stem
    with _client(settings) as client:
        with terminal.waiting(f"starting a {args.kernel or 'python3'} session"):
            session = client.create_session(keep=args.keep, **_session_options(args))
        with session:
            for local in args.file or []:
                _upload(session, local)
            execution = _execute(session, code, args, stem)
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            for remote in args.get or []:
                _download(session, remote, out)
            if args.keep:
                terminal.err.print(f"session {session.id} kept")
    return 0 if execution.ok else 1


def exec_(settings: ClientSettings, args: argparse.Namespace) -> int:
    code = args.code if args.file is None else _read_code(args.file)
    if code is None:
        raise BadRequest("give the code to run, or --file SCRIPT ('-' for standard input)")
    with _client(settings) as client:
        execution = _execute(client.session(args.session), code, args, "output", args.context)
    return 0 if execution.ok else 1


def contexts_ls(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        found = client.session(args.session).contexts()
    lines = "\n".join(f"{x.id}\t{x.kernel}\t{x.language}\t{x.state}\t{x.cwd}" for x in found)
    _show(args, [x.raw for x in found], lambda: terminal.out.print(lines))
    return 0


def contexts_create(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("starting a kernel"):
        made = client.session(args.session).create_context(
            kernel=args.kernel, language=args.language, cwd=args.cwd
        )
    _show(args, made.raw, lambda: print(made.id))
    return 0


def contexts_restart(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("restarting the kernel"):
        fresh = client.session(args.session).restart_context(args.context)
    said = f"{fresh.id} restarted: a fresh kernel, the files kept"
    _show(args, fresh.raw, lambda: terminal.err.print(said))
    return 0


def contexts_rm(settings: ClientSettings, args: argparse.Namespace) -> int:
    return _delete_each(
        settings, args, lambda client, context: client.session(args.session).remove_context(context)
    )


def sessions_ls(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        sessions = client.list_sessions(
            state=args.state, metadata=_pairs(args.metadata, "--metadata")
        )
    _show(
        args,
        [s.raw for s in sessions],
        lambda: (
            terminal.out.print(terminal.sessions_table(sessions))
            if sessions
            else terminal.err.print("no sessions")
        ),
    )
    return 0


def sessions_new(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("starting a session"):
        session = client.create_session(keep=True, **_session_options(args))
    _show(args, session.info.raw, lambda: print(session.id))
    return 0


def sessions_show(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        info = client.connect(args.session).info
    _show(args, info.raw, lambda: terminal.out.print(terminal.session_table(info)))
    return 0


def ports(settings: ClientSettings, args: argparse.Namespace) -> int:
    """What listens in a session's sandbox; with --link, a signed link to one port."""
    with _client(settings) as client:
        session = client.session(args.session)
        if args.link is not None:
            link = session.preview_link(args.link, args.expires_in)
            _show(args, dataclasses.asdict(link), lambda: terminal.out.print(link.url))
            return 0
        listening = session.list_ports()
    lines = "\n".join(f"{p.port}\t{p.url}" for p in listening) or "nothing listens"
    found = {"ports": [dataclasses.asdict(p) for p in listening]}
    _show(args, found, lambda: terminal.out.print(lines))
    return 0


def sessions_rm(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        for session_id in args.sessions:
            client.session(session_id).delete()
            terminal.err.print(f"deleted {session_id}")
    _show(args, {"deleted": args.sessions}, lambda: None)
    return 0


def files_put(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        info = _upload(client.session(args.session), args.local, args.remote)
    _show(args, info, lambda: None)
    return 0


def files_get(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        session = client.session(args.session)
        if args.local == "-":
            if args.json or args.format:
                raise BadRequest("'-' (to stdout) takes neither --json nor --format")
            session.files.copy_to(args.remote, sys.stdout.buffer)
            sys.stdout.flush()
            return 0
        local = Path(args.local) if args.local else None
        got = _download(session, args.remote, local, args.format)
    _show(args, got, lambda: None)
    return 0


def files_ls(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        entries = client.session(args.session).files.list(args.path)
    _show(
        args, [vars(e) for e in entries], lambda: terminal.out.print(terminal.files_table(entries))
    )
    return 0


def files_rm(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        client.session(args.session).files.remove(args.path)
    _show(args, {"removed": args.path}, lambda: None)
    return 0


def export(settings: ClientSettings, args: argparse.Namespace) -> int:
    suffix = "zip" if args.with_inputs else "ipynb"
    output = Path(args.output or f"session-{args.session}.{suffix}")
    with _client(settings) as client:
        session = client.session(args.session)
        if args.with_inputs:
            notebook = session.export(descriptions=args.descriptions)
            inputs = _recorded_inputs(session, notebook)
            bundles.write_bundle(output, notebook, inputs)
        else:
            notebook = session.export(output, descriptions=args.descriptions)
            inputs = {}
    cells = len(notebook.get("cells", []))
    with_inputs = f", {len(inputs)} inputs" if args.with_inputs else ""
    _show(
        args,
        {"output": str(output), "cells": cells, "inputs": sorted(inputs)},
        lambda: print(f"wrote {output} ({cells} cells{with_inputs})"),
    )
    return 0


def _recorded_inputs(session: Session, notebook: dict[str, Any]) -> dict[str, bytes]:
    """The uploads the notebook records, read back from the workspace while still the same."""
    found = {}
    for record in bundles.recorded_inputs(notebook):
        path = str(record["path"])
        try:
            data = session.files.read(path, max_bytes=bundles.MAX_INPUTS)
        except GatewayError as e:
            terminal.err.print(f"[yellow]left out {path}: {e.message}[/yellow]")
            continue
        if not bundles.matches(record, data):
            terminal.err.print(
                f"[yellow]left out {path}: changed since it was uploaded; replay with "
                "--inputs DIR holding the original[/yellow]"
            )
            continue
        found[path] = data
    return found


def _read_notebook(source: Path) -> bytes:
    """A notebook file's bytes, refused here when it is not one (rather than by the gateway)."""
    try:
        content = source.read_bytes()
    except OSError as e:
        raise BadRequest(f"cannot read {source}: {e.strerror}") from None
    _check_notebook(source, content)
    return content


def _check_notebook(source: Path, content: bytes) -> None:
    try:
        doc = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError):
        doc = None
    if not isinstance(doc, dict) or "cells" not in doc:
        raise BadRequest(f"{source} is not a notebook (.ipynb JSON with cells)")


def replay(settings: ClientSettings, args: argparse.Namespace) -> int:
    source = Path(args.notebook)
    inputs: dict[str, bytes] = {}
    if zipfile.is_zipfile(source):
        content, inputs = bundles.read_bundle(source)
        _check_notebook(source, content)
    else:
        content = _read_notebook(source)
    if args.inputs:
        inputs.update(bundles.inputs_from(Path(args.inputs), json.loads(content)))
    with _client(settings) as client:
        report = _replay(client, source, content, inputs, args)
    output = Path(args.output or source.with_suffix(".replayed.ipynb"))
    output.write_text(json.dumps(report.notebook, indent=1))
    if args.report:
        page = render_report(source.name, json.loads(content), report)
        Path(args.report).write_text(page, encoding="utf-8")
        terminal.err.print(f"[dim]report: {args.report}[/dim]")
    if args.json:
        doc = {k: v for k, v in report.raw.items() if k != "notebook"}
        terminal.print_json({**doc, "output": str(output)})
        return 0 if report.reproduced else 1
    for warning in report.warnings:
        print(f"warning: {warning}")
    for cell in report.cells:
        print(f"cell {cell.index:>3} [{cell.cell_id}]: {cell.result} ({cell.status})")
        if cell.diff and cell.result != "same":
            print("    " + cell.diff.replace("\n", "\n    "))
    summary = report.summary
    verdict = "reproduced" if report.reproduced else "did NOT reproduce"
    print(
        f"{source}: {verdict} ({summary['same']} same, {summary['different']} different, "
        f"{summary['error']} error, {summary.get('skipped', 0)} skipped); "
        f"executed notebook written to {output}"
    )
    return 0 if report.reproduced else 1


def _replay(
    client: Client, source: Path, content: str | bytes, inputs: dict[str, bytes], args: Any
) -> ReplayReport:
    """The replay, with a per-cell bar on a terminal; quiet with --json or when piped."""
    options = {"image_tolerance": args.image_tolerance, "inputs": inputs}
    if args.json:
        return client.replay(content, **options)
    with terminal.replay_progress(f"replaying {source}") as on_cell:
        if on_cell is None:
            return client.replay(content, **options)
        return client.replay(content, on_cell=on_cell, **options)


def approvals(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        found = client.approvals(None if args.state == "all" else args.state)
    nothing = f"no {args.state} approvals" if args.state != "all" else "no approvals"
    _show(
        args,
        [a.raw for a in found],
        lambda: (
            terminal.out.print(terminal.approvals_table(found))
            if found
            else terminal.err.print(nothing)
        ),
    )
    return 0


def decide(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        decide = client.approve if args.verb == "approve" else client.deny
        approval = decide(args.approval, args.reason)
    _show(args, approval.raw, lambda: terminal.err.print(f"{approval.id}: {approval.state}"))
    return 0


def audit_verify(settings: ClientSettings, args: argparse.Namespace) -> int:
    """Each problem a line (table, id, what is wrong, why); exit 1 if there is any."""
    with _client(settings) as client, terminal.waiting("walking the chains"):
        report = client.verify_audit(tenant=args.tenant, session=args.session)

    def human() -> None:
        for chain in report["chains"]:
            pruned = f", {chain['pruned']} pruned" if chain["pruned"] else ""
            terminal.err.print(f"{chain['chain']}: {chain['count']} records{pruned}")
        for p in report["problems"]:
            terminal.out.print(f"{p['table']} {p['id']}: {p['problem']} ({p['detail']})")
        if report["more_problems"]:
            terminal.out.print(f"... and {report['more_problems']} more problems")
        terminal.err.print("the chains hold" if report["ok"] else "the records were rewritten")

    _show(args, report, human)
    return 0 if report["ok"] else 1


def audit_check_notebook(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        checked = client.check_notebook(_read_notebook(Path(args.notebook)))
    _show(args, checked, lambda: terminal.out.print(f"{args.notebook}: {checked['detail']}"))
    return 0 if checked["matches"] else 1


def pause(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("pausing"):
        info = client.session(args.session).pause(args.strategy)
    _show(args, info.raw, lambda: _report_state(info.raw))
    return 0


def resume(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("resuming"):
        info = client.session(args.session).resume()
    _show(args, info.raw, lambda: _report_state(info.raw))
    return 0


def restart(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("restarting the kernel"):
        info = client.session(args.session).restart()
    _show_state(args, info, "restarted: a fresh kernel, the workspace kept")
    return 0


def interrupt(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        info = client.session(args.session).interrupt()
    _show_state(args, info, "interrupted")
    return 0


def extend(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        info = client.session(args.session).extend(args.seconds)
    _show_state(args, info, f"now ends at {info.expires_at}")
    return 0


def network(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        info = client.session(args.session).update_network(args.allow, deny=args.deny)
    _show_state(args, info, f"network now {json.dumps(info.network)}")
    return 0


def _report_state(doc: dict[str, Any]) -> None:
    """Say how a kernel's state was kept, and what it lost, on stderr."""
    terminal.err.print(f"{doc['id']} {doc['state']} ({doc['strategy']})")
    for lost in doc.get("lost") or []:
        terminal.err.print(f"  lost {lost['name']} ({lost['type']}): {lost['reason']}")
    for cell in doc.get("differed") or []:
        terminal.err.print(f"  cell [{cell['execution_count']}] replayed with other outputs")


def snapshot(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("taking a snapshot"):
        snap = client.session(args.session).snapshot(args.name, strategy=args.strategy)
    for lost in snap.lost:
        terminal.err.print(f"  lost {lost['name']} ({lost['type']}): {lost['reason']}")
    _show(args, snap.raw, lambda: print(snap.id))
    return 0


def snapshots(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        snaps = client.session(args.session).snapshots()
    _show(args, [s.raw for s in snaps], lambda: terminal.snapshot_lines(snaps))
    return 0


def fork(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("forking"):
        session = client.snapshot(args.snapshot).fork(keep=True)
    _show(args, session.info.raw, lambda: print(session.id))
    return 0


def mcp(settings: ClientSettings, args: argparse.Namespace) -> int:
    from ..mcp.server import serve

    if args.http and args.approver_token:
        raise BadRequest(
            "--approver-token is for stdio: over --http each caller is a different person"
        )
    if args.http and args.token:
        raise BadRequest(
            "--token is for stdio: over --http each caller sends its own gateway token "
            "(Authorization: Bearer), and this server sends none of its own"
        )
    serve(
        settings,
        http=args.http,
        host=args.host,
        port=args.port,
        path=args.path,
        approver_token=args.approver_token,
    )
    return 0


def mcp_config(settings: ClientSettings, args: argparse.Namespace) -> int:
    from ..mcp.config import client_config

    print(client_config(args.client, settings.url, settings.token, args.http))
    return 0


def e2b_env(settings: ClientSettings, args: argparse.Namespace) -> int:
    """Print what points the stock E2B SDKs at this gateway, for ``eval "$(sbx e2b env)"``."""
    url = settings.url.rstrip("/")
    exports = {
        "E2B_API_KEY": settings.token,
        "E2B_API_URL": url,  # the control API: create, list, kill
        "E2B_SANDBOX_URL": url,  # sandbox traffic, named by E2b-Sandbox-Id headers
        "E2B_VOLUME_API_URL": url,  # a Volume's own file methods (/volumecontent)
        "E2B_DOMAIN": urllib.parse.urlsplit(url).hostname or "localhost",
    }
    if args.json:
        terminal.print_json(exports)
        return 0
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def _build_context(source: str | None) -> bytes | None:
    """A directory's files (or a .tar file's bytes) as the build context to send."""
    if source is None:
        return None
    path = Path(source)
    if path.is_file():
        return path.read_bytes()
    if not path.is_dir():
        raise BadRequest(f"build context {source}: give a directory or a .tar file")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for found in sorted(path.rglob("*")):
            if found.is_file() or found.is_dir():
                tar.add(found, arcname=str(found.relative_to(path)), recursive=False)
    return buffer.getvalue()


def templates_build(settings: ClientSettings, args: argparse.Namespace) -> int:
    dockerfile, *rest = args.file
    if len(rest) + (args.context is not None) > 1:
        raise BadRequest("give one build context: sbx templates build NAME -f DOCKERFILE [DIR]")
    context = _build_context(args.context or (rest[0] if rest else None))
    with _client(settings) as client:
        build = client.build_template(
            args.name, _read_code(dockerfile), context, kernel=args.kernel, tags=args.tags
        )
        shown = 0
        while not args.no_wait and build["status"] == "building":
            time.sleep(0.5)
            build = next(b for b in client.template(args.name) if b["id"] == build["id"])
            for line in build.get("logs", [])[shown:]:
                terminal.err.print(line)
            shown = len(build.get("logs", []))
    if build["status"] == "failed":
        error = build["error"]
        terminal.err.print(f"{args.name}:{build['version']} failed at {error['step'] or 'start'}")
        terminal.err.print(error["reason"])
    _show(args, build, lambda: print(f"{build['name']}:{build['version']} {build['status']}"))
    return 1 if build["status"] == "failed" else 0


def templates_ls(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        found = client.templates()
    lines = "\n".join(f"{b['name']}:{b['version']}\t{b['status']}\t{b['kernel']}" for b in found)
    _show(args, found, lambda: terminal.out.print(lines or "no templates"))
    return 0


def templates_show(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        builds = client.template(args.name)

    def lines() -> None:
        for b in builds:
            why = f" at {b['error']['step']}: {b['error']['reason']}" if b.get("error") else ""
            tags = f" (tags: {', '.join(b['tags'])})" if b.get("tags") else ""
            terminal.out.print(f"{b['name']}:{b['version']}\t{b['status']}{why}{tags}")

    _show(args, builds, lines)
    return 0


def templates_pool(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        if args.size is None:
            pool = client.template_pool(args.name)
        else:
            pool = client.set_template_pool(args.name, args.size)
    version = f":{pool['version']}" if pool["version"] is not None else ""
    waiting = f" (waiting: {pool['waiting']})" if pool.get("waiting") else ""
    line = f"{args.name}{version}\tsize {pool['size']}\tready {pool['ready']}{waiting}"
    _show(args, pool, lambda: terminal.out.print(line))
    return 0


def templates_tag(settings: ClientSettings, args: argparse.Namespace) -> int:
    name, colon, version = args.ref.partition(":")
    if not colon or not version:
        raise BadRequest("give the version to tag: sbx templates tag NAME:VERSION TAG...")
    with _client(settings) as client:
        moved = client.tag_template(name, int(version) if version.isdigit() else version, args.tags)
    line = f"{name}:{moved['version']} {' '.join(moved['tags'])}"
    _show(args, moved, lambda: terminal.out.print(line))
    return 0


def templates_untag(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        client.untag_template(args.name, args.tags)
    _show(args, {"removed": args.tags}, lambda: terminal.err.print(f"untagged {args.name}"))
    return 0


def templates_tags(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        found = client.template_tags(args.name)
    lines = "\n".join(f"{args.name}:{t['tag']}\t{t['version']}" for t in found)
    _show(args, found, lambda: terminal.out.print(lines or "no tags"))
    return 0


def templates_rm(settings: ClientSettings, args: argparse.Namespace) -> int:
    return _delete_each(settings, args, Client.delete_template)


def _delete_each(
    settings: ClientSettings, args: argparse.Namespace, delete: Callable[[Client, str], None]
) -> int:
    """Delete each of ``args.names`` in turn, saying so."""
    with _client(settings) as client:
        for name in args.names:
            delete(client, name)
            terminal.err.print(f"deleted {name}")
    _show(args, {"deleted": args.names}, lambda: None)
    return 0


def volumes_create(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        made = client.create_volume(args.name, args.size)
    _show(args, made, lambda: print(made["name"]))
    return 0


def volumes_ls(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        found = client.volumes()
    lines = "\n".join(
        f"{v['name']}\t{format_size(v['size_bytes'])}\t{v['created_at']}" for v in found
    )
    _show(args, found, lambda: terminal.out.print(lines or "no volumes"))
    return 0


def volumes_show(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        view = client.volume(args.name)
    holders = ", ".join(h["session_id"] for h in view["mounted_by"]) or "no session"
    used = f"{format_size(view['used_bytes'])} of {format_size(view['size_bytes'])}"
    _show(args, view, lambda: terminal.out.print(f"{view['name']}: {used}; mounted by {holders}"))
    return 0


def volumes_rm(settings: ClientSettings, args: argparse.Namespace) -> int:
    return _delete_each(settings, args, Client.delete_volume)


def volumes_put(settings: ClientSettings, args: argparse.Namespace) -> int:
    local = Path(args.local)
    if not local.is_file():
        raise BadRequest(f"{args.local} is not a file")
    with _client(settings) as client:
        saved = client.volume_files(args.name).upload(local, args.remote)  # streamed
    shown = dataclasses.asdict(saved)
    _show(args, shown, lambda: terminal.err.print(f"{saved.path}: {saved.size} bytes"))
    return 0


def volumes_get(settings: ClientSettings, args: argparse.Namespace) -> int:
    if args.local == "-" and args.json:
        raise BadRequest("'-' (to stdout) takes no --json")
    local = Path(args.local or args.remote.rsplit("/", 1)[-1])
    with _client(settings) as client:
        files = client.volume_files(args.name)
        if args.local == "-":
            files.copy_to(args.remote, sys.stdout.buffer)
            sys.stdout.flush()
            return 0
        # Streamed: a sandbox may have left a file far larger than this machine's memory.
        with terminal.transfer(f"downloading {args.remote}") as progress:
            files.download(args.remote, local, on_progress=progress)
    size = local.stat().st_size
    got = {"volume": args.name, "path": args.remote, "local": str(local), "size": size}
    _show(args, got, lambda: terminal.err.print(f"{local}: {size} bytes"))
    return 0


def volumes_files(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        entries = client.volume_files(args.name).list(args.path)
    lines = "\n".join(f"{e.type[0]} {e.size or 0:>12} {e.path}" for e in entries)
    _show(
        args, [dataclasses.asdict(e) for e in entries], lambda: terminal.out.print(lines or "empty")
    )
    return 0
