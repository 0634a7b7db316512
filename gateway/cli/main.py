"""The ``sbx`` command: ``serve`` the gateway, ``images build|ls``, and the client
commands of ``gateway.cli.commands`` (run, exec, sessions, files, export, replay, mcp)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..config import Settings
from ..errors import GatewayError
from .arguments import add_client_commands


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    if settings.workers > 1:
        from .workers import supervise

        return supervise(settings, sys.argv[1:])

    import uvloop  # libuv's event loop: less gateway CPU per message than asyncio's own

    from ..app import Gateway

    uvloop.run(Gateway(settings).serve())
    return 0


def _gc(settings: Settings, args: argparse.Namespace) -> int:
    from .gc import run_gc

    return run_gc(settings, args)


def _builder(settings: Settings, args: argparse.Namespace):
    """The image builder; its progress goes to stderr when stdout is for ``--json``."""
    import docker

    from ..sandbox.images import ImageBuilder

    stream = sys.stderr if args.json else sys.stdout
    return ImageBuilder(
        docker.from_env(),
        Path(settings.images_dir),
        base=settings.base_image,
        progress=lambda line: print(line, file=stream, flush=True),
    )


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def _images_build(settings: Settings, args: argparse.Namespace) -> int:
    builder = _builder(settings, args)
    names = builder.names() if args.all else args.names or settings.default_images
    built = []
    for name in names:
        started = time.monotonic()
        tag = builder.build(name, force=args.force)
        built.append({"name": name, "tag": tag, "seconds": round(time.monotonic() - started, 1)})
        if not args.json:
            print(f"{name}: {tag} ({built[-1]['seconds']:.0f} s)")
    if args.json:
        _print_json(built)
    return 0


def _images_push(settings: Settings, args: argparse.Namespace) -> int:
    registry = args.to or settings.registry
    if not registry:
        raise GatewayError("say where to push: --to HOST:PORT, or set registry")
    builder = _builder(settings, args)
    pushed = [
        {"name": name, "ref": builder.push(name, registry)}
        for name in args.names or settings.default_images
    ]
    if args.json:
        _print_json(pushed)
    return 0


def _images_ls(settings: Settings, args: argparse.Namespace) -> int:
    rows = _builder(settings, args).list()
    if args.json:
        _print_json(rows)
        return 0
    print(f"{'NAME':<12} {'TAG':<28} {'BUILT':<6} {'SIZE':>10}")
    for row in rows:
        size = f"{row['size'] / 1e6:.0f} MB" if row.get("size") else "-"
        print(f"{row['name']:<12} {row['tag']:<28} {'yes' if row['built'] else 'no':<6} {size:>10}")
    return 0


class _OldServeToken(argparse.Action):
    """``sbx serve --token``, the spelling before ``--admin-token``: still taken, with a warning."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(
            "sbx serve: --token is deprecated here, use --admin-token (in every other sbx "
            "command --token is the token the client sends)",
            file=sys.stderr,
        )
        namespace.token = values


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


# Settings only the client side reads: no flags for them on the server-side commands.
CLIENT_ONLY = ("url", "token")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sbx", description="Sandboxed Jupyter kernel gateway.")
    parser.add_argument("--version", action="version", version=f"sbx {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway until SIGINT/SIGTERM")
    # --token is the token a client sends; the token a gateway accepts is --admin-token.
    Settings.add_arguments(serve, skip=("url",), flags={"token": "--admin-token"})
    serve.add_argument("--token", action=_OldServeToken, help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)

    images = commands.add_parser("images", help="build and list kernel images")
    image_commands = images.add_subparsers(dest="images_command", required=True)
    build = image_commands.add_parser("build", help="build kernel images (skips unchanged ones)")
    build.add_argument("names", nargs="*", help="image names (default: the default_images setting)")
    build.add_argument("--all", action="store_true", help="build every image in images_dir")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    _add_json(build)
    Settings.add_arguments(build, skip=CLIENT_ONLY)
    build.set_defaults(func=_images_build)
    push = image_commands.add_parser(
        "push", help="push built images to the registry a swarm's nodes pull from"
    )
    push.add_argument("names", nargs="*", help="image names (default: the default_images setting)")
    push.add_argument(
        "--to", help="registry to push to, as this host reaches it (default: registry)"
    )
    _add_json(push)
    Settings.add_arguments(push, skip=CLIENT_ONLY)
    push.set_defaults(func=_images_push)
    ls = image_commands.add_parser("ls", help="list kernel images and whether they are built")
    _add_json(ls)
    Settings.add_arguments(ls, skip=CLIENT_ONLY)
    ls.set_defaults(func=_images_ls)

    gc = commands.add_parser(
        "gc",
        help="list sandboxes and workspaces no gateway will reap (--yes removes them)",
        description="Find this host's kernel containers, session directories and loop-mounted "
        "workspaces whose session is not open in their gateway's store, or whose data "
        "directory is gone. Data directories of a running gateway are left alone.",
    )
    gc.add_argument("--yes", action="store_true", help="remove them (default: only list them)")
    gc.add_argument("--under", metavar="PATH", help="only data directories under PATH")
    _add_json(gc)
    Settings.add_arguments(gc, only=("data_dir", "log_level"))
    gc.set_defaults(func=_gc)

    add_client_commands(commands)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, taking a command's optional last positional after its options too.

    argparse binds an optional positional (``sbx exec SESSION [CODE]``) empty at the
    positional before it, so a CODE written after the options was left over.
    """
    args, extra = parser.parse_known_args(argv)
    late = getattr(args, "late_positional", None)
    if late and len(extra) == 1 and getattr(args, late) is None and extra[0][:1] != "-":
        setattr(args, late, extra.pop())
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    try:
        settings = Settings.load(args)
        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("urllib3").setLevel(logging.WARNING)  # the engine API, polled
        # Nothing in the format needs them, and every record would look them up
        # (a walk up the stack for the caller): an execute logs two records.
        logging._srcfile = None  # type: ignore[attr-defined]  # the logging docs' own advice
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
        return args.func(settings, args)
    except GatewayError as e:
        print(f"sbx: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
