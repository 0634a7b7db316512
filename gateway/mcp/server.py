"""``sbx mcp``: the gateway as a Model Context Protocol tool server.

Built with the official MCP SDK's ``MCPServer`` over the async SDK client, so
any MCP-speaking agent gets sandboxed, stateful code execution: stdio by
default (the agent starts ``sbx mcp``), streamable HTTP with ``--http``.
Results come back the way models read them best: text as text content,
images as image content, and a structured summary alongside.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)
from pydantic import Field

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
from ..client.models import IMAGE_TYPES
from ..client.settings import ClientSettings

log = logging.getLogger(__name__)

# Larger downloads belong on the files API, not in a model's context.
MAX_DOWNLOAD = 16 * 1024 * 1024

INSTRUCTIONS = """\
Run code in sandboxed, stateful Jupyter kernels (no network; memory, CPU, disk limits).
Call create_session once, then run_code as often as needed: variables, imports and files
persist between calls in the same session. Files live in the session's workspace (the
kernel's working directory). To try several paths from one state, call snapshot, then fork
it once per path: each fork is a new session holding that state and files, and the original
is untouched. Delete the session when done; it also ends on its TTL."""

SessionId = Annotated[str, Field(description="id returned by create_session")]
WorkspacePath = Annotated[str, Field(description="path in the session's workspace, e.g. data.csv")]


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


class SandboxTools:
    """The tools, over one SDK client; a gateway error becomes a tool error the model can read."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    def _session(self, session_id: str) -> AsyncSession:
        # No request: an unknown id fails on the tool's own call, with session_not_found.
        return self.client.session(session_id)

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
            Field(description="hosts the code may reach, e.g. pypi.org; none by default"),
        ] = None,
    ) -> dict[str, Any]:
        """Start a sandboxed kernel session and return its id; state persists across run_code."""
        options = {
            "kernel": kernel,
            "memory": memory,
            "ttl": ttl,
            "idle_timeout": idle_timeout,
            "network": {"allow": allow_hosts} if allow_hosts else None,
            "secrets": secrets,
        }
        session = await self.client.create_session(
            keep=True,
            env=env,
            metadata={"client": "mcp", **(metadata or {})},
            **{k: v for k, v in options.items() if v},
        )
        info = session.info
        return {
            "session_id": info.id,
            "kernel": info.kernel,
            "state": info.state,
            "expires_at": info.expires_at,
            "limits": info.limits,
        }

    @_tool
    async def run_code(
        self,
        session_id: SessionId,
        code: Annotated[str, Field(description="source code to execute in the kernel")],
        timeout: Annotated[float | None, Field(description="seconds before it is stopped")] = None,
        ctx: Context | None = None,
    ) -> CallToolResult:
        """Execute code in the session's kernel; returns stdout/stderr, results, images, errors.

        Code the session's policy holds waits for a person's approval: the wait
        is reported as progress, then the code runs, or the tool fails as denied.
        """
        session = self._session(session_id)
        held: list[Approval] = []

        async def pending(approval: Approval) -> None:
            held.append(approval)
            if ctx is not None:
                reasons = "; ".join(approval.reasons)
                message = f"pending_approval {approval.id}: {reasons}; waiting for an approver"
                await ctx.report_progress(0, message=message)

        execution = await session.run(code, timeout=timeout, on_pending=pending)
        summary: dict[str, Any] = {
            "status": execution.status,
            "execution_count": execution.execution_count,
            "error": None if execution.error is None else str(execution.error),
            "artifacts": [a.path for a in execution.artifacts],
        }
        if held:  # it ran once approved
            summary["approval"] = {"id": held[0].id, "reasons": held[0].reasons}
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
        session = self._session(session_id)
        info = await session.files.write(path, data)
        return {"path": info.path, "size": info.size}

    @_tool
    async def download_file(self, session_id: SessionId, path: WorkspacePath) -> list[ContentBlock]:
        """Read a workspace file: images come back as images, text as text, else base64."""
        session = self._session(session_id)
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
        session = self._session(session_id)
        entries = await session.files.list(path)
        return {
            "path": path,
            "entries": [{"path": e.path, "type": e.type, "size": e.size} for e in entries],
        }

    @_tool
    async def export_notebook(self, session_id: SessionId) -> EmbeddedResource:
        """The session's history as a Jupyter notebook (.ipynb JSON), outputs included."""
        session = self._session(session_id)
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
        snap = await self._session(session_id).snapshot(name)
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
        snap = await self.client.snapshot(snapshot_id)
        session = await snap.fork(keep=True, metadata={"client": "mcp"})
        return {"session_id": session.id, "forked_from": snapshot_id, "state": session.info.state}

    @_tool
    async def delete_session(self, session_id: SessionId) -> str:
        """End the session and remove its sandbox and files."""
        session = self._session(session_id)
        await session.delete()
        return f"deleted session {session_id}"


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


def build_server(client: AsyncClient) -> MCPServer:
    """An MCP server whose tools act on the gateway through ``client``."""
    server = MCPServer(
        "sandbox-gateway", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING"
    )
    tools = SandboxTools(client)
    for name, member in vars(SandboxTools).items():
        if getattr(member, "is_tool", False):
            server.add_tool(getattr(tools, name), name=name)
    return server


def serve(settings: ClientSettings, *, http: bool, host: str, port: int, path: str) -> None:
    """Run the MCP server until stdin closes (stdio) or it is interrupted (HTTP)."""

    async def main() -> None:
        async with AsyncClient(settings.url, settings.token) as client:
            server = build_server(client)
            if http:
                await _serve_http(server, host, port, path)
            else:
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
