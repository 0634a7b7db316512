"""Tools called from a session's code: each call through the policy gate, into the record.

A session is given tools (``ToolsConfig``) at create or later; the gateway
connects to each MCP server as a client (``tools/mcp_servers.py``), lists its
tools, and serves the session's tool socket (``tools/endpoint.py``). Code in
the kernel calls them as functions (``tools/sbx_tools.py``, put in a Python
kernel's ``sys.modules`` before its first execute).

A call is taken only while an execute of the session runs (its ``ToolTurn``,
opened by ``Executions``): outside one it is refused, and calls still open
when the execute ends are cut. Each call is judged by the gate
(``Gate.review_tool``: allow, hold for an approver, deny), counted against
the execute's ``calls_per_execute``, bounded in time and result size, and
recorded (tool, masked arguments, size, duration, decision) in the
execution's review, which the history and the notebook export show, and in
the audit log. One approval covers the next ``approval_covers`` calls of its
tool in that execute; calls of the tool made while it is pending wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from ..access.auth import Principal
from ..access.secrets import SecretVault
from ..egress.policy import AddressGuard
from ..errors import BadRequest, NotSupported, Unavailable
from ..execution.kernel import ExecutionResult, Kernel
from ..execution.recorder import TOOL, ExecutionRecorder
from ..masking import Masker
from ..policy.approvals import Approval
from ..policy.gate import Gate
from ..policy.model import Decision
from ..sandbox.base import ENGINE_ERRORS
from ..tools.endpoint import MAX_DEPTH, CallRefused, ToolEndpoint, depth
from ..tools.mcp_servers import McpConnection, Refusal, ToolFailed
from ..tools.sbx_tools import python_name
from ..tools.specs import (
    TOOL_NAME,
    CallLimits,
    McpServer,
    Rule,
    StdioServer,
    Tool,
    ToolsConfig,
    default_action,
    parse_tools,
)
from ..tools.stdio_servers import ServerProcess, StdioConnection
from .manager import SessionManager
from .model import Session
from .requests import CreateSession

log = logging.getLogger(__name__)

SOURCE = (Path(__file__).parent.parent / "tools" / "sbx_tools.py").read_text()
# Run in globals of its own, so the user's namespace gains and loses no name.
_INSTALL = (
    "import sys, types\n"
    "m = types.ModuleType('sbx_tools', 'Tools of this session (the gateway put it here).')\n"
    "m.__file__ = 'sbx_tools.py'\n"
    f"exec(compile({SOURCE!r}, 'sbx_tools.py', 'exec'), m.__dict__)\n"
    "sys.modules['sbx_tools'] = m\n"
)
INJECT = f"exec({_INSTALL!r}, {{}})\n"
MAX_RECORDED_ARGUMENTS = 2048  # characters of a call's arguments its record keeps
# Bytes of its stdio servers' listed tools (JSON) a session's record keeps; one listing
# more is not kept, and a restart lists them by starting the servers.
MAX_KEPT_LISTING = 256 << 10
# Seconds a call waits for the window of an execute sent, not yet begun: a loaded host
# reads the kernel's word that it began after the code's first call (2 s was too short).
BEGIN_WAIT = 10.0

Connect = Callable[[McpServer, dict[str, str], int, Refusal], McpConnection]
CallHook = Callable[[str, Principal, str, dict[str, Any]], None]


class ToolServerFailed(Unavailable):
    """An MCP server a session is to be given does not answer as one."""

    status = 502
    code = "tool_server_failed"


@dataclasses.dataclass
class ToolTurn:
    """One execute's window for tool calls: who ran it, what it called, what was approved."""

    who: Principal
    recorder: ExecutionRecorder
    calls: int = 0
    granted: dict[str, int] = dataclasses.field(default_factory=dict)  # calls left, by tool
    pending: dict[str, asyncio.Future[bool]] = dataclasses.field(default_factory=dict)
    ended: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    client: dict[str, tuple[Tool, ToolServer]] = dataclasses.field(default_factory=dict)
    on_hold: Callable[[Approval], None] | None = None  # hears of each call held (the stream)
    kernel: Kernel | None = None  # the kernel the execute runs in, and its restarts then
    restarts: int = 0

    def live(self) -> bool:
        """Open: not ended, its kernel neither restarted nor dead (a relayed cell's end is
        then never seen, and a process it started may still call)."""
        kernel = self.kernel
        gone = kernel is not None and (kernel.died.is_set() or kernel.restarts != self.restarts)
        return not (self.ended.is_set() or gone)


class ToolServer(Protocol):
    """What answers a tool's calls: an MCP server's connection, or the agent's own process."""

    async def call(
        self, name: str, arguments: dict[str, Any], timeout: float
    ) -> dict[str, Any]: ...


@dataclasses.dataclass
class Toolbox:
    """A session's tools, its connections to their servers, and its open turn."""

    config: ToolsConfig
    limits: CallLimits
    tools: dict[str, tuple[Tool, McpConnection]]
    masker: Masker  # the header secrets' values: never sent into the sandbox
    slots: asyncio.Semaphore
    turn: ToolTurn | None = None
    injected: tuple[int, int] | None = None  # (kernel, its restarts) the module was put in
    served: Path | None = None  # the run directory its socket is served in
    encoded: tuple[ToolTurn | None, bytes] | None = None  # the listing as last sent, its turn
    # Executes sent to the kernel whose code has not begun (by record): a call may come
    # before the gateway reads the kernel's word that one began, so it waits for its window.
    coming: set[ExecutionRecorder] = dataclasses.field(default_factory=set)
    opened: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # a turn opened
    servers: tuple[McpConnection, ...] = ()  # each server's, whether it lists tools or not
    frozen: bool = False  # its stdio servers' sandboxes, with its session's
    # Its stdio servers' tools as listed, by server: kept in its session's record.
    listed: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        running = {c.server.name: c.sandbox_id is not None for c in self._stdio()}
        up = "frozen" if self.frozen else "running"
        return {
            "mcp": [server.to_json() for server in self.config.mcp],
            "stdio": [
                {**server.to_json(), "container": up if running.get(server.name) else "stopped"}
                for server in self.config.stdio
            ],
            "tools": [tool.to_json() for tool, _ in self.tools.values()],
            "limits": self.limits.to_json(),
        }

    def listing(self) -> list[dict[str, Any]]:
        """What the sandbox may call now: the servers' tools and the running execute's client
        tools."""
        return [
            {k: v for k, v in tool.to_json().items() if k != "approval_covers"}
            for tool, _ in self.reachable().values()
        ]

    def encoded_listing(self) -> bytes:
        """``listing`` as the socket sends it, encoded once per turn: a kernel may ask in a
        loop, and a server may list megabytes."""
        if self.encoded is None or self.encoded[0] is not self.turn:
            body = json.dumps({"tools": self.listing()}, separators=(",", ":")).encode()
            self.encoded = (self.turn, body)
        return self.encoded[1]

    def reachable(self) -> dict[str, tuple[Tool, ToolServer]]:
        return {**self.tools, **(self.turn.client if self.turn is not None else {})}

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.servers))

    def _stdio(self) -> list[StdioConnection]:
        return [c for c in self.servers if isinstance(c, StdioConnection)]

    async def freeze(self, freeze: Callable[[str], Awaitable[None]]) -> None:
        """Freeze each running stdio server's sandbox (``freeze``: the placement's) with its
        session's."""
        self.frozen = True
        await self._on_sandboxes(freeze)

    async def thaw(self, thaw: Callable[[str], Awaitable[None]]) -> None:
        """Let them run again with their session (or before its sandbox is saved)."""
        self.frozen = False
        await self._on_sandboxes(thaw)

    def hold(self, session: Session) -> None:
        """No server starts while ``session`` is paused (or being frozen): one still starting
        when the pause came, which found no sandbox of it, is ended once started."""
        for connection in self._stdio():
            connection.held = lambda: self.frozen or session.state == "paused"

    async def _on_sandboxes(self, act: Callable[[str], Awaitable[None]]) -> None:
        """``act`` on each running stdio server's sandbox; one the engine refuses is ended
        instead, logged: the next call starts it again."""

        async def one(connection: StdioConnection, sandbox_id: str) -> None:
            try:
                await act(sandbox_id)
            except ENGINE_ERRORS as e:
                log.warning("stdio server %s: the engine did not %s its sandbox %s with its "
                            "session's, so it is ended (the next call starts it again): %s",
                            connection.server.name, act.__name__, sandbox_id, e)  # fmt: skip
                await connection.rest()

        running = {c: c.sandbox_id for c in self._stdio()}
        await asyncio.gather(*(one(c, sid) for c, sid in running.items() if sid is not None))

    async def rest(self) -> None:
        """End each stdio server and its sandbox (its session is paused deep): the next call
        starts it again. Its kernel went too: the one its resume starts (the same Kernel,
        not restarted) is given sbx_tools again, and its socket (a pooled sandbox's
        directory takes the place of the session's) is served again."""
        self.injected = self.served = None
        await asyncio.gather(*(c.rest() for c in self._stdio()))


class SessionTools:
    """Every session's tools: giving them, serving their socket, and each call's way through."""

    def __init__(
        self,
        manager: SessionManager,
        gate: Gate,
        secrets: SecretVault | None,
        ceiling: CallLimits,
        guard: AddressGuard,
        connect: Connect = McpConnection,
    ) -> None:
        """``ceiling``: the most a session may ask for; ``guard``: the addresses MCP servers
        may not be at (the operator's ``tool_allow_ranges`` aside); ``connect``: makes a
        server's client."""
        self.manager = manager
        self.guard = guard
        self.gate = gate
        self.secrets = secrets
        self.ceiling = ceiling
        self.connect = connect
        self.endpoint = ToolEndpoint(self._listing, self.call)
        self.on_call: CallHook | None = None  # the audit log hears each call
        self._boxes: dict[str, Toolbox] = {}

    # -- giving tools ---------------------------------------------------------------------

    async def create(self, request: CreateSession, who: Principal) -> Session:
        """Create a session with the tools it asks for; their servers are reached first, so a
        create naming one that does not answer fails before a sandbox is made (stdio servers,
        whose sandboxes are made from the session's, after: the session then ends)."""
        if request.tools is None:
            return await self.manager.create(request, who)
        if request.tools.stdio:  # their sandboxes are made from the session's: once it is
            session = await self.manager.create(request, who)
            try:
                return await self.give(session.id, who, request.tools)
            except Exception:
                await self.manager.delete(session.id, who)
                raise
        box = await self._prepare(request.tools, who.tenant)
        try:
            session = await self.manager.create(request, who)
            await self._install(session, box)
        except BaseException:
            await box.close()
            raise
        return session

    async def give(self, session_id: str, who: Principal, config: ToolsConfig) -> Session:
        """Replace a live session's tools (``PUT .../tools``); an empty config takes them away."""
        session = self.manager.get(session_id, who)
        box = await self._prepare(config, session.tenant, session)
        try:
            await self._install(session, box)
        except BaseException:
            await box.close()
            raise
        return session

    def view(self, session_id: str, who: Principal) -> dict[str, Any]:
        self.manager.get(session_id, who)
        box = self._boxes.get(session_id)
        empty = {"mcp": [], "stdio": [], "tools": [], "limits": None}
        return box.to_json() if box is not None else empty

    async def _prepare(
        self,
        config: ToolsConfig,
        tenant: str,
        session: Session | None = None,
        recorded: dict[str, list[dict[str, Any]]] | None = None,
    ) -> Toolbox:
        """Connect to each server (header secrets unsealed; stdio ones started in sandboxes
        of their own, made from ``session``'s) and list its tools. A stdio server whose
        tools ``recorded`` lists (a paused session's record) is not started: the first call
        after its resume starts it."""
        values: dict[str, str] = {}
        if config.secrets:
            if self.secrets is None:
                raise BadRequest("this gateway offers no sealed secrets for tool headers")
            values = await self.secrets.unseal(tenant, config.secrets)
        masker = Masker(values)
        limits = (config.limits or self.ceiling).within(self.ceiling)
        room = 2 * limits.result_bytes + (64 << 10)  # content and structured copies, JSON-RPC
        tools: dict[str, tuple[Tool, McpConnection]] = {}
        functions: dict[str, Tool] = {}  # by the name sbx_tools gives its function
        listings: dict[str, list[dict[str, Any]]] = {}  # the stdio servers', to keep
        servers: list[tuple[McpServer | StdioServer, McpConnection, str, str]] = [
            (
                server,
                self.connect(
                    server,
                    {h.name: h.resolve(values) for h in server.headers},
                    room,
                    self.guard.refusal,
                ),
                f"({server.url}) did not answer as a streamable-HTTP MCP server",
                "its url",
            )
            for server in config.mcp
        ]
        for stdio in config.stdio:
            start = await self._stdio_start(stdio, tenant, session)
            servers.append((stdio, StdioConnection(stdio, start, room),
                            "did not answer as a stdio MCP server in its sandbox",
                            "its command and image"))  # fmt: skip
        recorded = recorded or {}

        async def reach(server: McpServer | StdioServer, connection: McpConnection) -> Any:
            if server.name not in recorded:
                return await connection.open()
            await connection.rest()  # as a deep pause leaves it: the next call starts it
            return recorded[server.name]

        # All at once: slow or silent servers hold a give for the longest one, not the sum.
        opened = await asyncio.gather(*(reach(s, c) for s, c, _, _ in servers),
                                      return_exceptions=True)  # fmt: skip
        connections = [c for (_, c, _, _), got in zip(servers, opened, strict=True)
                       if not isinstance(got, BaseException)]  # fmt: skip
        try:
            for (server, connection, failed, check), listed in zip(servers, opened, strict=True):
                if isinstance(listed, ToolFailed):
                    raise ToolServerFailed(
                        f"MCP server {server.name} {failed}: {masker.text(str(listed))}; "
                        f"check {check} and that it runs"
                    )
                if isinstance(listed, BaseException):
                    raise listed
                shown = masker.tree(listed)  # a server's words: shown to the sandbox
                if isinstance(server, StdioServer):
                    listings[server.name] = shown
                for spec in shown:
                    name = spec["name"]
                    if not isinstance(name, str) or not re.fullmatch(TOOL_NAME, name):
                        log.warning(
                            "MCP server %s lists a tool named %r: left out",
                            server.name,
                            str(name)[:80],
                        )
                        continue
                    if name in tools:
                        raise BadRequest(
                            f"tool {name} is listed by both {tools[name][0].server} and "
                            f"{server.name}; give one of them to this session"
                        )
                    other = functions.get(python_name(name))
                    if other is not None:  # sbx_tools would give the first one its calls
                        raise BadRequest(
                            f"tools {other.name} of {other.server} and {name} of {server.name} "
                            f"are both sbx_tools.{python_name(name)}; give one of them to "
                            "this session"
                        )
                    tools[name] = (_tool(spec, server.name, config), connection)
                    functions[python_name(name)] = tools[name][0]
        except BaseException:
            await asyncio.gather(*(c.close() for c in connections))
            raise
        unknown = sorted(set(config.rules) - set(tools))
        if unknown:
            await asyncio.gather(*(c.close() for c in connections))
            raise BadRequest(f"tools.rules names tools no server lists: {', '.join(unknown)}")
        slots = asyncio.Semaphore(limits.concurrent)
        if len(json.dumps(listings)) > MAX_KEPT_LISTING:
            listings = {}
        return Toolbox(config, limits, tools, masker, slots, servers=tuple(connections),
                       listed=listings)  # fmt: skip

    async def _stdio_start(
        self, server: StdioServer, tenant: str, session: Session | None
    ) -> Callable[[], Awaitable[ServerProcess]]:
        """How ``server`` is started: in a sandbox of its own, of the image it names (a
        kernel's, or one of the tenant's templates; else the default kernel's)."""
        spec = session.kernel.sandbox if session is not None and session.kernel else None
        if spec is None:
            raise BadRequest(f"tools.stdio.{server.name}: stdio servers are given to a session")
        lifecycle = self.manager.lifecycle
        if server.template is not None:
            if self.manager.templates is None:
                raise BadRequest("this gateway builds no templates; name a kernel's image")
            image = (await self.manager.templates.resolve(tenant, server.template))["image"]
        else:
            kernel = server.image or lifecycle.kernelspecs.default
            if kernel not in lifecycle.kernelspecs.names():
                raise BadRequest(
                    f"tools.stdio.{server.name}.image names a kernel (GET /v1/kernels lists "
                    f"them: {', '.join(lifecycle.kernelspecs.names())}) or give a template"
                )
            image = lifecycle.kernel_image(kernel)
        argv, env = list(server.command), dict(server.env)
        placement = lifecycle.placement
        return lambda: placement.start_tool_server(spec, server.name, image, argv, env)

    async def _install(self, session: Session, box: Toolbox) -> None:
        """Make ``box`` the session's tools, serving its socket; the old one's servers closed."""
        run_dir = getattr(session.kernel.sandbox, "run_dir", None) if session.kernel else None
        if run_dir is None:
            raise NotSupported(
                "tools need the docker placement (a run directory the gateway serves); this "
                "session's sandbox runs on another host"
            )
        old = self._boxes.pop(session.id, None)
        if old is not None:
            box.turn, box.injected = old.turn, old.injected  # a running execute keeps its turn
            box.served = old.served
            box.coming = old.coming
            await old.close()
        self._boxes[session.id] = box
        box.hold(session)
        session.tools = box
        given = box.config.mcp or box.config.stdio
        session.tool_config = dict(box.config.sent) if given else None
        session.tool_listing = box.listed or None
        self.manager.save_soon(session)
        if old is None:
            session.on_end.add(lambda reason: self.manager.spawn(self.close(session.id)))
        await self._serve(session, box, run_dir)
        if session.state == "paused" and box.config.stdio:
            async with session.lock:  # not mid-resume: its servers would stay frozen
                await self._paused(session, box)

    async def _paused(self, session: Session, box: Toolbox) -> None:
        """The servers given to a paused session (by a PUT: started to list their tools)
        pause with it: frozen with a frozen one, thawed by its resume; else ended till the
        first call after its resume."""
        if session.frozen:
            await box.freeze(self.manager.lifecycle.placement.freeze)
        elif session.state == "paused":
            await box.rest()

    async def _serve(self, session: Session, box: Toolbox, run_dir: Path) -> None:
        """Serve the session's socket in ``run_dir``, unless it is there already (a session
        resumed in a pooled sandbox has another run directory)."""
        if box.served != run_dir:
            await self.endpoint.open(session.id, run_dir)
            box.served = run_dir

    async def restore(self) -> None:
        """Give the sessions a restarted gateway took over the tools they had (their servers
        reached again; a paused one's stdio servers not started, their tools as its record
        lists them); one whose server no longer answers goes on without, logged."""
        for session in list(self.manager.sessions.values()):
            if not session.tool_config or session.kernel is None or session.id in self._boxes:
                continue
            try:
                config = parse_tools(session.tool_config)
                listed = session.tool_listing if session.state == "paused" else None
                box = await self._prepare(config, session.tenant, session, listed)
                await self._install(session, box)
            except Exception as e:
                log.warning("session %s: its tools could not be given again: %s", session.id, e)

    async def _empty(self, session: Session) -> Toolbox:
        """A toolbox of no server's tools, its socket served: for an execute's client tools."""
        slots = asyncio.Semaphore(self.ceiling.concurrent)
        box = Toolbox(ToolsConfig(), self.ceiling, {}, Masker({}), slots)
        await self._install(session, box)
        return box

    async def close(self, session_id: str) -> None:
        """Stop serving a session's tools (it ended)."""
        self.endpoint.close(session_id)
        box = self._boxes.pop(session_id, None)
        if box is not None:
            if box.turn is not None:
                box.turn.ended.set()
            await box.close()

    async def stop(self) -> None:
        await asyncio.gather(*(self.close(session_id) for session_id in list(self._boxes)))

    # -- an execute's turn ----------------------------------------------------------------

    def check_client_tools(
        self, session: Session, client_tools: tuple[dict[str, Any], ...], answered: bool
    ) -> None:
        """Refuse an execute's client tools before it runs: none can be answered (``answered``
        false: not on the agent stream), or one is named as a server's tool."""
        if not client_tools:
            return
        if not answered:
            raise BadRequest(
                "client tools are answered by the agent's process over the agent stream "
                f"(/v1/sessions/{session.id}/stream); send this execute there"
            )
        box = self._boxes.get(session.id)
        functions = {python_name(name) for name in (box.tools if box else ())}
        taken = sorted(t["name"] for t in client_tools if python_name(t["name"]) in functions)
        if taken:
            raise BadRequest(f"client tools {', '.join(taken)} are named as the session's tools")

    @contextlib.asynccontextmanager
    async def turn(
        self,
        session: Session,
        who: Principal,
        recorder: ExecutionRecorder,
        kernel: Kernel | None,
        client_tools: tuple[dict[str, Any], ...] = (),
        client: ToolServer | None = None,
        on_hold: Callable[[Approval], None] | None = None,
        at_begin: bool = False,
    ) -> AsyncIterator[Callable[[], None]]:
        """Take the session's tool calls while the block (an execute in ``kernel``) runs; cut
        them after. ``at_begin``: from when the function yielded is called (the kernel
        begins the execute's code; a Jupyter client's cell may run before it), not at once.

        ``client_tools`` are the execute's own, answered by ``client`` (the agent's process,
        over its stream): callable in this execute only.
        """
        await self.ready(session, kernel, empty=bool(client_tools))
        if at_begin:
            self.expect(session.id, recorder)
        opened: list[ToolTurn | None] = []

        def begin() -> None:
            if not opened:
                opened.append(
                    self.open(session, who, recorder, kernel, client_tools, client, on_hold)
                )

        if not at_begin:
            begin()
        try:
            yield begin
        finally:
            self.end(session.id, opened[0] if opened else None, recorder)

    async def ready(self, session: Session, kernel: Kernel | None, empty: bool = False) -> None:
        """Before an execute is sent: the socket served, and a Python kernel given
        ``sbx_tools`` (again after a restart). ``empty``: a session of no tools gets an empty
        toolbox (for an execute's client tools)."""
        box = self._boxes.get(session.id)
        if empty and box is None:
            box = await self._empty(session)
        if box is None:
            return
        run_dir = getattr(session.kernel.sandbox, "run_dir", None) if session.kernel else None
        if run_dir is not None:
            await self._serve(session, box, run_dir)
        if kernel is not None and session.language == "python":
            mark = (id(kernel), kernel.restarts)
            if box.injected != mark:
                await kernel.run_silently(INJECT)
                box.injected = mark

    def open(
        self,
        session: Session,
        who: Principal,
        recorder: ExecutionRecorder,
        kernel: Kernel | None,
        client_tools: tuple[dict[str, Any], ...] = (),
        client: ToolServer | None = None,
        on_hold: Callable[[Approval], None] | None = None,
    ) -> ToolTurn | None:
        """Open the window of an execute that starts running in ``kernel`` now (None: the
        session has no tools); ``end`` closes it."""
        box = self._boxes.get(session.id)
        if box is None:
            return None
        restarts = kernel.restarts if kernel is not None else 0
        turn = box.turn = ToolTurn(who, recorder, on_hold=on_hold, kernel=kernel, restarts=restarts)
        box.coming.discard(recorder)
        box.opened.set()  # wakes calls that came first
        box.opened = asyncio.Event()
        for spec in client_tools:
            assert client is not None
            tool = _tool(spec, "client", box.config, default="allow")  # the agent's own code
            turn.client[spec["name"]] = (tool, client)
        return turn

    def expect(self, session_id: str, recorder: ExecutionRecorder) -> None:
        """An execute (``recorder``'s) is sent to the kernel: its window opens when it begins."""
        box = self._boxes.get(session_id)
        if box is not None:
            box.coming.add(recorder)

    def end(
        self, session_id: str, turn: ToolTurn | None, recorder: ExecutionRecorder | None = None
    ) -> None:
        """Close an execute's window (``recorder``'s, begun or not): its calls still open are
        cut, later ones refused."""
        current = self._boxes.get(session_id)
        if current is not None:
            current.coming.discard(recorder or (turn and turn.recorder))
        if turn is None:
            return
        turn.ended.set()
        if current is not None and current.turn is turn:
            current.turn = None

    # -- a call from the sandbox ------------------------------------------------------------

    async def _listing(self, session_id: str) -> bytes:
        box = self._boxes.get(session_id)
        if box is None:
            return b'{"tools":[]}'
        await _begun(box)
        return box.encoded_listing()

    async def call(self, session_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A call from the session's tool socket: judged, held, made, bounded and recorded."""
        session, box = self._given(session_id)
        turn = await _begun(box)
        if turn is None or not turn.live():
            why = "tools are called from code while an execute runs; this call came outside one"
            raise CallRefused(409, "no_execute", f"{why} (a thread left running?)")
        return await self._call(session, box, turn, name, arguments)

    def mcp_listing(self, session_id: str) -> list[dict[str, Any]]:
        """What the sandbox's MCP URL lists: its servers' tools (no execute's client tools)."""
        box = self._boxes.get(session_id)
        return [] if box is None else [tool.to_json() for tool, _ in box.tools.values()]

    async def call_over_mcp(
        self, session_id: str, who: Principal, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """A call through the sandbox's MCP URL (E2B's ``get_mcp_url()``), from outside the
        kernel: the same gate, limits and record as the kernel's, each call a turn of its own
        recorded as an execution of kind ``tool`` (no execute's client tools, and
        ``calls_per_execute`` counts this one call: ``concurrent`` bounds a flood). A paused
        session is resumed first, as by any traffic: its servers run only while it does (a
        call that can only be refused, for its tool's name, its arguments or the gate's
        verdict, leaves it be)."""
        session, box = self._given(session_id)
        if name not in box.tools:
            raise _no_tool(name)
        if depth(arguments) > MAX_DEPTH:  # as the tool socket refuses them
            raise CallRefused(
                400, "bad_request", f"arguments nested deeper than {MAX_DEPTH} levels"
            )
        tool = box.tools[name][0]
        verdict = self.gate.review_tool(session.tenant, session.policy, name, tool.rule.action)
        if session.state == "paused" and verdict.action != "deny":  # refused as it is
            await self.manager.wake(session_id, who)
        recorder = ExecutionRecorder(
            self.manager.store, session_id, f"# MCP tools/call {name[:128]}", None, {"kind": TOOL}
        )
        turn = ToolTurn(who, recorder)
        started = time.monotonic()
        status = "error"
        try:
            answer = await self._call(session, box, turn, name, arguments)
            status = "ok"
            return answer
        finally:
            took = round((time.monotonic() - started) * 1000, 3)
            await recorder.finish(ExecutionResult(status, None, [], None, took))

    def _given(self, session_id: str) -> tuple[Session, Toolbox]:
        box = self._boxes.get(session_id)
        session = self.manager.sessions.get(session_id)
        if box is None or session is None:
            raise CallRefused(404, "no_tools", "this session has no tools")
        return session, box

    async def _call(
        self, session: Session, box: Toolbox, turn: ToolTurn, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        session_id = session.id
        reachable = {**box.tools, **turn.client}
        if name not in reachable:
            raise _no_tool(name)
        limits = box.limits
        if turn.calls >= limits.calls_per_execute:
            why = f"more than {limits.calls_per_execute} tool calls in one execute"
            raise CallRefused(429, "too_many_calls", f"{why} (calls_per_execute); split the work")
        turn.calls += 1
        tool, connection = reachable[name]
        decision = self.gate.review_tool(session.tenant, session.policy, name, tool.rule.action)
        entry = _entry(tool, session.masker.tree(box.masker.tree(arguments)), decision.action)
        started = time.monotonic()
        work = asyncio.ensure_future(
            self._make(session, box, turn, tool, connection, arguments, decision)
        )
        ending = asyncio.ensure_future(turn.ended.wait())
        try:
            await asyncio.wait((work, ending), return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                work.cancel()
                why = f"the execute that called {name} ended before it was answered"
                raise CallRefused(409, "execute_ended", f"{why}; call tools while the cell runs")
            answer = work.result()
            entry.update(status="ok", bytes=answer.pop("bytes"))
            return answer
        except CallRefused as e:
            entry.update(status=e.code, error=e.message)
            raise
        finally:
            ending.cancel()
            if not work.done():
                work.cancel()
            entry["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
            turn.recorder.tool_calls.append(entry)
            if self.on_call is not None:
                outcome = "ok" if entry["status"] == "ok" else "denied"
                self.on_call(session_id, turn.who, outcome, entry)

    async def _make(
        self,
        session: Session,
        box: Toolbox,
        turn: ToolTurn,
        tool: Tool,
        connection: ToolServer,
        arguments: dict[str, Any],
        decision: Decision,
    ) -> dict[str, Any]:
        if decision.action == "deny":
            raise CallRefused(
                403, "denied", f"the policy refuses {tool.name}: " + "; ".join(decision.reasons)
            )
        if decision.action == "hold":
            await self._approved(session, box, turn, tool, arguments, decision)
        async with box.slots:
            try:
                answer = await connection.call(tool.name, arguments, box.limits.call_timeout)
            except ToolFailed as e:
                status = 504 if "did not answer within" in str(e) else 502
                why = session.masker.text(box.masker.text(str(e)))  # a server's words
                raise CallRefused(status, "tool_failed", why) from None
        size = len(json.dumps(answer, separators=(",", ":")))
        if size > box.limits.result_bytes:
            why = f"{tool.name} answered {size} bytes, over the {box.limits.result_bytes}"
            raise CallRefused(502, "too_large", f"{why} of result_bytes; ask for less")
        answer = session.masker.tree(box.masker.tree(answer))
        if answer["is_error"]:
            raise CallRefused(502, "tool_error", f"{tool.name} failed: {_text(answer)[:2000]}")
        return {"result": _value(answer), "content": answer["content"], "bytes": size}

    async def _approved(
        self,
        session: Session,
        box: Toolbox,
        turn: ToolTurn,
        tool: Tool,
        arguments: dict[str, Any],
        decision: Decision,
    ) -> None:
        """Wait for an approver unless an approval covers this call; CallRefused if denied."""
        while True:
            if turn.granted.get(tool.name, 0) > 0:
                turn.granted[tool.name] -= 1
                return
            waiting = turn.pending.get(tool.name)
            if waiting is None:
                break
            if not await asyncio.shield(waiting):
                raise CallRefused(403, "denied", f"an approval of {tool.name} was denied")
        decided = turn.pending[tool.name] = asyncio.get_running_loop().create_future()
        # whole (the socket bounds them): a cut would hide what follows a padded argument
        shown = json.dumps(session.masker.tree(box.masker.tree(arguments)))
        covers = tool.rule.approval_covers
        text = f"call {tool.name}({shown})" + (
            f"\n# approving covers the next {covers} calls of {tool.name} in this execute"
            if covers > 1
            else ""
        )
        desk = self.gate.desk
        approved = False
        try:
            approval = await desk.request(
                session.id, session.tenant, turn.who, text, "tool", decision
            )
            if turn.on_hold is not None:
                turn.on_hold(approval)
            assert session.kernel is not None
            await desk.wait(approval, session.kernel.died)
            approved = approval.state == "approved"
            if not approved:
                why = approval.reason or "no reason given"
                raise CallRefused(
                    403, "denied", f"approval {approval.id} of {tool.name} was denied: {why}"
                )
            turn.granted[tool.name] = covers - 1
        finally:
            del turn.pending[tool.name]
            decided.set_result(approved)


async def _begun(box: Toolbox) -> ToolTurn | None:
    """The running execute's window; one sent but not yet begun is waited for (its code may
    list or call tools before the gateway reads the kernel's begin)."""
    turn = box.turn
    if (turn is None or not turn.live()) and box.coming:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(BEGIN_WAIT):
                await box.opened.wait()
        turn = box.turn
    return turn


def _tool(spec: dict[str, Any], server: str, config: ToolsConfig, default: str = "") -> Tool:
    """A listed tool with its rule: the config's, else ``default``, else its annotations'."""
    rule = config.rules.get(spec["name"]) or Rule(default or default_action(spec["annotations"]))
    return Tool(
        spec["name"], server, spec["description"], spec["input_schema"], spec["annotations"], rule
    )


def _no_tool(name: str) -> CallRefused:
    why = f"this session has no tool {name!r}; sbx_tools.tools() lists the ones it has"
    return CallRefused(404, "unknown_tool", why)


def _entry(tool: Tool, arguments: dict[str, Any], decided: str) -> dict[str, Any]:
    """A call's record: its arguments kept as JSON text, cut at MAX_RECORDED_ARGUMENTS."""
    text = json.dumps(arguments, separators=(",", ":"))
    if len(text) > MAX_RECORDED_ARGUMENTS:
        text = text[:MAX_RECORDED_ARGUMENTS] + "…"
    return {
        "tool": tool.name,
        "server": tool.server,
        "arguments": text,
        "decision": decided,
        "bytes": 0,
    }


def _text(answer: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in answer["content"] if c.get("type") == "text")


def _value(answer: dict[str, Any]) -> Any:
    """A tool's answer as one Python value: its structured content (unwrapped from the
    ``{"result": ...}`` MCP servers wrap a non-object in), else its text (JSON if it is)."""
    structured = answer["structured"]
    if isinstance(structured, dict):
        return structured["result"] if set(structured) == {"result"} else structured
    content = answer["content"]
    if len(content) == 1 and content[0].get("type") == "text":
        try:
            return json.loads(content[0]["text"])
        except ValueError:
            return content[0]["text"]
    return content
