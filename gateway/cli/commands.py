"""The ``sbx`` commands that talk to a running gateway: a thin layer over the SDK.

``run``, ``exec``, ``sessions``, ``files``, ``export``, ``replay`` and ``mcp``.
Each takes ``--url``/``--token`` (or ``SBX_URL``/``SBX_TOKEN``) and needs
nothing else of the settings: handlers get the SDK's ``ClientSettings``. Exit codes:
0 done, 1 the code (or a replay) failed, 2 the gateway refused or was unreachable.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..client import Client, Execution, Session
from ..client.settings import ClientSettings
from ..config import Settings
from ..errors import BadRequest
from . import terminal

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
        "memory": args.memory,
        "disk": args.disk,
        "ttl": args.ttl,
        "env": _pairs(args.env, "--env") or None,
        "metadata": _pairs(args.metadata, "--metadata") or None,
        "runtime": args.runtime,
        "network": {"allow": args.allow} if args.allow else None,
    }


def _upload(session: Session, local: str, remote: str | None = None) -> None:
    path = Path(local)
    if not path.is_file():
        raise BadRequest(f"{local} is not a file")
    target = remote or path.name
    with terminal.transfer(f"uploading {local}", path.stat().st_size) as progress:
        info = session.files.upload(path, target, on_progress=progress)
    terminal.err.print(f"[dim]uploaded {local} -> {info.path} ({info.size} bytes)[/dim]")


def _download(session: Session, remote: str, local: str | Path) -> None:
    if str(local) == "-":
        sys.stdout.buffer.write(session.files.read(remote))
        sys.stdout.flush()
        return
    with terminal.transfer(f"downloading {remote}") as progress:
        dest = session.files.download(remote, local, on_progress=progress)
    terminal.err.print(f"[dim]downloaded {remote} -> {dest}[/dim]")


def _execute(session: Session, code: str, args: argparse.Namespace, stem: str) -> Execution:
    printer = terminal.ExecutionPrinter(Path(args.out), stem)
    execution = session.run(code, timeout=args.timeout, **printer.callbacks())
    if not args.quiet:
        terminal.summary(execution)
    return execution


# -- commands ---------------------------------------------------------------------------


def _run(settings: ClientSettings, args: argparse.Namespace) -> int:
    code = _read_code(args.script)
    stem = "stdin" if args.script == "-" else Path(args.script).stem
    with _client(settings) as client:
        with terminal.waiting(f"starting a {args.kernel or 'python3'} session"):
            session = client.create_session(keep=args.keep, **_session_options(args))
        with session:
            for local in args.file or []:
                _upload(session, local)
            execution = _execute(session, code, args, stem)
            for remote in args.get or []:
                _download(session, remote, Path(args.out) / Path(remote).name)
            if args.keep:
                terminal.err.print(f"session {session.id} kept")
    return 0 if execution.ok else 1


def _exec(settings: ClientSettings, args: argparse.Namespace) -> int:
    code = args.code if args.file is None else _read_code(args.file)
    if code is None:
        raise BadRequest("give the code to run, or --file SCRIPT ('-' for standard input)")
    with _client(settings) as client:
        execution = _execute(client.session(args.session), code, args, "output")
    return 0 if execution.ok else 1


def _sessions_ls(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        sessions = client.list_sessions(
            state=args.state, metadata=_pairs(args.metadata, "--metadata")
        )
    if args.json:
        terminal.print_json([s.raw for s in sessions])
    elif sessions:
        terminal.out.print(terminal.sessions_table(sessions))
    else:
        terminal.err.print("no sessions")
    return 0


def _sessions_new(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client, terminal.waiting("starting a session"):
        session = client.create_session(keep=True, **_session_options(args))
    print(session.id)
    return 0


def _sessions_show(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        info = client.connect(args.session).info
    if args.json:
        terminal.print_json(info.raw)
    else:
        terminal.out.print(terminal.session_table(info))
    return 0


def _sessions_rm(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        for session_id in args.sessions:
            client.session(session_id).delete()
            terminal.err.print(f"deleted {session_id}")
    return 0


def _files_put(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        _upload(client.session(args.session), args.local, args.remote)
    return 0


def _files_get(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        _download(client.session(args.session), args.remote, args.local or Path(args.remote).name)
    return 0


def _files_ls(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        entries = client.session(args.session).files.list(args.path)
    if args.json:
        terminal.print_json([vars(e) for e in entries])
    else:
        terminal.out.print(terminal.files_table(entries))
    return 0


def _files_rm(settings: ClientSettings, args: argparse.Namespace) -> int:
    with _client(settings) as client:
        client.session(args.session).files.remove(args.path)
    return 0


def _export(settings: ClientSettings, args: argparse.Namespace) -> int:
    output = Path(args.output or f"session-{args.session}.ipynb")
    with _client(settings) as client:
        notebook = client.session(args.session).export(output, descriptions=args.descriptions)
    cells = len(notebook.get("cells", []))
    print(f"wrote {output} ({cells} cells)")
    return 0


def _replay(settings: ClientSettings, args: argparse.Namespace) -> int:
    source = Path(args.notebook)
    try:
        content = source.read_bytes()
    except OSError as e:
        raise BadRequest(f"cannot read {source}: {e.strerror}") from None
    with _client(settings) as client, terminal.waiting(f"replaying {source}"):
        report = client.replay(content, image_tolerance=args.image_tolerance)
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    for cell in report["cells"]:
        print(f"cell {cell['index']:>3} [{cell['cell_id']}]: {cell['result']} ({cell['status']})")
        if cell["diff"] and cell["result"] != "same":
            print("    " + cell["diff"].replace("\n", "\n    "))
    output = Path(args.output or source.with_suffix(".replayed.ipynb"))
    output.write_text(json.dumps(report["notebook"], indent=1))
    summary = report["summary"]
    verdict = "reproduced" if report["reproduced"] else "did NOT reproduce"
    print(
        f"{source}: {verdict} ({summary['same']} same, {summary['different']} different, "
        f"{summary['error']} error); executed notebook written to {output}"
    )
    return 0 if report["reproduced"] else 1


def _mcp(settings: ClientSettings, args: argparse.Namespace) -> int:
    from ..mcp.server import serve

    serve(settings, http=args.http, host=args.host, port=args.port, path=args.path)
    return 0


def _e2b_env(settings: ClientSettings, args: argparse.Namespace) -> int:
    """Print what points the stock E2B SDKs at this gateway, for ``eval "$(sbx e2b env)"``."""
    url = settings.url.rstrip("/")
    exports = {
        "E2B_API_KEY": settings.token,
        "E2B_API_URL": url,  # the control API: create, list, kill
        "E2B_SANDBOX_URL": url,  # sandbox traffic, named by E2b-Sandbox-Id headers
        "E2B_DOMAIN": urllib.parse.urlsplit(url).hostname or "localhost",
    }
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


# -- parsers ----------------------------------------------------------------------------


def _command(
    parent: Any, name: str, handler: Handler, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=help, description=description or help)
    Settings.add_arguments(parser, only=("url", "token"))
    parser.set_defaults(func=functools.partial(_with_client_settings, handler))
    return parser


def _with_client_settings(handler: Handler, _server: Settings, args: argparse.Namespace) -> int:
    """Call ``handler`` with the client's settings; ``main`` loads the server's for logging."""
    return handler(ClientSettings.load(args.url, args.token, config=args.config), args)


def _add_session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernel", help="kernelspec name (default: the gateway's, python3)")
    parser.add_argument("--memory", help="memory limit, e.g. 1g")
    parser.add_argument("--disk", help="workspace size, e.g. 2g")
    parser.add_argument("--ttl", type=float, help="session lifetime in seconds")
    parser.add_argument("--runtime", help="container runtime: runc (default) or gvisor")
    parser.add_argument(
        "--allow", action="append", metavar="HOST", help="let the code reach HOST (egress)"
    )
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="kernel env var")
    parser.add_argument(
        "--metadata", action="append", metavar="KEY=VALUE", help="label to find the session by"
    )


def _add_execution_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, help="execution timeout in seconds")
    parser.add_argument(
        "--out", default=".", help="directory for saved images and downloads (default: .)"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no summary line after the outputs"
    )


def add_client_commands(commands: Any) -> None:
    """Add the gateway-client commands to ``sbx``'s subcommand parsers."""
    run = _command(
        commands,
        "run",
        _run,
        "run a script in a new session, then delete it; exit 1 if the code fails",
        "Start a session, upload --file inputs, run SCRIPT (- for stdin) streaming its "
        "output, save images to --out, download --get files, and delete the session.",
    )
    run.add_argument("script", help="file of code to run, or - for standard input")
    run.add_argument("--file", action="append", metavar="PATH", help="upload before running")
    run.add_argument("--get", action="append", metavar="PATH", help="download after running")
    run.add_argument("--keep", action="store_true", help="keep the session and print its id")
    _add_session_options(run)
    _add_execution_options(run)

    exec_ = _command(
        commands, "exec", _exec, "run code in an existing session; exit 1 if the code fails"
    )
    exec_.add_argument("session", help="session id")
    exec_.add_argument("code", nargs="?", help="code to run (or use --file)")
    exec_.add_argument("--file", metavar="SCRIPT", help="run this file instead (- for stdin)")
    _add_execution_options(exec_)

    sessions = commands.add_parser("sessions", help="list, start, inspect and delete sessions")
    sub = sessions.add_subparsers(dest="sessions_command", required=True, metavar="COMMAND")
    ls = _command(sub, "ls", _sessions_ls, "list live sessions")
    ls.add_argument("--state", help="only sessions in this state (idle, busy, dead, ...)")
    ls.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="filter by label")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    new = _command(sub, "new", _sessions_new, "start a session and print its id")
    _add_session_options(new)
    show = _command(sub, "show", _sessions_show, "show one session, live or ended")
    show.add_argument("session", help="session id")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rm = _command(sub, "rm", _sessions_rm, "delete sessions (their containers are removed)")
    rm.add_argument("sessions", nargs="+", metavar="SESSION", help="session ids")

    files = commands.add_parser("files", help="move files in and out of a session's workspace")
    sub = files.add_subparsers(dest="files_command", required=True, metavar="COMMAND")
    put = _command(sub, "put", _files_put, "upload a local file (streamed, with progress)")
    put.add_argument("session", help="session id")
    put.add_argument("local", help="local file")
    put.add_argument("remote", nargs="?", help="workspace path (default: the file's name)")
    get = _command(sub, "get", _files_get, "download a workspace file (streamed, with progress)")
    get.add_argument("session", help="session id")
    get.add_argument("remote", help="workspace path")
    get.add_argument("local", nargs="?", help="local file (default: its name; - for stdout)")
    fls = _command(sub, "ls", _files_ls, "list a workspace directory")
    fls.add_argument("session", help="session id")
    fls.add_argument("path", nargs="?", default="", help="directory (default: the top)")
    fls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    frm = _command(sub, "rm", _files_rm, "delete a workspace file or directory")
    frm.add_argument("session", help="session id")
    frm.add_argument("path", help="workspace path")

    export = _command(commands, "export", _export, "download a session as a .ipynb notebook")
    export.add_argument("session", help="session id")
    export.add_argument("-o", "--output", help="file to write (default session-ID.ipynb)")
    export.add_argument(
        "--no-descriptions",
        dest="descriptions",
        action="store_false",
        help="leave out the markdown cells made from execute descriptions",
    )

    replay = _command(
        commands,
        "replay",
        _replay,
        "re-run a notebook in a fresh session; exit 1 unless it reproduces",
    )
    replay.add_argument("notebook", help=".ipynb file (e.g. from sbx export)")
    replay.add_argument("-o", "--output", help="executed notebook (default NAME.replayed.ipynb)")
    replay.add_argument(
        "--image-tolerance",
        type=float,
        help="compare images by pixels, allowing this mean difference (0 to 1)",
    )

    e2b = commands.add_parser("e2b", help="use the stock E2B SDKs with this gateway")
    e2b_sub = e2b.add_subparsers(dest="e2b_command", required=True, metavar="COMMAND")
    _command(
        e2b_sub,
        "env",
        _e2b_env,
        "print export lines that point the E2B SDKs here",
        "Print E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_DOMAIN for this gateway: "
        '`eval "$(sbx e2b env)"`, then existing e2b / e2b-code-interpreter code runs here.',
    )

    mcp = _command(
        commands,
        "mcp",
        _mcp,
        "serve the gateway to MCP clients (stdio, or streamable HTTP with --http)",
        "Serve the gateway as a Model Context Protocol server: tools create_session, run_code, "
        "upload_file, download_file, list_files, export_notebook, delete_session.",
    )
    mcp.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    mcp.add_argument("--port", type=int, default=8766, help="HTTP port, 0 for a free one")
    mcp.add_argument("--path", default="/mcp", help="HTTP endpoint path (default /mcp)")
