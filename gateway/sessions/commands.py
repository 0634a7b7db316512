"""Commands run in a session's sandbox beside its kernel (``/v1/.../commands``, E2B's commands).

A command belongs to its session: found, signalled and fed stdin by its pid,
gone when the session ends. It runs as the kernel does (same user, same
container limits). Its output goes to whoever listens at the time, each
listener through a small queue: a slow one holds the command back (its pipe
fills) rather than the gateway's memory. With nobody listening, output is
read and dropped, as E2B's envd does, so a detached command never stalls.
Output is masked of the session's secrets (a command inherits the sandbox's
environment) as one text per stream: a secret a read cut in two is masked
whole (``Masker.pieces``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from ..errors import Conflict, LimitExceeded, NotFound
from ..masking import NO_SECRETS, Masker
from ..sandbox.base import ENGINE_ERRORS, Placement, SandboxProcess
from ..tasks import TaskSet
from .requests import StartCommand

MAX_COMMANDS = 32  # running at once in one session
LISTEN_QUEUE = 16  # output pieces waiting for one listener
KILL_RETRY = 1.0  # seconds between tries to kill a command its frozen sandbox holds


class Command:
    """One running (or finished) command and its listeners."""

    def __init__(
        self,
        process: SandboxProcess,
        request: StartCommand,
        tasks: TaskSet,
        masker: Masker = NO_SECRETS,
    ) -> None:
        self.process = process
        self.masker = masker
        self.pid = process.pid
        self.request = request
        self.started = time.monotonic()
        self._listeners: set[asyncio.Queue[tuple[str, bytes] | None]] = set()
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._tasks = tasks
        tasks.spawn(self._pump())

    @property
    def running(self) -> bool:
        return not self.exit_code.done()

    async def _pump(self) -> None:
        code = -1
        try:
            async for chunk in self.masker.pieces(self.process.read):
                for queue in list(self._listeners):
                    await queue.put(chunk)
            code = await self.process.wait()
        finally:
            self.process.close()
            self.exit_code.set_result(code)
            for queue in list(self._listeners):
                await queue.put(None)

    def listen(self) -> Listener:
        """Its output from now on (not from the first read: nothing said meanwhile is lost)."""
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(LISTEN_QUEUE)
        if self.exit_code.done():
            queue.put_nowait(None)
        else:
            self._listeners.add(queue)
        return Listener(self._listeners, queue)

    async def send_stdin(self, data: bytes) -> None:
        if not self.running:
            raise Conflict(f"command {self.pid} has exited")
        await self.process.write(data)

    async def close_stdin(self) -> None:
        await self.process.close_stdin()

    async def signal(self, signum: int) -> None:
        """Signal it; 409 while its sandbox cannot be reached (frozen by a pause, or gone)."""
        if self.running:
            try:
                await self.process.signal(signum)
            except ENGINE_ERRORS as e:
                raise Conflict(
                    f"command {self.pid} cannot be signalled now ({e}); its session may be "
                    "paused: resume it, then signal the command"
                ) from e

    async def kill(self) -> bool:
        """SIGKILL it now (True), or else as soon as its sandbox thaws (a removed one's
        commands end with it): a command frozen past its timeout must not outlive it."""
        try:
            await self.signal(9)
            return True
        except Conflict:
            self._tasks.spawn(self._kill_later())
            return False

    async def _kill_later(self) -> None:
        while self.running:
            await asyncio.sleep(KILL_RETRY)
            with contextlib.suppress(Conflict):
                await self.signal(9)
                return

    async def resize(self, rows: int, cols: int) -> None:
        if self.request.tty is None:
            raise Conflict(f"command {self.pid} has no terminal to resize")
        await self.process.resize(rows, cols)


class Listener:
    """One listener's view of a command's output; ``close`` it when done listening."""

    def __init__(
        self,
        listeners: set[asyncio.Queue[tuple[str, bytes] | None]],
        queue: asyncio.Queue[tuple[str, bytes] | None],
    ) -> None:
        self._listeners, self._queue = listeners, queue
        self.ended = False

    async def next(self, timeout: float | None = None) -> tuple[str, bytes] | None:
        """The next (stdout | stderr | pty, bytes); None at the end; TimeoutError on silence."""
        if self.ended:
            return None
        async with asyncio.timeout(timeout):
            item = await self._queue.get()
        self.ended = item is None
        return item

    def close(self) -> None:
        self._listeners.discard(self._queue)

    def __aiter__(self) -> AsyncIterator[tuple[str, bytes]]:
        return self._all()

    async def _all(self) -> AsyncIterator[tuple[str, bytes]]:
        try:
            while (item := await self.next()) is not None:
                yield item
        finally:
            self.close()


class Commands:
    """Every session's commands, by session id and pid."""

    def __init__(self, placement: Placement, tasks: TaskSet) -> None:
        self.placement = placement
        self.tasks = tasks
        self._by_session: dict[str, dict[int, Command]] = {}

    async def start(
        self,
        session_id: str,
        sandbox_id: str,
        request: StartCommand,
        masker: Masker = NO_SECRETS,
    ) -> Command:
        live = self._by_session.setdefault(session_id, {})
        for pid in [pid for pid, c in live.items() if not c.running]:
            del live[pid]
        if len(live) >= MAX_COMMANDS:
            raise LimitExceeded(
                f"{MAX_COMMANDS} commands already run in this session; wait for or kill one"
            )
        process = await self.placement.start_process(
            sandbox_id, request.argv, request.env, request.cwd, request.tty
        )
        command = Command(process, request, self.tasks, masker)
        live[command.pid] = command
        return command

    def get(self, session_id: str, pid: int) -> Command:
        command = self._by_session.get(session_id, {}).get(pid)
        if command is None or not command.running:
            raise NotFound(f"no running command with pid {pid} in this session")
        return command

    def running(self, session_id: str) -> list[Command]:
        return [c for c in self._by_session.get(session_id, {}).values() if c.running]

    def end(self, session_id: str) -> None:
        """Forget a session's commands; its sandbox's end ends them."""
        self._by_session.pop(session_id, None)

    async def run(self, command: Command, timeout: float, cap: int) -> dict[str, Any]:
        """Wait for a command with its output (``cap`` bytes at most), killing it at ``timeout``."""
        listener = command.listen()  # before any await: the command is already talking
        output = {"stdout": bytearray(), "stderr": bytearray()}
        kept = 0
        timed_out = False

        async def collect() -> None:
            nonlocal kept
            async for kind, data in listener:
                room = max(0, cap - kept)
                output["stderr" if kind == "stderr" else "stdout"] += data[:room]
                kept += len(data)

        killed = True
        try:
            async with asyncio.timeout(timeout):
                await collect()
        except TimeoutError:
            timed_out = True
            killed = await command.kill()  # not yet: its sandbox is frozen, no exit to wait for
        if killed:
            async with asyncio.timeout(10):
                await asyncio.shield(command.exit_code)
        return {
            "pid": command.pid,
            "exit_code": None if timed_out else command.exit_code.result(),
            "stdout": output["stdout"].decode(errors="replace"),
            "stderr": output["stderr"].decode(errors="replace"),
            "truncated": kept > cap,
            "timed_out": timed_out,
            "duration_ms": round((time.monotonic() - command.started) * 1000, 3),
        }
