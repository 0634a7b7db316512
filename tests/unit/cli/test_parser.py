"""The sbx command line as a parser: every command that prints takes --json."""

from __future__ import annotations

import pytest

from gateway.cli.main import build_parser, parse

# Commands that never print a result: the server, and the MCP server (its stdout is the protocol).
SILENT = {"serve", "mcp"}


def subcommands(parser, path=()):
    """(command path, its parser) for every leaf command of ``sbx``."""
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield from subcommands(sub, (*path, name))
            return
    yield path, parser


def test_every_command_that_prints_takes_json():
    missing = [
        " ".join(path)
        for path, parser in subcommands(build_parser())
        if path[0] not in SILENT and "--json" not in parser._option_string_actions
    ]
    assert not missing, f"no --json on: {missing}"


def test_exec_takes_its_code_after_its_options_as_before_them():
    """argparse bound the optional CODE empty at the session id, so ``sbx exec SID --context
    C CODE`` (the order every example writes) was "unrecognized arguments"."""
    parser = build_parser()
    for argv in (
        ["exec", "s1", "--context", "c1", "--timeout", "5", "x = 1"],
        ["exec", "s1", "x = 1", "--context", "c1", "--timeout", "5"],
        ["exec", "--context", "c1", "s1", "--timeout", "5", "x = 1"],
    ):
        args = parse(parser, argv)
        assert (args.session, args.code, args.context, args.timeout) == ("s1", "x = 1", "c1", 5)
    assert parse(parser, ["exec", "s1", "--file", "job.py"]).code is None


def test_exec_still_refuses_what_it_does_not_know(capsys):
    for argv in (["exec", "s1", "--context", "c1", "x = 1", "y = 2"], ["exec", "s1", "--bogus"]):
        with pytest.raises(SystemExit) as exit:
            parse(build_parser(), argv)
        assert exit.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err
