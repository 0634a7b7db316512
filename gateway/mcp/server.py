"""``sbx mcp``: the gateway as a Model Context Protocol tool server.

Built with the official MCP SDK's ``MCPServer`` over the async SDK client, so
any MCP-speaking agent gets sandboxed, stateful code execution: stdio by
default (the agent starts ``sbx mcp``), streamable HTTP with ``--http``, where
every caller brings a gateway token and acts as its tenant (``access.py``).
Results come back the way models read them best: text as text content,
images as image content, and a structured summary alongside; a long run
reports progress as it prints, and each session's files are resources.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
from mcp.server.auth.settings import AuthSettings
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)
from mcp.types import Resource as MCPResource
from pydantic import BaseModel, Field

from .. import __version__
from ..client import (
    Approval,
    AsyncClient,
    AsyncSession,
    Execution,
    ExecutionError,
    FileTooLarge,
    GatewayError,
    Result,
)
from ..client.models import IMAGE_TYPES, CodeContext, SessionInfo
from ..client.settings import ClientSettings
from ..tasks import end_task
from .access import GatewayClients

log = logging.getLogger(__name__)

# Larger downloads belong on the files API, not in a model's context.
MAX_DOWNLOAD = 16 * 1024 * 1024
# Files listed as resources per session, breadth first: a listing, not an inventory.
MAX_RESOURCES = 200
# Seconds between progress notifications while a cell runs without printing.
HEARTBEAT = 2.0
FILE_URI = "sbx://sessions/{session_id}/files/{path}"

INSTRUCTIONS = """\
Run code in sandboxed, stateful Jupyter kernels (no network; memory, CPU, disk limits).
Call create_session once, then run_code as often as needed: variables, imports and files
persist between calls in the same session. Files live in the session's workspace (the
kernel's working directory). To try several paths from one state, call snapshot, then fork
it once per path: each fork is a new session holding that state and files, and the original
is untouched. For another kernel over the same files (another language, or variables kept
apart), call create_context and pass its id to run_code as context. Delete the session when
done; it also ends on its TTL."""

SessionId = Annotated[str, Field(description="id returned by create_session")]
WorkspacePath = Annotated[str, Field(description="path in the session's workspace, e.g. data.csv")]
ContextId = Annotated[str, Field(description="id returned by create_context")]


def _tool(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Report gateway errors to the model as tool errors: the code and what to do."""

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except GatewayError as e:
            raise ToolError(f"{e.code}: {e.message}") from e

    call.is_tool = True  # type: ignore[attr-defined]
    return call


class ApprovalAnswer(BaseModel):
    """What the person at an MCP client is asked about a held execute."""

    approve: bool = Field(description="run this code (false: deny it)")
    reason: str = Field(default="", description="why; recorded with the decision")


class SandboxTools:
    """The tools, over the caller's SDK client; a gateway error becomes a tool error.

    With an ``approver`` (a client holding an approver token of the person at
    the MCP client, never the agent's), a held execute is put to that person
    by MCP elicitation where the client supports it.
    """

    def __init__(self, clients: GatewayClients, approver: AsyncClient | None = None) -> None:
        self.clients = clients
        self.approver = approver

    async def _ask(self, ctx: Context, approval: Approval, code: str) -> None:
        """Ask the person to decide ``approval``; a declined or cancelled ask leaves it pending."""
        assert self.approver is not None
        reasons = "; ".join(approval.reasons) or "the session's policy holds it"
        question = f"Run this code? Held because: {reasons}\n\n{code}"
        answer = await ctx.elicit(question, ApprovalAnswer)
        if answer.action != "accept":
            return  # for another approver, or the approval timeout
        decide = self.approver.approve if answer.data.approve else self.approver.deny
        await decide(approval.id, answer.data.reason or "decided in the MCP client")

    async def _session(self, session_id: str) -> AsyncSession:
        # No request: an unknown id fails on the tool's own call, with session_not_found.
        return (await self.clients.current()).session(session_id)

    @_tool
    async def create_session(
        self,
        kernel: Annotated[str | None, Field(description="kernel name; default python3")] = None,
        memory: Annotated[str | None, Field(description="memory limit, e.g. 1g")] = None,
        ttl: Annotated[float | None, Field(description="lifetime in seconds")] = None,
        idle_timeout: Annotated[
            float | None, Field(description="seconds without activity before it ends")
        ] = None,
        env: Annotated[dict[str, str] | None, Field(description="environment variables")] = None,
        secrets: Annotated[
            list[str] | None,
            Field(description="names of sealed secrets to give the kernel as env variables"),
        ] = None,
        metadata: Annotated[
            dict[str, str] | None, Field(description="labels, e.g. which agent owns it")
        ] = None,
        allow_hosts: Annotated[
            list[str] | None,
            Field(
                description="hosts the code may reach, e.g. pypi.org; none by default (no "
                "network at all; [] gives a network with nothing allowed yet, for update_network)"
            ),
        ] = None,
        volumes: Annotated[
            list[dict[str, Any]] | None,
            Field(
                description='named volumes to mount under the workspace, e.g. [{"name": '
                '"datasets", "path": "data", "read_only": true}] (create_volume makes one)'
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Start a sandboxed kernel session and return its id; state persists across run_code."""
        options = {
            "kernel": kernel,
            "memory": memory,
            "ttl": ttl,
            "idle_timeout": idle_timeout,
            "network": {"allow": allow_hosts} if allow_hosts is not None else None,
            "secrets": secrets,
            "volumes": volumes,
        }
        client = await self.clients.current()
        session = await client.create_session(
            keep=True,
            env=env,
            metadata={"client": "mcp", **(metadata or {})},
            **{k: v for k, v in options.items() if v},
        )
        return {**_session_summary(session.info), "limits": session.info.limits}

    @_tool
    async def list_sessions(self) -> dict[str, Any]:
        """List the live sessions this caller may use (its tenant's), with state and expiry."""
        sessions = await (await self.clients.current()).list_sessions()
        return {"sessions": [_session_summary(info) for info in sessions]}

    @_tool
    async def update_network(
        self,
        session_id: SessionId,
        allow_hosts: Annotated[
            list[str],
            Field(description="hosts, *.domain, IPs or CIDRs the code may reach, or public"),
        ],
        deny_hosts: Annotated[
            list[str] | None, Field(description="exceptions to allow_hosts")
        ] = None,
    ) -> dict[str, Any]:
        """Replace a running session's network lists; its next connection obeys them."""
        session = await self._session(session_id)
        info = await session.update_network(allow_hosts, deny=deny_hosts or ())
        return {**_session_summary(info), "network": info.network}

    @_tool
    async def interrupt(self, session_id: SessionId) -> dict[str, Any]:
        """Stop the cell running in the session (its run_code returns as interrupted)."""
        return _session_summary(await (await self._session(session_id)).interrupt())

    @_tool
    async def restart(self, session_id: SessionId) -> dict[str, Any]:
        """Start the session's kernel afresh: variables and imports are lost, files stay."""
        return _session_summary(await (await self._session(session_id)).restart())

    @_tool
    async def run_code(
        self,
        session_id: SessionId,
        code: Annotated[str, Field(description="source code to execute in the kernel")],
        timeout: Annotated[float | None, Field(description="seconds before it is stopped")] = None,
        context: Annotated[
            str | None,
            Field(description="a code context's id (create_context); default: the session's own"),
        ] = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Execute code in the session's kernel; returns stdout/stderr, results, images, errors.

        Code the session's policy holds waits for a person's approval: the wait
        is reported as progress, then the code runs, or the tool fails as denied.
        """
        session = await self._session(session_id)
        held: list[Approval] = []
        progress = _Progress(ctx)

        async def pending(approval: Approval) -> None:
            held.append(approval)
            reasons = "; ".join(approval.reasons)
            await progress(f"pending_approval {approval.id}: {reasons}; waiting for an approver")
            if ctx is not None and self.approver is not None and _elicits(ctx):
                await self._ask(ctx, approval, code)

        beat = asyncio.ensure_future(progress.heartbeat())
        try:
            execution = await session.run(
                code,
                timeout=timeout,
                context=context,
                on_pending=pending,
                on_stdout=progress,
                on_stderr=progress,
            )
        finally:
            await end_task(beat)
        summary: dict[str, Any] = {
            "status": execution.status,
            "execution_count": execution.execution_count,
            "error": None if execution.error is None else str(execution.error),
            "artifacts": [a.path for a in execution.artifacts],
        }
        if held:  # it ran once approved
            summary["approval"] = {"id": held[0].id, "reasons": held[0].reasons}
        if context is not None:  # its ``restarted`` says why the context's variables are gone
            summary["context"] = execution.raw.get("context")
        return CallToolResult(content=execution_content(execution), structured_content=summary)

    @_tool
    async def upload_file(
        self,
        session_id: SessionId,
        path: WorkspacePath,
        content: Annotated[str, Field(description="the file's content")],
        encoding: Annotated[
            Literal["text", "base64"], Field(description="'base64' for binary content")
        ] = "text",
    ) -> dict[str, Any]:
        """Write a file into the session's workspace (parent directories are created)."""
        data = base64.b64decode(content) if encoding == "base64" else content.encode()
        session = await self._session(session_id)
        info = await session.files.write(path, data)
        return {"path": info.path, "size": info.size}

    @_tool
    async def download_file(self, session_id: SessionId, path: WorkspacePath) -> list[ContentBlock]:
        """Read a workspace file: images come back as images, text as text, else base64."""
        session = await self._session(session_id)
        try:
            data = await session.files.read(path, max_bytes=MAX_DOWNLOAD)
        except FileTooLarge as e:
            raise ToolError(
                f"{e.message} for tool results; summarise it with run_code or fetch it with "
                "the files API"
            ) from e
        return [file_content(session_id, path, data)]

    @_tool
    async def list_files(
        self,
        session_id: SessionId,
        path: Annotated[str, Field(description="directory; empty for the top")] = "",
    ) -> dict[str, Any]:
        """List a directory of the session's workspace."""
        session = await self._session(session_id)
        entries = await session.files.list(path)
        return {
            "path": path,
            "entries": [{"path": e.path, "type": e.type, "size": e.size} for e in entries],
        }

    @_tool
    async def export_notebook(self, session_id: SessionId) -> EmbeddedResource:
        """The session's history as a Jupyter notebook (.ipynb JSON), outputs included."""
        session = await self._session(session_id)
        notebook = await session.export()
        return EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri=f"sbx://sessions/{session_id}/notebook.ipynb",
                mime_type="application/x-ipynb+json",
                text=json.dumps(notebook, indent=1),
            ),
        )

    @_tool
    async def snapshot(
        self,
        session_id: SessionId,
        name: Annotated[str | None, Field(description="a name to know it by")] = None,
    ) -> dict[str, Any]:
        """Keep the session's variables, imports and files as a snapshot to fork from."""
        snap = await (await self._session(session_id)).snapshot(name)
        return {
            "snapshot_id": snap.id,
            "session_id": snap.session_id,
            "name": snap.name,
            "strategy": snap.strategy,
            "lost": [lost["name"] for lost in snap.lost],
            "size_bytes": snap.size_bytes,
        }

    @_tool
    async def fork(
        self, snapshot_id: Annotated[str, Field(description="id returned by snapshot")]
    ) -> dict[str, Any]:
        """Start a new session holding a snapshot's state and files; use it like any session."""
        snap = await (await self.clients.current()).snapshot(snapshot_id)
        session = await snap.fork(keep=True, metadata={"client": "mcp"})
        return {"session_id": session.id, "forked_from": snapshot_id, "state": session.info.state}

    @_tool
    async def list_contexts(self, session_id: SessionId) -> dict[str, Any]:
        """List the session's code contexts: its own kernel ('default') first, then each made."""
        found = await (await self._session(session_id)).contexts()
        return {"contexts": [_context_summary(c) for c in found]}

    @_tool
    async def create_context(
        self,
        session_id: SessionId,
        kernel: Annotated[
            str | None, Field(description="a kernel the session's image holds, e.g. python3")
        ] = None,
        language: Annotated[
            str | None, Field(description="or a language of one, e.g. python (not both)")
        ] = None,
        cwd: Annotated[
            str | None, Field(description="its working directory under the workspace")
        ] = None,
    ) -> dict[str, Any]:
        """Start another kernel in the session's sandbox: the same files, variables of its own;
        pass its context_id to run_code. Neither kernel nor language: one like the session's."""
        session = await self._session(session_id)
        made = await session.create_context(kernel=kernel, language=language, cwd=cwd)
        return _context_summary(made)

    @_tool
    async def restart_context(self, session_id: SessionId, context_id: ContextId) -> dict[str, Any]:
        """Give a code context a fresh kernel: its variables and imports are lost, files stay."""
        return _context_summary(await (await self._session(session_id)).restart_context(context_id))

    @_tool
    async def remove_context(self, session_id: SessionId, context_id: ContextId) -> str:
        """Stop a code context's kernel; what it ran stays in the session's history."""
        await (await self._session(session_id)).remove_context(context_id)
        return f"removed context {context_id} of session {session_id}"

    @_tool
    async def create_volume(
        self,
        name: Annotated[str, Field(description="1 to 63 letters, digits, _ . -")],
        size: Annotated[str | None, Field(description="its cap, e.g. 2g")] = None,
        files: Annotated[
            dict[str, str] | None,
            Field(description="text files to write into it first, by path, e.g. {'in.csv': ...}"),
        ] = None,
    ) -> dict[str, Any]:
        """Create a named volume: files that outlive sessions; mount it with create_session."""
        client = await self.clients.current()
        made = await client.create_volume(name, size)
        for path, content in (files or {}).items():
            await client.volume_files(name).write(path, content.encode())
        return made

    @_tool
    async def list_volumes(self) -> dict[str, Any]:
        """List this caller's tenant's named volumes."""
        return {"volumes": await (await self.clients.current()).volumes()}

    @_tool
    async def delete_volume(self, name: Annotated[str, Field(description="volume name")]) -> str:
        """Delete a named volume and its files (refused while a session mounts it)."""
        await (await self.clients.current()).delete_volume(name)
        return f"deleted volume {name}"

    @_tool
    async def delete_session(self, session_id: SessionId) -> str:
        """End the session and remove its sandbox and files."""
        session = await self._session(session_id)
        await session.delete()
        return f"deleted session {session_id}"


def _session_summary(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.id,
        "kernel": info.kernel,
        "state": info.state,
        "expires_at": info.expires_at,
        "metadata": info.metadata,
    }


def _context_summary(context: CodeContext) -> dict[str, Any]:
    return {
        "context_id": context.id,
        "kernel": context.kernel,
        "language": context.language,
        "cwd": context.cwd,
        "state": context.state,
        "stopped": context.raw.get("stopped"),
    }


class _Progress:
    """Progress notifications for one run: each output as it comes, and a heartbeat.

    The value is the seconds since the run began, strictly increasing as MCP asks.
    """

    def __init__(self, ctx: Context | None) -> None:
        self.ctx = ctx
        self.started = anyio.current_time()
        self.last = -1.0

    async def __call__(self, message: str) -> None:
        if self.ctx is None:
            return
        value = max(round(anyio.current_time() - self.started, 3), self.last + 0.001)
        self.last = value
        await self.ctx.report_progress(value, message=message.rstrip("\n")[-500:])

    async def heartbeat(self) -> None:
        while True:
            await anyio.sleep(HEARTBEAT)
            await self(f"running for {anyio.current_time() - self.started:.0f} s")


def execution_content(execution: Execution) -> list[ContentBlock]:
    """An execution as MCP content: streams and text results as text, images as images."""
    blocks: list[ContentBlock] = []
    for output in execution.outputs:
        kind = output.get("output_type")
        if kind == "stream":
            blocks.append(TextContent(type="text", text=f"[{output['name']}]\n{output['text']}"))
        elif kind in ("display_data", "execute_result"):
            blocks.extend(_result_content(Result.from_output(output)))
        elif kind == "error":
            text = ExecutionError.from_json(output).text
            blocks.append(TextContent(type="text", text=f"[error]\n{text}"))
    if execution.status not in ("ok", "error"):
        reason = f": {execution.error}" if execution.error else ""
        blocks.append(TextContent(type="text", text=f"[{execution.status}{reason}]"))
    if execution.artifacts:
        files = ", ".join(a.path for a in execution.artifacts)
        blocks.append(TextContent(type="text", text=f"[files written: {files}]"))
    return blocks or [TextContent(type="text", text="[no output]")]


def _result_content(result: Result) -> list[ContentBlock]:
    """A rich output's images if it has any, else its most readable text form."""
    images = [
        ImageContent(type="image", data=data.strip(), mime_type=mime)
        for mime in IMAGE_TYPES
        if (data := result.get(mime)) is not None
    ]
    if images:
        return images
    for text in (result.text, result.markdown, result.html):
        if text is not None:
            return [TextContent(type="text", text=text)]
    if "application/json" in result.data:
        return [TextContent(type="text", text=json.dumps(result.json))]
    return []


def file_content(session_id: str, path: str, data: bytes) -> ContentBlock:
    """A downloaded file as the content type that suits it."""
    for mime, magic in (
        ("image/png", b"\x89PNG"),
        ("image/jpeg", b"\xff\xd8\xff"),
        ("image/gif", b"GIF8"),
    ):
        if data.startswith(magic):
            return ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)
    try:
        return TextContent(type="text", text=data.decode("utf-8"))
    except UnicodeDecodeError:
        return EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(
                uri=f"sbx://sessions/{session_id}/files/{path.strip('/')}",
                mime_type="application/octet-stream",
                blob=base64.b64encode(data).decode(),
            ),
        )


class GatewayMCPServer(MCPServer):
    """The MCP server, with each of the caller's sessions' files listed and read as resources.

    A file is ``sbx://sessions/{session_id}/files/{path}``; the list is the
    caller's live sessions' files, breadth first, up to ``MAX_RESOURCES`` each.
    """

    def __init__(self, clients: GatewayClients, **options: Any) -> None:
        super().__init__("sandbox-gateway", **options)
        self.clients = clients

    async def list_resources(self) -> list[MCPResource]:
        client = await self.clients.current()
        found = await super().list_resources()
        for info in await client.list_sessions():
            found += await _file_resources(client.session(info.id))
        return found

    async def read_resource(
        self, uri: Any, context: Context | None = None
    ) -> list[ReadResourceContents]:
        prefix, _, rest = str(uri).partition("sbx://sessions/")
        session_id, _, path = rest.partition("/files/")
        if prefix or not session_id or not path:
            raise ResourceError(f"unknown resource {uri}: files are {FILE_URI}")
        session = (await self.clients.current()).session(session_id)
        try:
            data = await session.files.read(path, max_bytes=MAX_DOWNLOAD)
        except GatewayError as e:
            raise ResourceError(f"{e.code}: {e.message}") from e
        try:
            return [ReadResourceContents(content=data.decode("utf-8"), mime_type="text/plain")]
        except UnicodeDecodeError:
            return [ReadResourceContents(content=data, mime_type="application/octet-stream")]


async def _file_resources(session: AsyncSession) -> list[MCPResource]:
    """A session's files as resources, breadth first, at most ``MAX_RESOURCES``."""
    found: list[MCPResource] = []
    directories = [""]
    while directories and len(found) < MAX_RESOURCES:
        for entry in await session.files.list(directories.pop(0)):
            if entry.type == "directory":
                directories.append(entry.path)
            elif entry.type == "file" and len(found) < MAX_RESOURCES:
                uri = FILE_URI.format(session_id=session.id, path=entry.path)
                found.append(
                    MCPResource(uri=uri, name=entry.path, size=entry.size, description=session.id)
                )
    return found


def _elicits(ctx: Context) -> bool:
    """Whether the MCP client can be asked a question now: it declared elicitation, and
    the connection carries server-initiated requests (the handshake-era protocol; the
    2026-07-28 one asks by returning InputRequired, which a held execute does not use)."""
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return False
    return ctx.session.can_send_request


def build_server(
    clients: GatewayClients, *, http: bool = False, approver: AsyncClient | None = None
) -> MCPServer:
    """An MCP server whose tools act on the gateway as each caller's client.

    Over ``http`` a caller must send a gateway token (401 without one the gateway accepts).
    """
    auth = None
    if http:  # the gateway issues the tokens; this server only checks them with it
        auth = AuthSettings(
            issuer_url=clients.url, resource_server_url=None, validate_token_resource=False
        )
    server = GatewayMCPServer(
        clients,
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
        token_verifier=clients if http else None,
        auth=auth,
    )
    tools = SandboxTools(clients, approver)
    for name, member in vars(SandboxTools).items():
        if getattr(member, "is_tool", False):
            server.add_tool(getattr(tools, name), name=name)
    return server


def serve(
    settings: ClientSettings,
    *,
    http: bool,
    host: str,
    port: int,
    path: str,
    approver_token: str | None = None,
) -> None:
    """Run the MCP server until stdin closes (stdio) or it is interrupted (HTTP).

    Over HTTP the configured token is not used: every caller sends its own.
    ``approver_token``: the person's own approver token, to decide held
    executes by elicitation (stdio only: over HTTP callers are many people).
    """

    async def main() -> None:
        if http:
            clients = GatewayClients(settings.url, None)
            try:
                await _serve_http(build_server(clients, http=True), host, port, path)
            finally:
                await clients.aclose()
            return
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(AsyncClient(settings.url, settings.token))
            approver = None
            if approver_token:
                approver = await stack.enter_async_context(
                    AsyncClient(settings.url, approver_token)
                )
            server = build_server(GatewayClients(settings.url, client), approver=approver)
            await server.run_stdio_async()

    anyio.run(main)


async def _serve_http(server: MCPServer, host: str, port: int, path: str) -> None:
    import uvicorn

    # Bind first so port 0 works and the address can be printed before serving.
    sock = socket.create_server((host, port))
    bound = sock.getsockname()[1]
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"sbx mcp: streamable HTTP on http://{host}:{bound}{path}", file=sys.stderr, flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])
