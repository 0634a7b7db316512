"""What the CLI's unit tests share: a client command run on a fake SDK client."""

from __future__ import annotations

import contextlib

import pytest

from gateway.cli import commands
from gateway.cli.main import build_parser


@pytest.fixture
def use_client(monkeypatch):
    """``use_client(fake)``: the commands' SDK client is ``fake``, which records their calls."""

    def use(fake):
        monkeypatch.setattr(commands, "_client", lambda settings: contextlib.nullcontext(fake))
        return fake

    return use


@pytest.fixture
def sbx():
    """``sbx(*argv)``: a client command's exit code, run past the settings it loads."""

    def run(*argv: str) -> int:
        args = build_parser().parse_args(list(argv))
        return args.func.args[0](None, args)

    return run
