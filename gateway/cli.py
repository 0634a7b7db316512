"""The ``sbx`` command: ``serve`` the gateway, ``images build|ls``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

from .config import Settings
from .errors import GatewayError


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from .app import Gateway

    asyncio.run(Gateway(settings).serve())
    return 0


def _builder(settings: Settings):
    import docker

    from .images import ImageBuilder

    return ImageBuilder(
        docker.from_env(),
        Path(settings.images_dir),
        base=settings.base_image,
        progress=lambda line: print(line, flush=True),
    )


def _images_build(settings: Settings, args: argparse.Namespace) -> int:
    builder = _builder(settings)
    for name in args.names or builder.names():
        tag = builder.build(name, force=args.force)
        print(f"{name}: {tag}")
    return 0


def _images_ls(settings: Settings, args: argparse.Namespace) -> int:
    rows = _builder(settings).list()
    print(f"{'NAME':<12} {'TAG':<28} {'BUILT':<6} {'SIZE':>10}")
    for row in rows:
        size = f"{row['size'] / 1e6:.0f} MB" if row.get("size") else "-"
        print(f"{row['name']:<12} {row['tag']:<28} {'yes' if row['built'] else 'no':<6} {size:>10}")
    return 0


def _request(settings: Settings, method: str, path: str, **kw) -> httpx.Response:
    """Call the gateway; turn its JSON errors into a GatewayError for main()."""
    try:
        with httpx.Client(base_url=settings.url, timeout=None) as client:
            response = client.request(method, path, **kw)
    except httpx.HTTPError as e:
        raise GatewayError(f"cannot reach the gateway at {settings.url}: {e}") from e
    if response.is_error:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError):
            message = response.text
        raise GatewayError(f"{response.status_code}: {message}")
    return response


def _export(settings: Settings, args: argparse.Namespace) -> int:
    params = {} if args.descriptions else {"descriptions": "false"}
    response = _request(settings, "GET", f"/v1/sessions/{args.session}/notebook", params=params)
    output = Path(args.output or f"session-{args.session}.ipynb")
    output.write_bytes(response.content)
    print(f"wrote {output}")
    return 0


def _replay(settings: Settings, args: argparse.Namespace) -> int:
    source = Path(args.notebook)
    params = {} if args.image_tolerance is None else {"image_tolerance": args.image_tolerance}
    report = _request(
        settings, "POST", "/v1/notebooks/replay", content=source.read_bytes(), params=params
    ).json()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sbx", description="Sandboxed Jupyter kernel gateway.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway until SIGINT/SIGTERM")
    Settings.add_arguments(serve)
    serve.set_defaults(func=_serve)

    images = commands.add_parser("images", help="build and list kernel images")
    image_commands = images.add_subparsers(dest="images_command", required=True)
    build = image_commands.add_parser("build", help="build kernel images (skips unchanged ones)")
    build.add_argument("names", nargs="*", help="image names (default: all in images/)")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    Settings.add_arguments(build)
    build.set_defaults(func=_images_build)
    ls = image_commands.add_parser("ls", help="list kernel images and whether they are built")
    Settings.add_arguments(ls)
    ls.set_defaults(func=_images_ls)

    export = commands.add_parser("export", help="download a session as a .ipynb notebook")
    export.add_argument("session", help="session id")
    export.add_argument("-o", "--output", help="file to write (default session-ID.ipynb)")
    export.add_argument(
        "--no-descriptions",
        dest="descriptions",
        action="store_false",
        help="leave out the markdown cells made from execute descriptions",
    )
    Settings.add_arguments(export, only=("url",))
    export.set_defaults(func=_export)

    replay = commands.add_parser(
        "replay", help="re-run a notebook in a fresh session; exit 1 unless it reproduces"
    )
    replay.add_argument("notebook", help=".ipynb file (e.g. from sbx export)")
    replay.add_argument("-o", "--output", help="executed notebook (default NAME.replayed.ipynb)")
    replay.add_argument(
        "--image-tolerance",
        type=float,
        help="compare images by pixels, allowing this mean difference (0 to 1)",
    )
    Settings.add_arguments(replay, only=("url",))
    replay.set_defaults(func=_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.load(args)
        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
        return args.func(settings, args)
    except GatewayError as e:
        print(f"sbx: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
