"""envd's Process service (the SDK's ``commands`` and ``pty``) over the session's commands.

Start and Connect stream the command's events: its pid, its output as it
comes, a keep-alive when it is silent (at the interval the SDK asks for), and
its end with the exit code. A client that goes away leaves the command
running, as envd does: it is found again by pid (connect, list, kill, stdin).
``StreamInput`` is a client stream: its messages reach stdin as they arrive
(``rpc.StreamedRPCHandler`` hands the body on as it comes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_connect as proc_rpc
from e2b.envd.process import process_pb as proc
from protobuf import Oneof

from ...access.auth import Principal
from ...access.mcp_tokens import McpTokens
from ...errors import BadRequest
from ...sessions.commands import Command
from ...sessions.executions import Executions
from ...sessions.requests import StartCommand
from .connect import as_connect_errors
from .envd import workspace_path
from .mcp import mcp_gateway_token

KEEPALIVE = 50.0  # seconds of silence before a keep-alive, unless the client asks otherwise
Event = proc.ProcessEvent


def _pid(selector: proc.ProcessSelector | None) -> int:
    match selector.selector if selector is not None else None:
        case Oneof(field="pid", value=pid):
            return pid
    raise BadRequest("select the process by pid; tags are not offered")


class ProcessService(proc_rpc.Process):
    """One sandbox's commands, for one request's caller."""

    def __init__(
        self, executions: Executions, sandbox_id: str, who: Principal, mcp_tokens: McpTokens
    ) -> None:
        self.executions, self.sandbox_id, self.who = executions, sandbox_id, who
        self.mcp_tokens = mcp_tokens

    def command(self, selector: proc.ProcessSelector | None) -> Command:
        return self.executions.command(self.sandbox_id, self.who, _pid(selector))

    async def list(self, request: proc.ListRequest, ctx: Any, /) -> proc.ListResponse:
        with as_connect_errors():
            running = self.executions.running_commands(self.sandbox_id, self.who)
        return proc.ListResponse(processes=[_info(c) for c in running])

    async def start(
        self, request: proc.StartRequest, ctx: Any, /
    ) -> AsyncIterator[proc.StartResponse]:
        config = request.process or proc.ProcessConfig()
        size = request.pty.size if request.pty is not None else None
        with as_connect_errors():
            token = mcp_gateway_token([config.cmd, *config.args], dict(config.envs))
            if token is not None:
                await self._register_mcp(token)
        if token is not None:
            for event in _ran_at_once():
                yield proc.StartResponse(event=event)
            return
        with as_connect_errors():
            command = await self.executions.start_command(
                self.sandbox_id,
                self.who,
                StartCommand(
                    argv=[config.cmd, *config.args],
                    env=dict(config.envs),
                    cwd=workspace_path(config.cwd) if config.cwd else "",
                    tty=(size.rows, size.cols) if size is not None else None,
                    tag=request.tag,
                ),
            )
        async for event in _events(command, _keepalive(ctx)):
            yield proc.StartResponse(event=event)

    async def _register_mcp(self, token: str) -> None:
        """The SDK's ``mcp-gateway`` command after ``create(mcp=...)``: no process here (the
        gateway answers the sandbox's MCP URL), its token made the URL's, in the session's
        record before the command answers (a restart right after create keeps it)."""
        sessions = self.executions.sessions
        session = sessions.get(self.sandbox_id, self.who)  # still there
        try:
            registration = self.mcp_tokens.registration(
                self.sandbox_id, token, self.who.acting_for or ""
            )
        except ValueError as e:
            raise BadRequest(f"{e}; the SDK makes a random UUID") from None
        session.mcp_token = registration
        await sessions.save(session)

    async def connect(
        self, request: proc.ConnectRequest, ctx: Any, /
    ) -> AsyncIterator[proc.ConnectResponse]:
        with as_connect_errors():
            command = self.command(request.process)
        async for event in _events(command, _keepalive(ctx)):
            yield proc.ConnectResponse(event=event)

    async def send_input(self, request: proc.SendInputRequest, ctx: Any, /) -> Any:
        with as_connect_errors():
            command = self.command(request.process)
            match request.input.input if request.input is not None else None:
                case Oneof(field="stdin" | "pty", value=data):
                    await command.send_stdin(data)
        return proc.SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[proc.StreamInputRequest], ctx: Any, /
    ) -> proc.StreamInputResponse:
        """Each piece of input to the process's stdin (or terminal) as its message arrives.

        The first message names the process; a slow reader holds the stream back.
        """
        command: Command | None = None
        async for message in request:
            match message.event:
                case Oneof(field="start", value=start):
                    with as_connect_errors():
                        command = self.command(start.process)
                case Oneof(field="data", value=data):
                    if command is None:
                        raise ConnectError(
                            Code.INVALID_ARGUMENT, "name the process in a start event first"
                        )
                    match data.input.input if data.input is not None else None:
                        case Oneof(field="stdin" | "pty", value=piece) if piece:
                            with as_connect_errors():
                                await command.send_stdin(piece)
        return proc.StreamInputResponse()

    async def close_stdin(self, request: proc.CloseStdinRequest, ctx: Any, /) -> Any:
        with as_connect_errors():
            await self.command(request.process).close_stdin()
        return proc.CloseStdinResponse()

    async def send_signal(self, request: proc.SendSignalRequest, ctx: Any, /) -> Any:
        with as_connect_errors():
            if int(request.signal) not in (9, 15):
                raise BadRequest("send SIGKILL or SIGTERM")
            await self.command(request.process).signal(int(request.signal))
        return proc.SendSignalResponse()

    async def update(self, request: proc.UpdateRequest, ctx: Any, /) -> proc.UpdateResponse:
        with as_connect_errors():
            command = self.command(request.process)
            if request.pty is not None and request.pty.size is not None:
                await command.resize(request.pty.size.rows, request.pty.size.cols)
        return proc.UpdateResponse()


def _info(command: Command) -> proc.ProcessInfo:
    request = command.request
    cmd, *args = request.argv
    config = proc.ProcessConfig(cmd=cmd, args=args, envs=dict(request.env), cwd=request.cwd)
    return proc.ProcessInfo(config=config, pid=command.pid, tag=request.tag)


def _keepalive(ctx: Any) -> float:
    """The keep-alive interval the client asked for (``Keepalive-Ping-Interval``), in seconds."""
    asked = ctx.request_headers.get("keepalive-ping-interval", "")
    return float(asked) if asked.isdigit() and int(asked) > 0 else KEEPALIVE


def _ran_at_once() -> list[Event]:
    """A command the edge answered itself: started and ended at once, exit 0 (pid 0)."""
    end = Event.EndEvent(exit_code=0, exited=True, status="exit status 0")
    return [Event(event=Oneof("start", Event.StartEvent(pid=0))), Event(event=Oneof("end", end))]


async def _events(command: Command, keepalive: float) -> AsyncIterator[Event]:
    """Start, then data (and keep-alives while it is silent), then its end."""
    listener = command.listen()
    try:
        yield Event(event=Oneof("start", Event.StartEvent(pid=command.pid)))
        while True:
            try:
                chunk = await listener.next(timeout=keepalive)
            except TimeoutError:
                yield Event(event=Oneof("keepalive", Event.KeepAlive()))
                continue
            if chunk is None:
                break
            kind, data = chunk
            yield Event(event=Oneof("data", Event.DataEvent(output=Oneof(kind, data))))
    finally:
        listener.close()
    code = await command.exit_code
    end = Event.EndEvent(exit_code=code, exited=code >= 0, status=f"exit status {code}")
    yield Event(event=Oneof("end", end))
