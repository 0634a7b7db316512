"""The asyncio half of the SDK: ``AsyncClient``, ``AsyncSession`` and ``AsyncFiles``.

The same methods as the blocking half, awaited; only the I/O differs. Stream
callbacks may be plain or coroutine functions. ``create``/``connect`` return
an awaitable that is also an async context manager::

    async with AsyncSession.create(url) as session:
        execution = await session.run("1 + 1")
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine, Generator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO, Generic, TypeVar, Unpack

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from ..errors import FileNotFound, GatewayError, NotAFile
from .base import (
    CHUNK,
    BaseClient,
    BaseCommands,
    BaseFiles,
    BaseSession,
    BaseSnapshot,
    Call,
    CommandOptions,
    Contextual,
    Progress,
    ReplayProgress,
    SessionOptions,
    VolumeOwner,
    context_id,
    replay_event,
)
from .models import (
    Approval,
    CodeContext,
    CommandResult,
    Execution,
    FileInfo,
    Port,
    PreviewLink,
    RecordedExecution,
    ReplayReport,
    SessionInfo,
    SessionMetrics,
)
from .stream import Run, RunCallbacks
from .tools import ToolReply

T = TypeVar("T")
S = TypeVar("S", bound="AsyncSession")


class Opening(Generic[S]):
    """A session being made: ``await`` it, or ``async with`` it to delete it at the end."""

    def __init__(self, coro: Coroutine[Any, Any, S]) -> None:
        self._coro = coro
        self._session: S | None = None

    def __await__(self) -> Generator[Any, None, S]:
        return self._coro.__await__()

    async def __aenter__(self) -> S:
        self._session = await self._coro
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.__aexit__(*exc)


class AsyncClient(BaseClient):
    """A connection to one gateway. ``url``/``token`` default to ``SBX_URL``/``SBX_TOKEN``."""

    http_class = httpx.AsyncClient

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def send(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
        """Send a call, retrying as the policy allows; raise the gateway's error as an exception."""
        attempt = 0
        while True:
            try:
                request = self._http.build_request(**call.request_args())
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as e:
                await asyncio.sleep(self._http_retry(call, e, attempt))
                attempt += 1
                continue
            if response.is_error:
                body = await response.aread()
                await response.aclose()
                raise self._error(response, body)
            return response

    async def call(self, call: Call[T]) -> T:
        return call.parse(await self.send(call))

    async def open_stream(self, url: str) -> ClientConnection:
        """Open a WebSocket to the gateway, retrying failures to connect."""
        attempt = 0
        while True:
            try:
                return await connect(url, **self._ws_options())
            except Exception as e:
                await asyncio.sleep(self._stream_retry(url, e, attempt))
                attempt += 1

    def create_session(
        self, *, keep: bool = False, **options: Unpack[SessionOptions]
    ) -> Opening[AsyncSession]:
        """Start a session (its kernel is ready on return); see ``SessionOptions``."""
        return Opening(self._created(options, keep))

    def connect(self, session_id: str, *, keep: bool = True) -> Opening[AsyncSession]:
        """Attach to an existing session (raises ``SessionNotFound`` if there is none)."""
        return Opening(self._session(self._describe_call(session_id), keep))

    def session(self, session_id: str, *, keep: bool = True) -> AsyncSession:
        """A session by id without a request; see ``BaseSession.handle``."""
        return AsyncSession.handle(self, session_id, keep=keep)

    async def _session(self, call: Call[SessionInfo], keep: bool) -> AsyncSession:
        return AsyncSession(self, await self.call(call), keep=keep)

    async def _created(self, options: Mapping[str, Any], keep: bool) -> AsyncSession:
        return (await self._session(self._create_call(options), keep))._with_tools(options)

    async def list_sessions(
        self, *, state: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> list[SessionInfo]:
        found, page = [], None
        while True:  # every page: a deployment may hold more than one answers with
            sessions, page = await self.call(self._list_call(state, metadata, page))
            found += sessions
            if page is None:
                return found

    async def replay(
        self,
        notebook: dict[str, Any] | str | bytes | Path,
        *,
        image_tolerance: float | None = None,
        inputs: Mapping[str, bytes] | None = None,
        on_cell: ReplayProgress | None = None,
    ) -> ReplayReport:
        """Re-run a notebook in a fresh session and report, cell by cell, if it reproduced.

        ``inputs`` (workspace path -> content) are uploaded first, checked against the
        hashes the export recorded (``metadata.sbx.inputs``). ``on_cell(cell, done,
        total)``, plain or async, hears of each code cell as the gateway decides it.
        """
        if isinstance(notebook, Path):
            notebook = await asyncio.to_thread(notebook.read_bytes)
        if on_cell is None:
            return await self.call(self._replay_call(notebook, image_tolerance, inputs))
        call = self._replay_call(notebook, image_tolerance, inputs, True)
        response = await self.send(call, stream=True)
        try:
            async for line in response.aiter_lines():
                event = replay_event(line)
                if isinstance(event, ReplayReport):
                    return event
                if event is not None and inspect.isawaitable(done := on_cell(*event)):
                    await done
        except httpx.TransportError as e:
            raise self.unreachable(e) from e
        finally:
            await response.aclose()
        raise self.unreachable(httpx.RemoteProtocolError("the replay ended without its report"))

    async def snapshot(self, snapshot_id: str) -> AsyncSnapshot:
        """A snapshot by id (raises ``NotFound`` if there is none, or it is another tenant's)."""
        return await self.call(self._snapshot_call(snapshot_id))

    async def build_template(
        self,
        name: str,
        dockerfile: str,
        context: bytes | None = None,
        *,
        kernel: str | None = None,
        tags: list[str] | None = None,
    ) -> dict[str, Any]:
        """Start building a new version of a template (``context``: a tar); its record.

        ``tags``: the version's once ready (none: it takes ``default``, the bare name's).
        """
        return await self.call(self._build_template_call(name, dockerfile, context, kernel, tags))

    async def tag_template(self, name: str, version: int | str, tags: list[str]) -> dict[str, Any]:
        """Move ``tags`` to a ready version (a number, or a tag it has): ``name:TAG`` names it."""
        body = {"version": version, "tags": list(tags)}
        return await self.call(self._template_tags_call(name, "POST", body))

    async def template_tags(self, name: str) -> list[dict[str, Any]]:
        """A template's tags, each with its version, build id and when it was moved there."""
        return await self.call(self._template_tags_call(name))

    async def untag_template(self, name: str, tags: list[str]) -> None:
        """Remove tags from a template (each must be there); its versions stay."""
        await self.call(self._template_tags_call(name, "DELETE", {"tags": list(tags)}))

    async def templates(self) -> list[dict[str, Any]]:
        """The tenant's templates' builds, newest first per name."""
        return await self.call(self._templates_call())

    async def template(self, name: str) -> list[dict[str, Any]]:
        """A template's builds, newest first, each with its status, log and error."""
        return await self.call(self._template_call(name))

    async def delete_template(self, name: str) -> None:
        """Delete every version (images go once no session uses them)."""
        await self.call(self._template_call(name, "DELETE"))

    async def set_template_pool(self, name: str, size: int) -> dict[str, Any]:
        """Keep ``size`` sandboxes of a template ready for your creates (0: none); the pool."""
        return await self.call(self._template_pool_call(name, size))

    async def template_pool(self, name: str) -> dict[str, Any]:
        """A template's pool: size, the version kept, ready, starting, served, waiting."""
        return await self.call(self._template_pool_call(name))

    async def health(self) -> dict[str, Any]:
        return await self.call(self._health_call())

    async def create_volume(self, name: str, size: str | int | None = None) -> dict[str, Any]:
        """A named volume of the tenant's: files that outlive sessions, ``size`` its cap."""
        return await self.call(self._create_volume_call(name, size))

    async def volumes(self) -> list[dict[str, Any]]:
        return await self.call(self._volumes_call())

    async def volume(self, name: str) -> dict[str, Any]:
        """A volume with its bytes in use and the sessions that mount it."""
        return await self.call(self._volume_call(name))

    async def delete_volume(self, name: str) -> None:
        """Delete a volume and its files (refused while a session mounts it)."""
        await self.call(self._volume_call(name, "DELETE"))

    def volume_files(self, name: str) -> AsyncFiles:
        """A volume's files, no session needed: ``write`` and ``upload`` (streamed), ``read``,
        ``download``, ``list``, ``remove``, ``exists``, as a session's ``files``."""
        return AsyncFiles(VolumeOwner(self, name))  # type: ignore[arg-type]

    async def verify_audit(
        self, *, tenant: str | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Walk the records' hash chains (admin tokens): a session's, a tenant's, or all."""
        return await self.call(self._verify_audit_call(tenant, session))

    async def check_notebook(self, notebook: str | bytes) -> dict[str, Any]:
        """Whether an exported notebook's chain head matches the gateway's records."""
        return await self.call(self._check_notebook_call(notebook))

    async def approvals(self, state: str | None = "pending") -> list[Approval]:
        """Held executes this token's tenant may see (an approver's view)."""
        return await self.call(self._approvals_call(state))

    async def approval(self, approval_id: str) -> Approval:
        return await self.call(self._approval_call(approval_id))

    async def approve(self, approval_id: str, reason: str | None = None) -> Approval:
        """Let a held execute run (approver tokens; never the one that asked)."""
        return await self.call(self._decide_call(approval_id, "approve", reason))

    async def deny(self, approval_id: str, reason: str | None = None) -> Approval:
        return await self.call(self._decide_call(approval_id, "deny", reason))

    async def wait_for_approvals(
        self, interval: float = 1.0, timeout: float | None = None
    ) -> list[Approval]:
        """Poll until some execute is pending (or ``timeout`` passes); those pending."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (pending := await self.approvals("pending")):
            if deadline is not None and time.monotonic() >= deadline:
                break
            await asyncio.sleep(interval)
        return pending


class AsyncFiles(BaseFiles):
    """The session's workspace: ``await session.files.write/read/list/remove/...``."""

    session: AsyncSession

    async def write(
        self, path: str, data: bytes | str | IO[bytes], *, on_progress: Progress | None = None
    ) -> FileInfo:
        """Write bytes, text or a binary file object to ``path`` (directories are made)."""
        return await self.session.client.call(self._write_call(path, data, on_progress))

    async def upload(
        self, source: str | Path, path: str | None = None, *, on_progress: Progress | None = None
    ) -> FileInfo:
        """Stream a local file into the workspace (default: its own name, at the top)."""
        file = await asyncio.to_thread(open, source, "rb")
        try:
            return await self.write(path or Path(source).name, file, on_progress=on_progress)
        finally:
            file.close()

    async def read(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """A workspace file's content; ``FileTooLarge`` instead if it is over ``max_bytes``."""
        client = self.session.client
        if max_bytes is None:
            return await client.call(self._read_call(path))
        response = await client.send(self._read_call(path), stream=True)
        try:
            self._check_size(path, response, max_bytes)
            return await response.aread()
        except httpx.TransportError as e:
            raise client.unreachable(e) from e
        finally:
            await response.aclose()

    async def download(
        self,
        path: str,
        dest: str | Path,
        *,
        on_progress: Progress | None = None,
        archive: str | None = None,
    ) -> Path:
        """Stream a workspace file to a local one, which appears only once complete.

        ``archive`` ("tar" or "zip") downloads the directory ``path`` as a
        ``.tar.gz`` or ``.zip`` instead.
        """
        dest, part = self._partial(dest)
        try:
            out = await asyncio.to_thread(open, part, "wb")
            with out:
                await self.copy_to(path, out, on_progress=on_progress, archive=archive)
            await asyncio.to_thread(os.replace, part, dest)
        finally:
            part.unlink(missing_ok=True)
        return dest

    async def copy_to(
        self,
        path: str,
        out: BinaryIO,
        *,
        on_progress: Progress | None = None,
        archive: str | None = None,
    ) -> int:
        """Stream a workspace file into ``out`` (a pipe, say) a chunk at a time; its size.

        Each write runs on a thread: ``out`` is a blocking file object."""
        client = self.session.client
        response = await client.send(self._read_call(path, archive), stream=True)
        try:
            total = int(response.headers.get("Content-Length", 0)) or None
            async for chunk in response.aiter_bytes(CHUNK):
                await asyncio.to_thread(out.write, chunk)
                if on_progress is not None:
                    on_progress(response.num_bytes_downloaded, total)
            return response.num_bytes_downloaded
        except httpx.TransportError as e:
            raise self._cut(path, response.num_bytes_downloaded, e) from e
        finally:
            await response.aclose()

    async def list(self, path: str = "") -> list[FileInfo]:
        return await self.session.client.call(self._list_call(path))

    async def rename(self, old: str, new: str) -> FileInfo:
        """Rename (move) a file or directory; the new name's parents are made.

        An existing file at ``new`` is replaced, as ``mv`` does.
        """
        return await self.session.client.call(self._rename_call(old, new))

    async def make_dir(self, path: str) -> bool:
        """Make a directory and its parents; False if it was there already (E2B's answer)."""
        return await self.session.client.call(self._make_dir_call(path))

    async def remove(self, path: str) -> None:
        """Delete a file or a whole directory."""
        await self.session.client.call(self._remove_call(path))

    async def exists(self, path: str) -> bool:
        """Whether ``path`` is in the workspace: a file, a directory, or anything else."""
        parent, clean = self._parent(path)
        try:
            return any(entry.path == clean for entry in await self.list(parent))
        except (FileNotFound, NotAFile):
            return False

    async def upload_dir(
        self, source: str | Path, path: str = "", *, on_progress: Progress | None = None
    ) -> list[FileInfo]:
        """Upload every file under a local directory to ``path`` (default: the top)."""
        return [
            await self.upload(local, remote, on_progress=on_progress)
            for local, remote in self._local_tree(source, path)
        ]

    async def download_dir(self, path: str, dest: str | Path) -> Path:
        """Download a workspace directory (as one archive) into the local directory ``dest``
        (made, with its parents, as needed)."""
        dest = Path(dest)
        # where the archive lands first
        await asyncio.to_thread(dest.parent.mkdir, parents=True, exist_ok=True)
        archive = await self.download(
            path, dest.with_name(f".{dest.name}.sbx.tar.gz"), archive="tar"
        )
        try:
            return await asyncio.to_thread(self._extract, archive, dest)
        finally:
            archive.unlink(missing_ok=True)

    async def _chunks(
        self, file: IO[bytes], size: int | None, on_progress: Progress | None
    ) -> AsyncIterator[bytes]:
        done = 0
        while chunk := await asyncio.to_thread(file.read, CHUNK):
            done += len(chunk)
            yield chunk
            if on_progress is not None:
                on_progress(done, size)


class AsyncCommands(BaseCommands):
    """Shell commands beside the kernel: ``await session.commands.run("ls -l")``."""

    session: AsyncSession

    async def run(self, command: str, **options: Unpack[CommandOptions]) -> CommandResult:
        """``Commands.run``, awaited: a shell command line's exit code, stdout and stderr."""
        return await self.session.client.call(self._run_call(command, options))


class AsyncSession(BaseSession[AsyncClient]):
    """One sandboxed kernel. ``async with AsyncSession.create() as s:`` deletes it at the end."""

    files_class = AsyncFiles
    files: AsyncFiles
    commands_class = AsyncCommands
    commands: AsyncCommands

    @classmethod
    def create(
        cls,
        url: str | None = None,
        token: str | None = None,
        *,
        keep: bool = False,
        **options: Unpack[SessionOptions],
    ) -> Opening[AsyncSession]:
        """Start a session on a client of its own, closed with the session."""
        client = AsyncClient(url, token)
        return Opening(_owning(client, client.create_session(keep=keep, **options)))

    @classmethod
    def connect(
        cls, session_id: str, url: str | None = None, token: str | None = None, *, keep: bool = True
    ) -> Opening[AsyncSession]:
        client = AsyncClient(url, token)
        return Opening(_owning(client, client.connect(session_id, keep=keep)))

    @classmethod
    async def list(
        cls,
        url: str | None = None,
        token: str | None = None,
        *,
        state: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[SessionInfo]:
        async with AsyncClient(url, token) as client:
            return await client.list_sessions(state=state, metadata=metadata)

    async def refresh(self) -> SessionInfo:
        return await self.client.call(self._refresh_call())

    async def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        description: str | None = None,
        env: Mapping[str, str] | None = None,
        context: Contextual = None,
        **callbacks: Unpack[RunCallbacks],
    ) -> Execution:
        """Execute code, streaming outputs to the callbacks; return the finished execution.

        ``env``: environment variables for this run only (Python kernels);
        ``context``: the code context to run in (``create_context``), else the session's kernel.
        A dropped connection is resumed where it left off. Leaving early (an
        exception in a callback, cancellation) interrupts the cell.
        """
        run = Run(code, timeout, description, env, context_id(context), self.tools, **callbacks)
        url = self._stream_url()
        while run.execution is None:
            async with await self.client.open_stream(url) as ws:
                try:
                    if request := run.take_request():
                        await ws.send(request)
                    while run.execution is None:
                        for returned in run.feed(await ws.recv()):
                            if inspect.isawaitable(returned):
                                returned = await returned
                            if isinstance(returned, ToolReply):
                                await ws.send(returned.text)
                except ConnectionClosed as e:
                    url = self._resume_url(run, e)
                except BaseException:
                    if stop := run.interrupt_request:
                        with contextlib.suppress(Exception):
                            await ws.send(stop)
                    raise
        return run.execution

    async def contexts(self) -> list[CodeContext]:
        """The session's code contexts, its own kernel (``default``) first."""
        return await self.client.call(self._contexts_call())

    async def create_context(
        self, *, kernel: str | None = None, language: str | None = None, cwd: str | None = None
    ) -> CodeContext:
        """Start another kernel in the sandbox (a kernel or language its image holds, working
        in ``cwd`` under /workspace): the same files, variables of its own."""
        return await self.client.call(self._create_context_call(kernel, language, cwd))

    async def restart_context(self, context: CodeContext | str) -> CodeContext:
        """Give a code context a fresh kernel: its variables go, the files stay."""
        return await self.client.call(self._context_call(context, "restart"))

    async def remove_context(self, context: CodeContext | str) -> None:
        """Stop a code context's kernel; its executions stay in the history."""
        await self.client.call(self._context_call(context, "delete"))

    # E2B's names for the code contexts' calls.
    async def create_code_context(
        self, cwd: str | None = None, language: str | None = None
    ) -> CodeContext:
        return await self.client.call(self._create_context_call(None, language, cwd))

    list_code_contexts = contexts
    restart_code_context = restart_context
    remove_code_context = remove_context

    async def interrupt(self) -> SessionInfo:
        return await self.client.call(self._action_call("interrupt"))

    async def restart(self) -> SessionInfo:
        """Replace the kernel with a fresh one (state is lost; files stay)."""
        return await self.client.call(self._action_call("restart"))

    async def pause(self, strategy: str | None = None) -> SessionInfo:
        """Freeze the sandbox, or save its state and free its memory (a strategy named)."""
        return await self.client.call(self._pause_call(strategy))

    async def resume(self) -> SessionInfo:
        """Thaw the sandbox, or start a kernel with the saved state (a run resumes too)."""
        return await self.client.call(self._action_call("resume"))

    async def snapshot(
        self, name: str | None = None, *, strategy: str | None = None
    ) -> AsyncSnapshot:
        """Keep the kernel's state and files as a snapshot to fork from; the session runs on."""
        return await self.client.call(self._take_snapshot_call(name, strategy))

    async def snapshots(self) -> list[AsyncSnapshot]:
        return await self.client.call(self._snapshots_call())

    async def set_timeout(
        self, timeout: float, *, idle_timeout: float | None = None
    ) -> SessionInfo:
        """End the session ``timeout`` seconds from now (by the gateway's clock), as E2B's
        ``set_timeout`` does."""
        return await self.client.call(self._update_call(None, idle_timeout, expires_in=timeout))

    async def set_ttl(
        self, ttl: float | None = None, *, idle_timeout: float | None = None
    ) -> SessionInfo:
        """Change the lifetime (seconds from creation, as the API counts) and/or idle timeout."""
        return await self.client.call(self._update_call(ttl, idle_timeout))

    async def update_network(
        self, allow: Sequence[str], *, deny: Sequence[str] = ()
    ) -> SessionInfo:
        """Replace the session's network allow and deny lists while it runs (``"public"``:
        every public host); the next connection obeys them, open ones they refuse are cut."""
        return await self.client.call(self._network_call(allow, deny))

    async def extend(self, seconds: float) -> SessionInfo:
        """Let the session live ``seconds`` from now (by the gateway's clock)."""
        return await self.set_timeout(seconds)

    # E2B's names, where the meaning is the same (docs/sdk.md has the table).
    async def run_code(
        self, code: str, *, envs: Mapping[str, str] | None = None, **options: Any
    ) -> Execution:
        """E2B's name for ``run``; ``envs`` is E2B's name for ``env``."""
        if envs is not None:
            options["env"] = envs
        return await self.run(code, **options)

    async def list_ports(self) -> list[Port]:
        """The ports something listens on in the sandbox, each with its preview URL."""
        return await self.client.call(self._ports_call())

    async def preview_link(self, port: int, expires_in: float = 3600) -> PreviewLink:
        """A signed link to ``port`` for a person in a browser, good for ``expires_in`` s."""
        return await self.client.call(self._preview_link_call(port, expires_in))

    async def get_metrics(self) -> SessionMetrics:
        """CPU, memory now and at peak, network and disk use (``GET .../metrics``)."""
        return await self.client.call(self._metrics_call())

    async def get_info(self) -> SessionInfo:
        """E2B's name for ``refresh``."""
        return await self.refresh()

    async def kill(self) -> None:
        """E2B's name for ``delete``."""
        await self.delete()

    async def history(self) -> list[RecordedExecution]:
        """Every recorded execution, oldest first, read a page at a time."""
        executions: list[RecordedExecution] = []
        after: int | None = 0
        while after is not None:
            page, after = await self.client.call(self._history_call(after))
            executions += page
        return executions

    async def export(
        self,
        path: str | Path | None = None,
        *,
        descriptions: bool = True,
        context: Contextual = None,
    ) -> dict[str, Any]:
        """The session as an nbformat v4 notebook; also written to ``path`` if given.

        A notebook holds one kernel's cells: the session's own, or ``context``'s.
        """
        notebook = await self.client.call(self._notebook_call(descriptions, context))
        return await asyncio.to_thread(self._write_notebook, notebook, path)

    async def delete(self) -> None:
        await self.client.call(self._delete_call())

    async def aclose(self) -> None:
        """Release the connection this session owns, if any; the session lives on."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if not self.keep:
                try:
                    await self.delete()
                except GatewayError as e:
                    if not self._gone(e):
                        raise
        finally:
            await self.aclose()


async def _owning(client: AsyncClient, making: Awaitable[AsyncSession]) -> AsyncSession:
    try:
        session = await making
    except BaseException:
        await client.aclose()
        raise
    session._owns_client = True
    return session


class AsyncSnapshot(BaseSnapshot[AsyncClient]):
    """A session's kernel state and files, kept: ``fork()`` starts a session holding them."""

    def fork(
        self, *, keep: bool = False, **options: Unpack[SessionOptions]
    ) -> Opening[AsyncSession]:
        """A new session holding this snapshot's state, files and history."""
        return self.client.create_session(keep=keep, from_snapshot=self.id, **options)

    async def delete(self) -> None:
        await self.client.call(self._delete_call())


AsyncClient.snapshot_class = AsyncSnapshot
