"""A session's agent stream: queued executes, numbered events, and resuming.

Every event gets an ``event_id`` and the last ones are kept (bounded by
count and bytes), so a client whose connection drops reconnects with the
last id it saw and gets what it missed, then the live events. A client that
does not come back within the reconnect grace has its queued executes
dropped and its running cell interrupted, so abandoned work does not keep
burning the sandbox. WebSocket handling lives in ``api.stream``; this class
knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from ..access.auth import Principal
from ..errors import BadRequest, GatewayError
from ..policy.approvals import Approval
from ..sessions.executions import Executions
from ..sessions.manager import SessionManager
from ..sessions.model import Session
from ..sessions.requests import ExecuteCode
from ..tools.mcp_servers import ToolFailed

log = logging.getLogger(__name__)

Subscriber = Callable[[str], None]  # gets each event as JSON text


@dataclasses.dataclass(frozen=True)
class RelayOptions:
    """What the live relays are bounded by (``app`` builds them from the settings)."""

    reconnect_grace: float  # seconds a dropped client's relay waits for it
    replay_events: int  # messages kept for a client that reconnects
    replay_bytes: int


class ReplayBuffer:
    """The latest messages, kept for a client that reconnects; bounded by count and bytes.

    Past either bound the oldest go first; ``dropped`` counts them, so a
    numbered stream knows the number of the oldest message still kept.
    """

    def __init__(self, options: RelayOptions) -> None:
        self.max_events = options.replay_events
        self.max_bytes = options.replay_bytes
        self.texts: deque[str] = deque()
        self.size = 0
        self.dropped = 0

    def append(self, text: str) -> None:
        """Keep one message, dropping the oldest past the bounds."""
        self.texts.append(text)
        self.size += len(text)
        while self.texts and (len(self.texts) > self.max_events or self.size > self.max_bytes):
            self.size -= len(self.texts.popleft())
            self.dropped += 1

    def drain(self) -> list[str]:
        """Everything kept, oldest first, leaving the buffer empty."""
        texts = list(self.texts)
        self.texts.clear()
        self.size = 0
        self.dropped += len(texts)
        return texts


class StreamHub:
    """Runs one session's streamed executes and fans their events out to clients."""

    def __init__(
        self,
        manager: SessionManager,
        executions: Executions,
        session: Session,
        options: RelayOptions,
    ) -> None:
        self.manager = manager
        self.executions = executions
        self.session = session
        self.grace = options.reconnect_grace
        # Ids carry the hub's identity, so an id from before a gateway restart
        # (or another session) is recognised as unknown rather than mistaken.
        self.epoch = uuid.uuid4().hex[:8]
        self.seq = 0
        self.buffer = ReplayBuffer(options)  # every event, numbered from 1
        self.subscribers: list[Subscriber] = []
        self.tasks: dict[str, asyncio.Task] = {}
        self.running: str | None = None
        self.running_in: str | None = None  # the code context of the cell running, if not default
        self._abandon: asyncio.TimerHandle | None = None
        self.tool_calls: dict[str, asyncio.Future[dict[str, Any]]] = {}  # by call id

    # -- clients -----------------------------------------------------------------------

    def subscribe(self, send: Subscriber, last_event_id: str | None = None) -> None:
        """Add a client; with ``last_event_id``, first replay what it missed."""
        if self._abandon is not None:
            self._abandon.cancel()
            self._abandon = None
        if last_event_id is not None:
            for text in self._since(last_event_id):
                send(text)
        self.subscribers.append(send)
        self.session.connections += 1
        self.session.touch()

    def unsubscribe(self, send: Subscriber) -> None:
        """Remove a client; when the last one leaves, its work is abandoned after the grace."""
        self.subscribers.remove(send)
        self.session.connections -= 1
        self.session.touch()
        if not self.subscribers and self.tasks:
            loop = asyncio.get_running_loop()
            self._abandon = loop.call_later(self.grace, self._abandon_work)

    def _since(self, last_event_id: str) -> list[str]:
        epoch, _, seq_text = last_event_id.rpartition("-")
        seq = int(seq_text) if seq_text.isdigit() else -1
        oldest = self.buffer.dropped + 1  # every event is buffered, in order, from number 1
        kept = list(self.buffer.texts)
        if epoch == self.epoch and oldest - 1 <= seq <= self.seq:
            return kept[seq + 1 - oldest :]
        gap = {
            "type": "gap",
            "message": (
                f"events after {last_event_id!r} are no longer buffered (the gateway keeps "
                f"the last {self.buffer.max_events} events of a session, and none from before it "
                "restarted); every execution's outputs are in "
                f"GET /v1/sessions/{self.session.id}/history"
            ),
        }
        return [json.dumps(gap), *kept]

    # -- requests ----------------------------------------------------------------------

    def submit(self, request_id: str, request: dict[str, Any], who: Principal) -> bool:
        """Queue an execute request, its events going to every client; False if refused."""
        if request_id in self.tasks:
            self.reject(request_id, BadRequest(f"request id {request_id!r} is already running"))
            return False
        task = self.manager.spawn(self._run(request_id, request, who))
        self.tasks[request_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(request_id, None))
        return True

    def interrupt(self, request_id: str | None, who: Principal) -> None:
        self.manager.spawn(self._interrupt(request_id, who))

    def reject(self, request_id: str | None, error: GatewayError) -> None:
        self.publish(rejection(request_id, error))

    async def _run(self, request_id: str, request: dict[str, Any], who: Principal) -> None:
        def started() -> None:
            self.running, self.running_in = request_id, request.get("context")
            self.publish({"type": "status", "state": "busy", "id": request_id})

        def output(out: dict[str, Any] | None) -> None:
            if out is None:
                self.publish({"type": "clear_output", "id": request_id})
                return
            event = {k: v for k, v in out.items() if k != "output_type"}
            self.publish({"type": out["output_type"], **event, "id": request_id})

        def held(approval: Approval) -> None:
            reasons = approval.decision["reasons"]
            self.publish(
                {
                    "type": "pending_approval",
                    "id": request_id,
                    "approval_id": approval.id,
                    "reasons": reasons,
                }
            )

        try:
            execute = ExecuteCode.from_json(request)
            result = await self.executions.execute(
                self.session.id,
                who,
                execute,
                on_output=output,
                on_start=started,
                on_hold=held,
                client=ClientTools(self, request_id) if execute.tools else None,
                on_tool_hold=held,
            )
        except GatewayError as e:
            self.reject(request_id, e)
            return
        finally:
            if self.running == request_id:
                self.running = None
        self.publish({"type": "status", "state": "idle", "id": request_id})
        self.publish({"type": "done", "id": request_id, **result.to_json()})

    async def _interrupt(self, request_id: str | None, who: Principal) -> None:
        try:
            if self.running_in is None:
                await self.manager.interrupt(self.session.id, who)
            else:  # a code context's cell
                session = self.manager.get(self.session.id, who)
                await self.manager.contexts.interrupt(session, self.running_in)
        except GatewayError as e:
            self.reject(request_id, e)

    def _abandon_work(self) -> None:
        self._abandon = None
        for request_id, task in list(self.tasks.items()):
            if request_id != self.running:
                task.cancel()  # still queued: never runs
        if self.running is not None:
            log.info("stream clients left during %s; interrupting it", self.running)
            self.interrupt(self.running, self.session.owner)

    def answer(self, message: dict[str, Any]) -> None:
        """A client's answer to a client tool's call (``tool_result``); unknown ids are
        ignored (the call was cut, or another client answered first)."""
        waiting = self.tool_calls.get(str(message.get("call_id")))
        if waiting is not None and not waiting.done():
            waiting.set_result(message)

    # -- events ------------------------------------------------------------------------

    def publish(self, event: dict[str, Any]) -> None:
        """Number an event, keep it for reconnecting clients, and send it to all."""
        text = self._number(event)
        self.buffer.append(text)
        for send in list(self.subscribers):
            send(text)

    def _number(self, event: dict[str, Any]) -> str:
        self.seq += 1
        event["event_id"] = f"{self.epoch}-{self.seq}"
        return json.dumps(event, default=str)

    def close(self) -> None:
        """Stop everything: the session has ended."""
        if self._abandon is not None:
            self._abandon.cancel()
        for task in list(self.tasks.values()):
            task.cancel()


class ClientTools:
    """An execute's client tools, answered by the agent's process: each call is a
    ``tool_call`` event to the stream's clients, its ``tool_result`` the answer."""

    def __init__(self, hub: StreamHub, request_id: str) -> None:
        self.hub, self.request_id = hub, request_id

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        call_id = uuid.uuid4().hex
        answered = self.hub.tool_calls[call_id] = asyncio.get_running_loop().create_future()
        self.hub.publish(
            {
                "type": "tool_call",
                "id": self.request_id,
                "call_id": call_id,
                "tool": name,
                # as every event the stream keeps: the sandbox's secrets masked
                "arguments": self.hub.session.masker.tree(arguments),
            }
        )
        try:
            async with asyncio.timeout(timeout):
                message = await answered
        except TimeoutError:
            raise ToolFailed(f"the client did not answer {name} within {timeout:g} s") from None
        finally:
            del self.hub.tool_calls[call_id]
        if message.get("error") is not None:
            text = str(message["error"])[:2000]
            return {
                "content": [{"type": "text", "text": text}],
                "structured": None,
                "is_error": True,
            }
        return {"content": [], "structured": {"result": message.get("result")}, "is_error": False}


def rejection(request_id: str | None, error: GatewayError) -> dict[str, Any]:
    """The event that tells a client its request cannot run, and why."""
    return {
        "type": "rejected",
        "id": request_id,
        "error": {"code": error.code, "message": error.message},
    }


def hub_for(
    manager: SessionManager,
    executions: Executions,
    options: RelayOptions,
    session_id: str,
    who: Principal,
) -> StreamHub:
    """The session's agent stream, made on first use."""
    session = manager.get(session_id, who)
    if session.stream is None:
        session.stream = StreamHub(manager, executions, session, options)
    assert isinstance(session.stream, StreamHub)
    return session.stream
