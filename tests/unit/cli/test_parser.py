"""The sbx command line as a parser: every command that prints takes --json."""

from __future__ import annotations

from gateway.cli.main import build_parser

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
