"""Notice kernel containers dying the moment the engine does.

One thread follows the engine's event stream for this gateway's containers,
instead of a poll loop or a blocked thread per session, and hands each
``die`` to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import docker
import docker.errors

from ..base import DeathCallback
from .provisioner import LABEL_GATEWAY, LABEL_SESSION

log = logging.getLogger(__name__)


class ContainerWatcher:
    """Calls ``on_death`` on the loop for every container of ours that stops."""

    def __init__(
        self,
        client: docker.DockerClient,
        gateway_id: str,
        on_death: DeathCallback,
    ) -> None:
        self._client = client
        self._gateway_id = gateway_id
        self._on_death = on_death
        self._stream = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # Subscribe before returning so no death between now and the thread start is missed.
        self._stream = self._client.events(
            decode=True,
            filters={
                "type": "container",
                "event": ["die"],
                "label": [f"{LABEL_GATEWAY}={self._gateway_id}"],
            },
        )
        self._thread = threading.Thread(target=self._follow, name="sbx-events", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for event in self._stream:
                attrs = event.get("Actor", {}).get("Attributes", {})
                session_id = attrs.get(LABEL_SESSION)
                if session_id:
                    exit_code = int(attrs.get("exitCode", -1))
                    assert self._loop is not None
                    self._loop.call_soon_threadsafe(
                        self._on_death, session_id, event["Actor"]["ID"], exit_code
                    )
        except Exception:  # the stream ends with an error when we close it
            if not self._stopping:
                log.exception("lost the container event stream; deaths will be found late")

    def stop(self) -> None:
        self._stopping = True
        if self._stream is not None:
            self._stream.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
