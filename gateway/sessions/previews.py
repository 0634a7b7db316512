"""Previews: a viewer's connections to a port a session's sandbox listens on.

Each session gets its relay (``sandbox/preview.py``) on its first preview,
and its forwarder is started then, with ``docker exec`` as the sandbox's user
beside the kernel (not through the policy gate: it is the gateway's own code,
as the package relay is), and again whenever it has gone (a restarted kernel
has a new container). The relay closes with the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import tornado.iostream

from ..errors import Conflict, NotSupported
from ..sandbox.base import ENGINE_ERRORS, Placement, SandboxProcess
from ..sandbox.preview import FORWARDERS, START, PreviewCaps, PreviewRelay
from .model import Session, check_usable


class Previews:
    """Every session's preview relay, by session id."""

    def __init__(self, placement: Placement, caps: PreviewCaps) -> None:
        self.placement = placement
        self.caps = caps
        self._relays: dict[str, PreviewRelay] = {}
        self._forwarders: dict[str, SandboxProcess] = {}
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._sources = [path.read_text() for path in FORWARDERS]

    @contextlib.asynccontextmanager
    async def connection(
        self, session: Session, port: int
    ) -> AsyncIterator[tornado.iostream.IOStream]:
        """A stream to ``port`` in the session's sandbox, for as long as the block runs."""
        relay = await self._relay(session)
        async with relay.connection(port) as stream:
            yield stream

    async def ports(self, session: Session) -> list[int]:
        """The ports something listens on in the session's sandbox."""
        return await (await self._relay(session)).ports()

    def relay_of(self, session_id: str) -> PreviewRelay | None:
        return self._relays.get(session_id)

    async def _relay(self, session: Session) -> PreviewRelay:
        check_usable(session)
        relay = self._relays.get(session.id)
        if relay is not None:
            return relay

        async def start() -> None:
            await self._start_forwarder(session, relay)

        relay = PreviewRelay(session.id, self.caps, start)
        self._relays[session.id] = relay
        session.on_end.add(lambda reason: self.close(session.id))
        return relay

    async def _start_forwarder(self, session: Session, relay: PreviewRelay) -> None:
        """Serve the socket in the sandbox's run directory of now, then start the forwarder."""
        check_usable(session)
        kernel = session.kernel
        container = kernel.container_id if kernel else None
        if container is None or kernel is None:
            raise Conflict(f"session {session.id} is still starting; retry in a moment")
        run_dir = getattr(kernel.sandbox, "run_dir", None)
        if run_dir is None:  # a cluster sandbox: no directory of the gateway's is mounted in it
            raise NotSupported(
                "previews need the docker placement (a run directory the gateway serves); "
                "this session's sandbox runs on another host"
            )
        await relay.serve(run_dir)
        self._forget_forwarder(session.id)  # its end must not count as the new one's
        argv = ["/bin/sh", "-c", START, "sh", *self._sources]
        try:
            process = await self.placement.start_process(container, argv, {}, "", None)
        except ENGINE_ERRORS as e:  # the sandbox stopped meanwhile (the session is ending)
            raise Conflict(
                f"session {session.id}'s sandbox is not running ({e.__class__.__name__}); "
                "its session is ending or its kernel died: GET the session to see which"
            ) from e
        self._forwarders[session.id] = process
        self._watches[session.id] = asyncio.ensure_future(_watch(process, relay))

    def close(self, session_id: str) -> None:
        relay = self._relays.pop(session_id, None)
        if relay is not None:
            relay.close()
        self._forget_forwarder(session_id)

    def _forget_forwarder(self, session_id: str) -> None:
        watch = self._watches.pop(session_id, None)
        if watch is not None:
            watch.cancel()
        process = self._forwarders.pop(session_id, None)
        if process is not None:
            process.close()

    def stop(self) -> None:
        for session_id in list(self._relays):
            self.close(session_id)


WATCH_BYTES = 1 << 20  # what is read of a forwarder's output, at most


async def _watch(process: SandboxProcess, relay: PreviewRelay) -> None:
    """Read what the forwarder says (a traceback, or why it cannot run) until it exits."""
    said, code, heard = b"", -1, 0
    with contextlib.suppress(Exception):  # the engine's failure ends the watch as well
        while (piece := await process.read()) is not None:
            said = (said + piece[1])[-300:]
            heard += len(piece[1])
            if heard > WATCH_BYTES:  # code in the sandbox can write there too: stop listening
                break
        code = await process.wait()
    reason = said.decode(errors="replace").strip() or "no output"
    relay.forwarder_ended(f"exited (code {code}): {reason}")
