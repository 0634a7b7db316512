"""Notice kernel containers dying the moment the engine does.

One thread follows the engine's event stream for every session container
(the session manager ignores those of sessions it does not hold; adopted
ones keep the label of the gateway that started them),
instead of a poll loop or a blocked thread per session, and hands each
``die`` to the event loop. When the engine stops or crashes the stream ends;
the thread subscribes again with backoff until the engine answers, then
asks for a resync: deaths while nobody listened (a restarted engine kills
the containers a crash left running) were never reported as events.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import docker

from ..base import ENGINE_ERRORS, DeathCallback
from .provisioner import LABEL_SESSION

log = logging.getLogger(__name__)

_BACKOFF = (0.25, 2.0)  # first and longest wait between attempts to subscribe again, seconds


class ContainerWatcher:
    """Calls ``on_death`` on the loop for every session container that stops.

    ``on_resync`` is called on the loop each time the stream is back after a
    break, once the new subscription is in place (so no death falls between).
    """

    def __init__(
        self,
        client: docker.DockerClient,
        on_death: DeathCallback,
        on_resync: Callable[[], None],
    ) -> None:
        self._client = client
        self._on_death = on_death
        self._on_resync = on_resync
        self._stream = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self.lost: str | None = None  # why the engine does not answer, while it does not

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # Subscribe before returning so no death between now and the thread start is missed.
        self._stream = self._subscribe()
        self._thread = threading.Thread(target=self._follow, name="sbx-events", daemon=True)
        self._thread.start()

    def _subscribe(self):
        return self._client.events(
            decode=True,
            filters={
                "type": "container",
                "event": ["die"],
                # Every session's: those adopted from another gateway keep its label.
                "label": [LABEL_SESSION],
            },
        )

    def _follow(self) -> None:
        while not self._stopping.is_set():
            try:
                for event in self._stream:
                    self._report(event)
                why = "the engine closed its event stream"
            except Exception as e:  # also how the stream ends when we close it
                why = f"the engine's event stream broke: {e!r}"
            if self._stopping.is_set():
                return
            self.lost = why
            log.warning("%s; container deaths go unnoticed until it answers again", why)
            self._reconnect()

    def _report(self, event: dict) -> None:
        attrs = event.get("Actor", {}).get("Attributes", {})
        session_id = attrs.get(LABEL_SESSION)
        if session_id:
            exit_code = int(attrs.get("exitCode", -1))
            assert self._loop is not None
            self._loop.call_soon_threadsafe(
                self._on_death, session_id, event["Actor"]["ID"], exit_code
            )

    def _reconnect(self) -> None:
        """Subscribe again, waiting longer after each refusal; then ask for a resync."""
        delay = _BACKOFF[0]
        while not self._stopping.wait(delay):
            try:
                self._stream = self._subscribe()
            except ENGINE_ERRORS as e:
                self.lost = f"the Docker engine does not answer: {e}"
                delay = min(delay * 2, _BACKOFF[1])
                continue
            if self._stopping.is_set():  # stop() closed the stream before this one
                self._stream.close()
                return
            self.lost = None
            log.info("the engine answers again; checking for containers that died meanwhile")
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._on_resync)
            return

    def stop(self) -> None:
        self._stopping.set()
        if self._stream is not None:
            self._stream.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
