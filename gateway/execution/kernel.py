"""One running kernel: start it, run code on it, interrupt, restart, stop.

jupyter_client's async kernel manager starts and stops the kernel and makes
its sockets; the gateway's requests go through its own ``KernelChannels``.
Knows nothing of sessions, HTTP or storage; ``SessionManager`` decides when
to call what.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from ..errors import KernelStartFailed
from ..masking import NO_SECRETS, Masker
from .channels import KernelChannels, Message, Request
from .outputs import OutputCap, OutputCollector, OutputListener, execution_count
from .transport.drops import DropWatch
from .transport.libzmq import ZmqLink, sent_only_when_connected, shared_context
from .transport.zmtp import Links, ZmtpLink

log = logging.getLogger(__name__)


@dataclass
class ExecutionResult:
    """What one execute produced, in the API's reply shape."""

    status: str  # ok | error | timeout | interrupted | dead
    execution_count: int | None
    outputs: list[dict[str, Any]]
    error: dict[str, Any] | None
    duration_ms: float
    truncated: bool = False
    output_bytes: int = 0  # what its outputs charged to the session's output budget
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    artifacts_truncated: bool = False  # the workspace walk stopped at its bounds
    files: list[dict[str, Any]] = field(default_factory=list)  # created, modified, deleted
    resumed: dict[str, Any] | None = None  # the session was paused: how it was resumed first
    context: dict[str, Any] | None = None  # the code context it ran in, if not the default

    @classmethod
    def collected(cls, status: str, collector: OutputCollector, started: float) -> ExecutionResult:
        """The result of a finished collection; ``started`` is a monotonic time."""
        return cls(
            status=status,
            execution_count=collector.execution_count,
            outputs=collector.finish(),
            error=collector.error,
            duration_ms=(time.monotonic() - started) * 1000,
            truncated=collector.truncated,
            output_bytes=collector.used,
        )

    def to_json(self) -> dict[str, Any]:
        resumed = {} if self.resumed is None else {"resumed": self.resumed}
        context = {} if self.context is None else {"context": self.context}
        return {
            **resumed,
            **context,
            "status": self.status,
            "execution_count": self.execution_count,
            "outputs": self.outputs,
            "error": self.error,
            "duration_ms": round(self.duration_ms, 3),
            "truncated": self.truncated,
            "artifacts": self.artifacts,
            "artifacts_truncated": self.artifacts_truncated,
            "files": self.files,
        }


# iopub messages that say the kernel is running a cell's code now; a kernel
# that sends none of them is taken to have begun this long after it went busy.
_CELL_BEGUN = {"execute_input", "stream", "display_data", "execute_result", "error"}
_SILENT_START = 1.0
# How long an execution waits for a kernel connection dropped before it to be made again.
_RECONNECT_WAIT = 2.0
_ALIVE_EVERY = 1.0  # seconds between two looks at a silent kernel running the gateway's code


class Kernel:
    """A kernel process in its sandbox, and the gateway's channels to it."""

    def __init__(
        self,
        kernel_name: str,
        spec_manager: KernelSpecManager,
        sandbox: Any,  # a placement's spec: where and how the kernel runs
        start_timeout: float,
    ) -> None:
        self.sandbox = sandbox
        self.start_timeout = start_timeout
        self.manager = AsyncKernelManager(
            context=shared_context(),
            kernel_name=kernel_name,
            kernel_spec_manager=spec_manager,
            **sandbox.manager_options(),
            # The gateway watches container deaths itself; no auto-restarts behind its back.
            autorestart=False,
        )
        self.manager.kernel_id = sandbox.session_id
        self._drops: DropWatch | Links | None = None
        self._channels: KernelChannels | None = None
        self._channels_ip: str | None = None  # where the kernel was when they were made
        self.died = asyncio.Event()
        self.restarting = False  # its old container's death is expected, not news
        self._interrupting = False
        self.interrupts = 0  # interrupts sent so far, by anyone: the rule for executions it cut
        self.restarts = 0  # a restart ends the cell running in the kernel it replaced
        # An interrupt asked for before the kernel began the cell would be lost
        # (SIGINT to an idle kernel does nothing); it is held until it begins.
        self._awaiting_start = False
        self._deferred_interrupt = False
        self._on_begun: Callable[[], None] | None = None  # the running execute's

    @property
    def container_id(self) -> str | None:
        provisioner = self.manager.provisioner
        return getattr(provisioner, "container_id", None)

    def _new_provisioner(self) -> Any:
        """The spec's provisioner, whatever the kernelspec names: the placement decides."""
        km = self.manager
        return self.sandbox.provisioner_class(
            kernel_id=self.sandbox.session_id, kernel_spec=km.kernel_spec, parent=km
        )

    async def start(self) -> None:
        """Start the container and wait until the kernel answers."""
        if self.manager.provisioner is None:
            self.manager.provisioner = self._new_provisioner()
        await self.manager.start_kernel(sandbox=self.sandbox)
        await self.connect()

    def runtime_info(self) -> dict[str, Any]:
        """What a restarted gateway needs to reattach: connection info (with key), container."""
        info = dict(self.manager.get_connection_info())
        info["key"] = self.manager.session.key.decode()
        # The shape of the provisioner's get/load_provisioner_info, JSON-safe.
        provisioner = self.manager.provisioner
        return {
            "kernel_id": self.sandbox.session_id,
            "connection_info": info,
            **(provisioner.reattach_info() if provisioner is not None else {}),
        }

    async def adopt(self, runtime: dict[str, Any]) -> None:
        """Take over a kernel a previous gateway process started (its ``runtime_info``).

        The kernel keeps running across the gateway's restart; only this side
        is rebuilt, so the kernel's state survives. ``connect`` then talks to it;
        an adopted kernel whose container is gone can still be restarted.
        """
        km = self.manager
        if km.provisioner is not None:  # a paused session's: its guards go with it
            await km.provisioner.let_go()
        km.load_connection_info(runtime["connection_info"])
        provisioner = self._new_provisioner()
        provisioner.use_sandbox(self.sandbox)
        await provisioner.load_provisioner_info(runtime)
        km.provisioner = provisioner
        # The kernel was started, by another process. jupyter_client keeps this
        # flag privately; left False, the first restart reuses a settled
        # readiness future and fails with InvalidStateError.
        km._attempted_start = True

    async def let_go(self) -> None:
        """Close this side (channels, guards) and leave the sandbox running for another to adopt."""
        self._stop_channels()
        provisioner = self.manager.provisioner
        if provisioner is not None:
            await provisioner.let_go()

    def detach(self) -> None:
        """Let go of the kernel without stopping it, for the next gateway process."""
        self._stop_channels()

    def _stop_channels(self) -> None:
        if self._drops is not None:
            self._drops.close()
            self._drops = None
        if self._channels is not None:
            self._channels.close()
            self._channels = None

    @property
    def connected(self) -> bool:
        """Whether the gateway's channels are open (not yet, after an adoption)."""
        return self._channels is not None

    async def connect(self) -> None:
        """Open the gateway's channels to the kernel (once) and wait until it answers."""
        self.died.clear()
        km = self.manager
        if self._channels is not None and self._channels_ip != km.ip:
            self._stop_channels()  # restarted elsewhere (a cluster sandbox on another node)
        if self._channels is None:
            self._channels, self._channels_ip = self._open_channels(), km.ip
        try:
            await self._answers()
        except RuntimeError as e:
            output = await self._container_output()
            raise KernelStartFailed(
                f"the kernel did not start ({e}); its last output: {output or '(none)'}"
            ) from e

    def _open_channels(self) -> KernelChannels:
        """The gateway's own ZMTP straight to the kernel's sockets where the sandbox
        offers them (on this host, bounded as the guards bound them); else libzmq's."""
        km = self.manager
        direct = getattr(self.sandbox, "direct_sockets", None)
        paths = direct(km.shell_port, km.iopub_port) if direct is not None else None
        if paths is not None:
            shell_path, iopub_path, limit = paths
            links = (ZmtpLink(shell_path, b"DEALER", limit), ZmtpLink(iopub_path, b"SUB", limit))
            self._drops = Links(links)
            return KernelChannels(km.session, *links)
        shell, iopub = sent_only_when_connected(km.context, km.connect_shell), km.connect_iopub()
        self._drops = DropWatch([iopub, shell])
        return KernelChannels(km.session, ZmqLink(shell), ZmqLink(iopub))

    async def _answers(self) -> None:
        """A kernel_info reply on shell and a message on iopub: both channels are up.

        Asked again each second, until ``start_timeout``; a late reply to an
        earlier ask counts too, as jupyter_client's ``wait_for_ready`` does.
        """
        channels = self._channels
        assert channels is not None
        deadline = time.monotonic() + self.start_timeout
        asked: list[Request] = []
        try:
            while True:
                channels.iopub_heard.clear()
                asked.append(self._request("kernel_info_request", {}))
                await asyncio.wait([request.reply for request in asked], timeout=1.0)
                if any(request.reply.done() for request in asked):
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.2):
                            await channels.iopub_heard.wait()
                    if channels.iopub_heard.is_set():
                        return
                channels.poke()
                if not await self.manager.is_alive():
                    raise RuntimeError("the kernel stopped before it answered")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the kernel did not answer in {self.start_timeout:g} s")
        finally:
            for request in asked:
                request.close()

    def _request(self, msg_type: str, content: dict[str, Any], iopub: bool = False) -> Request:
        """A request on shell; ``iopub``: its iopub messages are read too (an execute's)."""
        if self._channels is None:
            raise RuntimeError("the kernel is not connected")
        return self._channels.request(msg_type, content, iopub)

    async def _container_output(self) -> str:
        """The sandbox's last output lines, to say why a start failed."""
        provisioner = self.manager.provisioner
        return await provisioner.output_tail() if provisioner is not None else ""

    async def run_silently(self, code: str) -> None:
        """Run setup code that leaves no trace: no execution count, history or output.

        A live kernel gets its start timeout to answer, not a few seconds: on a loaded
        host a late reply is no refusal (a death still fails it at once)."""
        request = self._request("execute_request", _execute_content(code, silent=True))
        try:
            reply = await self._reply_while_alive(request, self.start_timeout)
        except RuntimeError as e:
            raise KernelStartFailed(str(e)) from None
        finally:
            request.close()
        if reply is None:
            raise KernelStartFailed(
                f"the kernel did not answer its setup code in {self.start_timeout:g} s"
            )
        if reply.get("status") != "ok":
            raise KernelStartFailed(f"the kernel refused its setup code: {reply}")

    async def evaluate(self, code: str, expression: str, timeout: float) -> str:
        """Run code silently, then return the text of ``expression`` evaluated after it.

        For the gateway's own work in the kernel (saving its state, say): no
        execution count, history or output. Raises ``RuntimeError`` with the
        kernel's error when either fails, ``TimeoutError`` when no reply comes.
        """
        content = _execute_content(code, silent=True, user_expressions={"value": expression})
        request = self._request("execute_request", content)
        try:
            reply = await self._reply_while_alive(request, timeout)
        finally:
            request.close()
        if reply is None:
            raise TimeoutError(f"the kernel gave no answer within {timeout:g} s")
        value = reply.get("user_expressions", {}).get("value", {})
        for answer in (reply, value):
            if answer.get("status") != "ok":
                raise RuntimeError(f"{answer.get('ename')}: {answer.get('evalue')}")
        return str(value.get("data", {}).get("text/plain", ""))

    async def _reply_while_alive(self, request: Request, timeout: float) -> Message | None:
        """The reply, None if late; raises as soon as the kernel is seen dead.

        A death while the gateway's code runs (a namespace whose load kills the
        kernel, a dump out of memory) is reported by nobody while a session is
        starting, and would hold it, and every request queued behind it, to ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            reply = await request.wait_reply(min(left, _ALIVE_EVERY))
            if reply is not None or request.reply.done():  # answered, or its channels closed
                return reply
            if self.died.is_set() or not await self._alive():
                raise RuntimeError("the kernel died while it ran the gateway's code")
        return None

    async def _alive(self) -> bool:
        """Whether the kernel runs; yes when the engine cannot say (its reply may still come)."""
        try:
            return await self.manager.is_alive()
        except OSError:  # the engine unreachable: docker's and requests' errors are OSErrors
            return True

    def environment(self, env: Mapping[str, str]) -> contextlib.AbstractAsyncContextManager:
        """Run one execution with ``env`` set in a Python kernel's ``os.environ``, then undo it."""
        return self._environment(env) if env else contextlib.nullcontext()

    @contextlib.asynccontextmanager
    async def _environment(self, env: Mapping[str, str]) -> AsyncIterator[None]:
        await self.run_silently(
            f"import os as _sbx_os\n_sbx_env = {{k: _sbx_os.environ.get(k) for k in {list(env)!r}}}"
            f"\n_sbx_os.environ.update(__import__('json').loads({json.dumps(env)!r}))"
        )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a kernel restarted or dead has nothing to undo
                await self.run_silently(
                    "for _k, _v in _sbx_env.items():\n"
                    "    _sbx_os.environ.pop(_k, None) if _v is None else "
                    "_sbx_os.environ.__setitem__(_k, _v)\n"
                    "del _sbx_env, _k, _v"
                )

    async def kernel_info(self) -> dict[str, Any]:
        """The kernel's kernel_info_reply content (language_info, implementation)."""
        reply = await self._reply(self._request("kernel_info_request", {}), self.start_timeout)
        if reply is None:
            raise TimeoutError(f"the kernel gave no kernel_info_reply in {self.start_timeout:g} s")
        return reply

    async def restart(self) -> None:
        """Replace the kernel process with a fresh one (state is lost).

        Shutdown plus start rather than ``restart_kernel``: that one needs the
        launch arguments of a start in this process, which a reattached kernel
        never had.
        """
        self.restarting = True
        self.restarts += 1
        try:
            await self.manager.shutdown_kernel(now=True, restart=True)
            await self.start()
        finally:
            self.restarting = False

    async def stop(self) -> None:
        """Stop the kernel and remove its sandbox, ready for a later ``start`` (a pause).

        Its guards close too: a paused session may be deleted, or resumed in
        another sandbox, and the next ``start`` opens them again.
        """
        await self.let_go()
        await self.manager.shutdown_kernel(now=True, restart=True)

    async def interrupt(self) -> None:
        self._interrupting = True
        self.interrupts += 1
        if self._awaiting_start:
            self._deferred_interrupt = True
            return
        await self.manager.interrupt_kernel()

    async def shutdown(self) -> None:
        """Stop the kernel now and remove its container."""
        self._stop_channels()
        await self.manager.shutdown_kernel(now=True)

    async def execute(
        self,
        code: str,
        timeout: float,
        cap: OutputCap,
        grace: float,
        on_output: OutputListener | None = None,
        on_start: Callable[[], None] | None = None,
        mask: Masker = NO_SECRETS,
        on_begun: Callable[[], None] | None = None,
    ) -> ExecutionResult:
        """Run ``code``; stop it at ``timeout`` by interrupt, then by restart after ``grace``.

        ``on_output`` hears of each output kept and each clear as they happen;
        ``on_start`` runs once an interrupt would be honoured for this cell;
        ``mask`` takes the session's secrets out of every output first; ``on_begun`` runs
        when its code begins (the kernel may run another's cell before it).
        """
        self._interrupting = self._deferred_interrupt = False
        self._awaiting_start = True
        self._on_begun = on_begun
        if on_start is not None:
            on_start()
        try:
            collector = OutputCollector(cap.bytes, on_output, cap.limit, mask)
            return await self._execute(code, timeout, grace, collector)
        finally:
            self._awaiting_start = False
            self._on_begun = None

    async def _execute(
        self,
        code: str,
        timeout: float,
        grace: float,
        collector: OutputCollector,
    ) -> ExecutionResult:
        started = time.monotonic()
        deadline = started + timeout
        drops = self._drops
        assert drops is not None
        await drops.settled(_RECONNECT_WAIT)
        drops_before = drops.drops
        request = self._request("execute_request", _execute_content(code), iopub=True)
        try:
            return await self._collect(request, collector, started, deadline, grace, drops_before)
        finally:
            request.close()

    async def _collect(
        self,
        request: Request,
        collector: OutputCollector,
        started: float,
        deadline: float,
        grace: float,
        drops_before: int,
    ) -> ExecutionResult:
        """Fold the request's iopub messages into ``collector`` until the kernel is idle again."""
        drops = self._drops
        assert drops is not None
        timeout = deadline - started
        timed_out = restarted = False
        busy_since = float("inf")
        reply = None
        restarts = self.restarts
        while True:
            if self.died.is_set():
                return ExecutionResult.collected("dead", collector, started)
            if self.restarts != restarts:  # restarted by a client: its kernel is gone
                return _restarted(ExecutionResult.collected("interrupted", collector, started))
            now = time.monotonic()
            if now >= deadline:
                if timed_out:  # the interrupt did not stop it within the grace period
                    await self.restart()
                    restarted = True
                    break
                timed_out = True
                deadline = now + grace
                await self.manager.interrupt_kernel()
            if self._awaiting_start and now - busy_since > _SILENT_START:
                await self._begun()
            msg = await request.iopub.get(min(0.25, deadline - now))
            if msg is None:
                collector.lost = drops.drops - drops_before
                if collector.lost and (reply := await request.wait_reply(0.0)) is not None:
                    break  # its idle status may have gone with a dropped connection
                continue
            if self._awaiting_start and msg["msg_type"] in _CELL_BEGUN:
                # The cell's code is about to run: an interrupt now stops it. One
                # sent earlier (on the busy status) can land in the kernel's own
                # handling, which swallows it and skips the cell without a word.
                await self._begun()
            elif self._awaiting_start and msg["msg_type"] == "status":
                busy_since = time.monotonic()  # a kernel that never says more begins soon
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                break
            collector.add_message(msg)
        collector.lost = drops.drops - drops_before
        if timed_out:
            return self._timeout_result(collector, started, timeout, restarted)
        # No reply at all: the kernel dropped the request (an interrupt landed
        # before the code ran); the reply is short in coming then, not 5 s.
        if reply is None:
            reply = await self._reply(request, 0.5 if self._interrupting else 5.0)
        if reply is None:
            reply = {"status": "abort"} if self._interrupting else {}
        if collector.execution_count is None:
            collector.execution_count = execution_count(reply)
        return ExecutionResult.collected(
            outcome(reply, collector.error, self._interrupting), collector, started
        )

    async def _begun(self) -> None:
        """The cell is running: send an interrupt that was asked for before."""
        self._awaiting_start = False
        if self._on_begun is not None:
            self._on_begun()
        if self._deferred_interrupt:
            await self.manager.interrupt_kernel()

    async def _reply(self, request: Request, timeout: float = 5.0) -> Message | None:
        """The request's reply content (it may trail the idle status slightly); None if late."""
        try:
            reply = await request.wait_reply(timeout)
        finally:
            request.close()
        if reply is None:
            log.warning("no reply to %s", request.msg_id)
        return reply

    def _timeout_result(
        self, collector: OutputCollector, started: float, timeout: float, restarted: bool
    ) -> ExecutionResult:
        action = (
            "it did not stop when interrupted, so the kernel was restarted and its state is lost"
            if restarted
            else "it was interrupted; the session's state is kept"
        )
        result = ExecutionResult.collected("timeout", collector, started)
        result.error = {
            "ename": "ExecutionTimeout",
            "evalue": f"execution exceeded its {timeout:g} s timeout: {action}",
            "traceback": [],
            "kernel_restarted": restarted,
        }
        return result


def _restarted(result: ExecutionResult) -> ExecutionResult:
    result.error = {
        "ename": "KernelRestarted",
        "evalue": "the kernel was restarted while this cell ran; its state is lost",
        "traceback": [],
    }
    return result


def outcome(reply: Mapping[str, Any], error: dict[str, Any] | None, interrupted: bool) -> str:
    """ok, error or interrupted: the one rule, for the gateway's executes and a client's alike.

    ``interrupted``: an interrupt was sent while it ran. Kernels tell an
    interrupt differently: ipykernel raises KeyboardInterrupt (an error),
    bash_kernel and IRkernel reply ``abort`` with no error at all.
    """
    if reply.get("status") in ("abort", "aborted"):
        return "interrupted"
    if error is None:
        return "ok"
    return "interrupted" if interrupted else "error"


def _execute_content(code: str, silent: bool = False, **extra: Any) -> dict[str, Any]:
    """An execute_request's content; a silent one leaves no history."""
    return {
        "code": code,
        "silent": silent,
        "store_history": not silent,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
        **extra,
    }
