"""``session.commands.run`` over ``POST /v1/sessions/{id}/commands``, both halves, on a
stand-in transport (httpx.MockTransport): the request sent, the result read, the errors."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest
from fake_gateway import Handler, answering, async_client, sync_client

from gateway.api.base import error_json
from gateway.client import (
    CommandResult,
    GatewayUnreachable,
    NotSupported,
)
from gateway.sandbox.swarm.placement import SwarmPlacement

RAN = {
    "pid": 41, "exit_code": 3, "stdout": "hi\n", "stderr": "oops\n",
    "truncated": False, "timed_out": False, "duration_ms": 12.5,
}  # fmt: skip


def swarm_refusal() -> Exception:
    """The Swarm placement's own refusal of a command, as the gateway raises it."""
    placement = SimpleNamespace(name=SwarmPlacement.name)
    try:
        asyncio.run(SwarmPlacement.start_process(placement, "sbx-1", ["ls"], {}, "", None))
    except NotSupported as refused:
        return refused
    raise AssertionError("the Swarm placement ran a command")


def run_sync(handler: Handler, *args, **kwargs) -> CommandResult:
    with sync_client(handler) as client:
        return client.session("s 1").commands.run(*args, **kwargs)


def run_async(handler: Handler, *args, **kwargs) -> CommandResult:
    async def main() -> CommandResult:
        client = async_client(handler)
        try:
            return await client.session("s 1").commands.run(*args, **kwargs)
        finally:
            await client.aclose()

    return asyncio.run(main())


HALVES = pytest.mark.parametrize("run", [run_sync, run_async], ids=["sync", "async"])


@HALVES
def test_a_command_sends_its_line_and_options_and_reads_its_end(run):
    seen: list[httpx.Request] = []
    result = run(
        answering(200, RAN, seen), "echo hi; exit 3", timeout=5, env={"A": "b"}, cwd="work"
    )
    (request,) = seen
    assert (request.method, request.url.raw_path) == ("POST", b"/v1/sessions/s%201/commands")
    assert request.headers["Authorization"] == "Bearer token"
    assert json.loads(request.content) == {
        "command": "echo hi; exit 3", "timeout": 5, "env": {"A": "b"}, "cwd": "work",
    }  # fmt: skip
    assert (result.exit_code, result.stdout, result.stderr) == (3, "hi\n", "oops\n")
    assert not result.ok and not result.timed_out and not result.truncated
    assert (result.pid, result.duration_ms, result.raw) == (41, 12.5, RAN)


@HALVES
def test_only_what_was_given_is_sent_and_a_zero_exit_is_ok(run):
    seen: list[httpx.Request] = []
    result = run(answering(200, {**RAN, "exit_code": 0}, seen), "true")
    assert json.loads(seen[0].content) == {"command": "true"}
    assert result.ok
    # The gateway ends the command at its time limit (the session's, by default) and
    # answers then: the SDK's own read timeout must not cut it short.
    assert seen[0].extensions["timeout"]["read"] is None


@HALVES
def test_a_command_killed_at_its_timeout_says_so(run):
    ended = {**RAN, "exit_code": None, "timed_out": True, "stdout": "partial\n"}
    result = run(answering(200, ended, []), "sleep 60", timeout=1)
    assert result.timed_out and result.exit_code is None and not result.ok
    assert result.stdout == "partial\n"


@HALVES
def test_a_swarm_gateway_refuses_with_the_placement_s_reason(run):
    swarm = swarm_refusal()
    body = error_json(swarm.code, swarm.message)
    with pytest.raises(NotSupported) as refused:
        run(answering(swarm.status, body, []), "ls")
    assert (refused.value.status, refused.value.code) == (501, "not_supported")
    assert refused.value.message == swarm.message
    assert "swarm placement" in swarm.message and "run_code" in swarm.message


@HALVES
def test_a_command_is_never_sent_twice(run):
    """A dropped connection may have started it: no retry, the caller decides."""
    seen: list[httpx.Request] = []

    def drop(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raise httpx.ReadError("connection reset", request=request)

    with pytest.raises(GatewayUnreachable):
        run(drop, "make install")
    assert len(seen) == 1


@HALVES
@pytest.mark.parametrize("command", [["ls", "-l"], "", "   ", None])
def test_a_command_that_is_not_a_shell_line_is_refused_before_sending(run, command):
    seen: list[httpx.Request] = []
    with pytest.raises((TypeError, ValueError), match="shell command line"):
        run(answering(200, RAN, seen), command)
    assert seen == []


@HALVES
@pytest.mark.parametrize("option", ["envs", "background", "on_stdout"])
def test_e2b_options_this_call_does_not_have_are_refused_by_name(run, option):
    seen: list[httpx.Request] = []
    with pytest.raises(TypeError, match=rf"\['{option}'\].*takes timeout, env, cwd"):
        run(answering(200, RAN, seen), "ls", **{option: True})
    assert seen == []
