"""The arguments of ``sbx``'s client commands (their handlers: ``commands.py``).

Every command that prints takes ``--json``; numbers are checked here, so a bad
one is named with its argument before anything is sent.
"""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any

from ..client.settings import ClientSettings
from ..config import Settings
from ..mcp.config import CLIENTS
from . import commands as c


def _positive(text: str) -> float:
    """A number of seconds (or the like) above zero."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid positive number: {text!r}")
    return value


def _fraction(text: str) -> float:
    """A tolerance from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"invalid fraction (0 to 1): {text!r}")
    return value


def _command(
    parent: Any,
    name: str,
    handler: c.Handler,
    help: str,
    description: str | None = None,
    *,
    prints: bool = True,
) -> argparse.ArgumentParser:
    """A client command; one that ``prints`` takes ``--json``."""
    parser = parent.add_parser(name, help=help, description=description or help)
    Settings.add_arguments(parser, only=("url", "token"))
    if prints:
        parser.add_argument(
            "--json", action="store_true", help="print one JSON document on stdout instead"
        )
    parser.set_defaults(func=functools.partial(_with_client_settings, handler))
    return parser


def _with_client_settings(handler: c.Handler, _server: Settings, args: argparse.Namespace) -> int:
    """Call ``handler`` with the client's settings; ``main`` loads the server's for logging."""
    return handler(ClientSettings.load(args.url, args.token, config=args.config), args)


def _add_session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernel", help="kernelspec name (default: the gateway's, python3)")
    parser.add_argument(
        "--template", help="one of your templates (sbx templates build), NAME or NAME:VERSION"
    )
    parser.add_argument("--memory", help="memory limit, e.g. 1g")
    parser.add_argument("--disk", help="workspace size, e.g. 2g")
    parser.add_argument("--ttl", type=_positive, help="session lifetime in seconds")
    parser.add_argument("--runtime", help="container runtime: runc (default) or gvisor")
    parser.add_argument(
        "--allow", action="append", metavar="HOST", help="let the code reach HOST (egress)"
    )
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="kernel env var")
    parser.add_argument(
        "--secret",
        action="append",
        metavar="NAME",
        help="a sealed secret (POST /v1/secrets) the kernel gets as env var NAME",
    )
    parser.add_argument(
        "--metadata", action="append", metavar="KEY=VALUE", help="label to find the session by"
    )
    parser.add_argument(
        "--volume",
        action="append",
        metavar="NAME:PATH[:ro]",
        help="mount the named volume at PATH under the workspace (read-only with :ro)",
    )


def _add_execution_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=_positive, help="execution timeout in seconds")
    parser.add_argument(
        "--out", default=".", help="directory for saved images and downloads (default: .)"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no summary line after the outputs"
    )


def _add_volume_commands(commands: Any) -> None:
    volumes = commands.add_parser(
        "volumes", help="named volumes: files that outlive sessions (mount with --volume)"
    )
    sub = volumes.add_subparsers(dest="volumes_command", required=True, metavar="COMMAND")
    new = _command(sub, "create", c.volumes_create, "create a named volume")
    new.add_argument("name", help="1 to 63 letters, digits, _ . -")
    new.add_argument("--size", help="its cap, e.g. 2g (default: the gateway's)")
    _command(sub, "ls", c.volumes_ls, "list your volumes")
    show = _command(sub, "show", c.volumes_show, "a volume's use and the sessions mounting it")
    show.add_argument("name", help="volume name")
    rm = _command(sub, "rm", c.volumes_rm, "delete volumes and their files")
    rm.add_argument("names", nargs="+", metavar="NAME", help="volume names")
    put = _command(sub, "put", c.volumes_put, "upload a local file into a volume")
    put.add_argument("name", help="volume name")
    put.add_argument("local", help="local file")
    put.add_argument("remote", nargs="?", help="path in the volume (default: the file's name)")
    get = _command(sub, "get", c.volumes_get, "download a file of a volume")
    get.add_argument("name", help="volume name")
    get.add_argument("remote", help="path in the volume")
    get.add_argument("local", nargs="?", help="local file (default: its name; - for stdout)")
    files = _command(sub, "files", c.volumes_files, "list a directory of a volume")
    files.add_argument("name", help="volume name")
    files.add_argument("path", nargs="?", default="", help="directory (default: the top)")


def _add_template_commands(commands: Any) -> None:
    templates = commands.add_parser(
        "templates", help="templates: images built from your Dockerfiles (start with --template)"
    )
    sub = templates.add_subparsers(dest="templates_command", required=True, metavar="COMMAND")
    build = _command(sub, "build", c.templates_build, "build a new version of a template")
    build.add_argument("name", help="lower-case letters and digits, single - or _ between")
    # -f takes the context after it too: argparse cannot match a positional after an option.
    build.add_argument(
        "-f", "--file", required=True, nargs="+", metavar="DOCKERFILE", help="its Dockerfile"
    )
    build.add_argument("context", nargs="?", help="build context: a directory or a .tar file")
    build.add_argument("--kernel", help="the kernel its sessions run (default: its base's)")
    build.add_argument("--no-wait", action="store_true", help="return once the build started")
    build.add_argument(
        "--tag", action="append", dest="tags", metavar="TAG", help="a tag it takes once ready"
    )
    _command(sub, "ls", c.templates_ls, "list your templates' builds")
    show = _command(sub, "show", c.templates_show, "a template's builds: status, failed step")
    show.add_argument("name", help="template name")
    tag = _command(sub, "tag", c.templates_tag, "move tags to a version (NAME:TAG starts it)")
    tag.add_argument("ref", metavar="NAME:VERSION", help="the version: its number or a tag")
    tag.add_argument("tags", nargs="+", metavar="TAG", help="tags to move there")
    untag = _command(sub, "untag", c.templates_untag, "remove tags from a template")
    untag.add_argument("name", help="template name")
    untag.add_argument("tags", nargs="+", metavar="TAG", help="tags to remove")
    tags = _command(sub, "tags", c.templates_tags, "a template's tags and their versions")
    tags.add_argument("name", help="template name")
    rm = _command(sub, "rm", c.templates_rm, "delete templates (every version)")
    rm.add_argument("names", nargs="+", metavar="NAME", help="template names")
    pool = _command(sub, "pool", c.templates_pool, "keep sandboxes of a template ready, or show")
    pool.add_argument("name", help="template name")
    pool.add_argument("size", nargs="?", type=int, help="sandboxes to keep ready (0: none)")


def _add_context_commands(commands: Any) -> None:
    contexts = commands.add_parser(
        "contexts", help="code contexts: more kernels in a session's sandbox (exec --context)"
    )
    sub = contexts.add_subparsers(dest="contexts_command", required=True, metavar="COMMAND")
    ls = _command(sub, "ls", c.contexts_ls, "list a session's contexts, its own kernel first")
    ls.add_argument("session", help="session id")
    new = _command(sub, "create", c.contexts_create, "start a context and print its id")
    new.add_argument("session", help="session id")
    kind = new.add_mutually_exclusive_group()
    kind.add_argument("--kernel", help="a kernelspec the session's image holds, e.g. xpython")
    kind.add_argument(
        "--language", help="or a language one of them runs (default: the session's kernel)"
    )
    new.add_argument("--cwd", help="its working directory under /workspace (made if missing)")
    restart = _command(sub, "restart", c.contexts_restart, "give a context a fresh kernel")
    restart.add_argument("session", help="session id")
    restart.add_argument("context", help="context id")
    rm = _command(sub, "rm", c.contexts_rm, "stop contexts' kernels (their history stays)")
    rm.add_argument("session", help="session id")
    rm.add_argument("names", nargs="+", metavar="CONTEXT", help="context ids")


def add_client_commands(commands: Any) -> None:
    """Add the gateway-client commands to ``sbx``'s subcommand parsers."""
    run = _command(
        commands,
        "run",
        c.run,
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
        commands, "exec", c.exec_, "run code in an existing session; exit 1 if the code fails"
    )
    exec_.add_argument("session", help="session id")
    exec_.add_argument("code", nargs="?", help="code to run (or use --file)")
    exec_.add_argument("--file", metavar="SCRIPT", help="run this file instead (- for stdin)")
    exec_.add_argument(
        "--context", metavar="ID", help="run in this code context (sbx contexts create)"
    )
    _add_execution_options(exec_)
    exec_.set_defaults(late_positional="code")

    sessions = commands.add_parser("sessions", help="list, start, inspect and delete sessions")
    sub = sessions.add_subparsers(dest="sessions_command", required=True, metavar="COMMAND")
    ls = _command(sub, "ls", c.sessions_ls, "list live sessions")
    ls.add_argument("--state", help="only sessions in this state (idle, busy, dead, ...)")
    ls.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="filter by label")
    new = _command(sub, "new", c.sessions_new, "start a session and print its id")
    _add_session_options(new)
    show = _command(sub, "show", c.sessions_show, "show one session, live or ended")
    show.add_argument("session", help="session id")
    rm = _command(sub, "rm", c.sessions_rm, "delete sessions (their containers are removed)")
    rm.add_argument("sessions", nargs="+", metavar="SESSION", help="session ids")

    ports = _command(
        commands,
        "ports",
        c.ports,
        "list what listens in a session's sandbox, or make a preview link to a port",
        "Print each TCP port something listens on in the sandbox with its preview URL "
        "(send your token to it); --link PORT prints a signed link a person can open in "
        "a browser, good for --expires-in seconds.",
    )
    ports.add_argument("session", help="session id")
    ports.add_argument("--link", type=int, metavar="PORT", help="make a signed link to PORT")
    ports.add_argument("--expires-in", type=float, default=3600, help="the link's lifetime (s)")

    files = commands.add_parser("files", help="move files in and out of a session's workspace")
    sub = files.add_subparsers(dest="files_command", required=True, metavar="COMMAND")
    put = _command(sub, "put", c.files_put, "upload a local file (streamed, with progress)")
    put.add_argument("session", help="session id")
    put.add_argument("local", help="local file")
    put.add_argument("remote", nargs="?", help="workspace path (default: the file's name)")
    get = _command(
        sub,
        "get",
        c.files_get,
        "download a workspace file, or a directory as an archive (streamed, with progress)",
    )
    get.add_argument("session", help="session id")
    get.add_argument("remote", help="workspace path; a directory (dir/) comes as an archive")
    get.add_argument(
        "local",
        nargs="?",
        help="local file or directory (default: its name, dir.tar.gz; - for stdout)",
    )
    get.add_argument(
        "--format", choices=("tar", "zip"), help="archive a directory as .tar.gz or .zip"
    )
    fls = _command(sub, "ls", c.files_ls, "list a workspace directory")
    fls.add_argument("session", help="session id")
    fls.add_argument("path", nargs="?", default="", help="directory (default: the top)")
    frm = _command(sub, "rm", c.files_rm, "delete a workspace file or directory")
    frm.add_argument("session", help="session id")
    frm.add_argument("path", help="workspace path")

    _add_context_commands(commands)
    _add_volume_commands(commands)
    _add_template_commands(commands)

    pause = _command(commands, "pause", c.pause, "pause a session: frozen, then saved to disk")
    pause.add_argument("session", help="session id")
    pause.add_argument(
        "--strategy",
        help="freeze (memory held, resumed in milliseconds), namespace or replay (saved to disk)"
        " (default: freeze where the gateway can, else the best there is)",
    )
    resume = _command(commands, "resume", c.resume, "resume a paused session")
    resume.add_argument("session", help="session id")
    restart = _command(
        commands, "restart", c.restart, "restart a session's kernel (its files are kept)"
    )
    restart.add_argument("session", help="session id")
    interrupt = _command(commands, "interrupt", c.interrupt, "interrupt the running cell")
    interrupt.add_argument("session", help="session id")
    extend = _command(
        commands, "extend", c.extend, "let a session live SECONDS from now (its ttl moves)"
    )
    extend.add_argument("session", help="session id")
    extend.add_argument("seconds", type=_positive, help="seconds from now")
    network = _command(
        commands, "network", c.network, "replace a running session's network allow/deny lists"
    )
    network.add_argument("session", help="session id")
    network.add_argument(
        "--allow", action="append", default=[], metavar="HOST",
        help="a host, *.domain, IP, CIDR (each with an optional :port) or public; repeatable",
    )  # fmt: skip
    network.add_argument("--deny", action="append", default=[], metavar="HOST",
                         help="an exception to --allow; repeatable")  # fmt: skip
    snapshot = _command(
        commands, "snapshot", c.snapshot, "snapshot a session's state and files; print its id"
    )
    snapshot.add_argument("session", help="session id")
    snapshot.add_argument("--name", help="a name to know it by")
    snapshot.add_argument("--strategy", help="namespace or replay (default: the best there is)")
    snapshots = _command(commands, "snapshots", c.snapshots, "list a session's snapshots")
    snapshots.add_argument("session", help="session id")
    fork = _command(commands, "fork", c.fork, "start a session from a snapshot and print its id")
    fork.add_argument("snapshot", help="snapshot id")

    export = _command(commands, "export", c.export, "download a session as a .ipynb notebook")
    export.add_argument("session", help="session id")
    export.add_argument(
        "-o", "--output", help="file to write (default session-ID.ipynb, or .zip with inputs)"
    )
    export.add_argument(
        "--with-inputs",
        action="store_true",
        help="write a bundle (.zip): the notebook and the files the session uploaded",
    )
    export.add_argument(
        "--no-descriptions",
        dest="descriptions",
        action="store_false",
        help="leave out the markdown cells made from execute descriptions",
    )

    replay = _command(
        commands,
        "replay",
        c.replay,
        "re-run a notebook in a fresh session; exit 1 unless it reproduces",
    )
    replay.add_argument("notebook", help=".ipynb file, or a bundle from sbx export --with-inputs")
    replay.add_argument(
        "--report",
        metavar="HTML",
        help="also write a page: each cell recorded and replayed side by side, images inline",
    )
    replay.add_argument(
        "--inputs",
        metavar="DIR",
        help="the files the session uploaded, at their workspace paths under DIR",
    )
    replay.add_argument("-o", "--output", help="executed notebook (default NAME.replayed.ipynb)")
    replay.add_argument(
        "--image-tolerance",
        type=_fraction,
        help="compare images by pixels, allowing this mean difference (0 to 1)",
    )

    approvals = _command(
        commands, "approvals", c.approvals, "list executes held for an approver (docs/approvals.md)"
    )
    approvals.add_argument(
        "--state",
        default="pending",
        choices=("pending", "approved", "denied", "all"),
        help="pending (default), approved, denied or all",
    )
    for verb in ("approve", "deny"):
        decide = _command(
            commands, verb, c.decide, f"{verb} a held execute (an approver token, not the asker's)"
        )
        decide.add_argument("approval", help="approval id (from sbx approvals)")
        decide.add_argument("--reason", help="why; recorded with the decision")
        decide.set_defaults(verb=verb)

    audit = commands.add_parser("audit", help="check the records' hash chains (docs/auth.md)")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    verify = _command(
        audit_sub,
        "verify",
        c.audit_verify,
        "walk the records' hash chains; exit 1 naming each record edited, deleted, inserted or"
        " reordered (admin tokens)",
    )
    scope = verify.add_mutually_exclusive_group()
    scope.add_argument("--tenant", help="one tenant's chain (default: every tenant's)")
    scope.add_argument("--session", help="one session's chain")
    check = "check an exported notebook's chain head against the gateway's; exit 1 if not"
    _command(audit_sub, "check-notebook", c.audit_check_notebook, check).add_argument(
        "notebook", help=".ipynb file from sbx export"
    )

    e2b = commands.add_parser("e2b", help="use the stock E2B SDKs with this gateway")
    e2b_sub = e2b.add_subparsers(dest="e2b_command", required=True, metavar="COMMAND")
    _command(
        e2b_sub,
        "env",
        c.e2b_env,
        "print export lines that point the E2B SDKs here",
        "Print E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL and E2B_DOMAIN "
        "for this gateway (--json: "
        "as one object): "
        '`eval "$(sbx e2b env)"`, then existing e2b / e2b-code-interpreter code runs here.',
    )

    mcp = _command(
        commands,
        "mcp",
        c.mcp,
        "serve the gateway to MCP clients (stdio, or streamable HTTP with --http)",
        "Serve the gateway as a Model Context Protocol server: tools create_session, "
        "list_sessions, run_code (with progress), interrupt, restart, upload_file, "
        "download_file, list_files, export_notebook, snapshot, fork, delete_session; each "
        "session's files as resources. Over --http every caller sends its own gateway token "
        "(Authorization: Bearer) and sees only its tenant's sessions. "
        "`sbx mcp config` prints a client configuration.",
        prints=False,
    )
    mcp.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    mcp.add_argument("--port", type=int, default=8766, help="HTTP port, 0 for a free one")
    mcp.add_argument("--path", default="/mcp", help="HTTP endpoint path (default /mcp)")
    mcp.add_argument(
        "--approver-token",
        default=os.environ.get("SBX_APPROVER_TOKEN") or None,
        metavar="TOKEN",
        help="your approver token (default $SBX_APPROVER_TOKEN): held code is put to you by "
        "MCP elicitation where the client supports it (stdio only)",
    )
    mcp_sub = mcp.add_subparsers(dest="mcp_command", metavar="COMMAND")
    config = _command(
        mcp_sub,
        "config",
        c.mcp_config,
        "print an MCP client's configuration for this gateway (stdio, or --http URL)",
        prints=False,  # it prints JSON (or a claude command) already
    )
    config.add_argument(
        "--client",
        choices=CLIENTS,
        default="claude-desktop",
        help="whose format (default claude-desktop; cursor and windsurf share it)",
    )
    config.add_argument(
        "--http",
        metavar="URL",
        help="an `sbx mcp --http` endpoint to reach instead of starting `sbx mcp`",
    )
