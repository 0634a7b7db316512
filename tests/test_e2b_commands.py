"""Commands in a session's sandbox: the stock SDK's ``commands`` and ``pty``, and /v1's."""

from __future__ import annotations

import asyncio
import time

import e2b
import httpx
import pytest
from e2b import CommandExitException
from e2b_code_interpreter import Sandbox
from helpers import GatewayProcess

pytestmark = pytest.mark.docker


def test_run_streams_output_and_exit_codes(e2b_sandbox: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    result = e2b_sandbox.commands.run(
        "echo first; sleep 1; echo oops >&2; pwd; id -u",
        on_stdout=lambda line: seen.append((time.monotonic(), line)),
    )
    done = time.monotonic()
    assert result.exit_code == 0 and result.stderr == "oops\n"
    assert result.stdout == "first\n/workspace\n1000\n", "not the kernel's user and directory"
    assert seen[0][1] == "first\n" and done - seen[0][0] > 0.8, "stdout came only at the end"
    with pytest.raises(CommandExitException) as failed:
        e2b_sandbox.commands.run("echo bad >&2; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stderr == "bad\n"


def test_env_cwd_and_files_shared_with_the_kernel(e2b_sandbox: Sandbox) -> None:
    e2b_sandbox.files.write("sub/note.txt", "from files")
    result = e2b_sandbox.commands.run("echo $GREETING; cat note.txt", envs={"GREETING": "hi"},
                                  cwd="/home/user/sub")  # fmt: skip
    assert result.stdout == "hi\nfrom files"
    e2b_sandbox.commands.run("echo made > by_command.txt")
    assert e2b_sandbox.run_code("open('by_command.txt').read()").text == "'made\\n'"


def test_background_list_stdin_kill_and_connect(e2b_sandbox: Sandbox) -> None:
    sleeper = e2b_sandbox.commands.run("sleep 60", background=True)
    reader = e2b_sandbox.commands.run("cat", background=True, stdin=True)
    assert {sleeper.pid, reader.pid} <= {p.pid for p in e2b_sandbox.commands.list()}
    e2b_sandbox.commands.send_stdin(reader.pid, "typed\n")
    e2b_sandbox.commands.close_stdin(reader.pid)
    assert reader.wait().stdout == "typed\n"
    sleeper.disconnect()
    again = e2b_sandbox.commands.connect(sleeper.pid)
    assert e2b_sandbox.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException):
        again.wait()
    assert sleeper.pid not in {p.pid for p in e2b_sandbox.commands.list()}
    assert e2b_sandbox.commands.kill(sleeper.pid) is False


def test_the_egress_policy_holds_for_commands(e2b_sandbox: Sandbox) -> None:
    """The sandbox has no network by default: a command cannot reach out either."""
    reach = "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 3)\""
    with pytest.raises(CommandExitException) as refused:
        e2b_sandbox.commands.run(reach)
    assert "unreachable" in refused.value.stderr.lower() or "error" in refused.value.stderr.lower()


def test_pty(e2b_sandbox: Sandbox) -> None:
    terminal = e2b_sandbox.pty.create(size=e2b.PtySize(rows=24, cols=80))
    e2b_sandbox.pty.resize(terminal.pid, e2b.PtySize(rows=30, cols=100))
    e2b_sandbox.pty.send_stdin(terminal.pid, b"stty size; echo pty-$((6*7)); exit\n")
    out: list[bytes] = []
    terminal.wait(on_pty=out.append)
    text = b"".join(out).decode(errors="replace")
    assert "pty-42" in text and "30 100" in text, text[-400:]


def test_a_command_does_not_wait_for_a_busy_kernel(e2b_sandbox: Sandbox) -> None:
    """Commands run beside the kernel: a long cell does not hold them up."""
    import threading

    cell = threading.Thread(target=e2b_sandbox.run_code, args=("import time; time.sleep(3)",))
    cell.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert e2b_sandbox.commands.run("echo quick").stdout == "quick\n"
    assert time.monotonic() - started < 2
    cell.join()


def test_v1_commands_endpoint(gateway: GatewayProcess, session: dict) -> None:
    api, path = gateway.client, f"/v1/sessions/{session['id']}/commands"
    r = api.post(path, json={"command": "echo out; echo err >&2; exit 4"})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert (reply["exit_code"], reply["stdout"], reply["stderr"]) == (4, "out\n", "err\n")
    r = api.post(path, json={"command": "chrt --pid $$"})
    assert "SCHED_BATCH" in r.json()["stdout"], "a command preempts the gateway when it wakes"
    r = api.post(path, json={"command": "sleep 30", "timeout": 1})
    assert r.json()["timed_out"] is True and r.json()["exit_code"] is None
    r = api.post(path, json={"command": "head -c 3000000 /dev/zero | tr '\\0' x"})
    assert r.json()["truncated"] is True and len(r.json()["stdout"]) <= 1024 * 1024
    for bad in (
        {},
        {"command": ""},
        {"command": "ls", "cwd": "../.."},
        {"command": "ls", "env": 1},
    ):
        assert api.post(path, json=bad).status_code == 400, bad
    assert httpx.post(gateway.url + path, json={"command": "id"}).status_code == 401


def test_stream_input_reaches_stdin_as_it_is_sent(e2b_sandbox: Sandbox) -> None:
    reader = e2b_sandbox.commands.run("cat", background=True, stdin=True)
    e2b_sandbox.commands.stream_input(reader.pid, ["one\n", b"two\n"])
    e2b_sandbox.commands.send_stdin(reader.pid, "three\n")
    e2b_sandbox.commands.close_stdin(reader.pid)
    assert reader.wait().stdout == "one\ntwo\nthree\n"
    with pytest.raises(e2b.NotFoundException):
        e2b_sandbox.commands.stream_input(99999, ["nobody\n"])


def test_async_stdin_and_stream_input() -> None:
    """The async SDK's input handle streams: what is sent arrives before the stream ends."""

    async def main() -> None:
        sbx = await e2b.AsyncSandbox.create()
        try:
            seen: list[str] = []
            reader = await sbx.commands.run(
                "cat", background=True, stdin=True, on_stdout=seen.append
            )
            await sbx.commands.send_stdin(reader.pid, "sent\n")
            handle = sbx.commands.stream_input(reader.pid)
            await handle.send("streamed\n")
            deadline = time.monotonic() + 15
            while "".join(seen) != "sent\nstreamed\n":
                assert time.monotonic() < deadline, f"only {seen!r} came while streaming"
                await asyncio.sleep(0.1)
            await handle.send(b"last\n")
            await handle.close()
            await sbx.commands.close_stdin(reader.pid)
            assert (await reader.wait()).stdout == "sent\nstreamed\nlast\n"
        finally:
            await sbx.kill()

    asyncio.run(main())
