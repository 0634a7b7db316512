"""A Jupyter client's execute_requests are followed by their msg_id (``ChannelsRelay``): the
window for tool calls and the record of each are found by it, so two at once may not share
one."""

from __future__ import annotations

import asyncio
import json
import types

from gateway.relays.agent_stream import RelayOptions, ReplayBuffer
from gateway.relays.jupyter_channels import ChannelsRelay


class Stream:
    def sending(self) -> bool:
        return False

    def on_recv(self, callback) -> None: ...

    def on_send(self, callback) -> None: ...

    def close(self, linger: int) -> None: ...


class Signer:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, stream: Stream, msg: dict) -> None:
        self.sent.append(msg)

    def msg(self, kind: str, content: dict, parent: dict) -> dict:
        return {"msg_type": kind, "content": content, "parent_header": parent}


class Pipeline:
    """Executions as the relay sees it: each admitted cell, and the windows opened."""

    limits = types.SimpleNamespace(max_code_size=1 << 20)

    def __init__(self) -> None:
        self.admitted: list[types.SimpleNamespace] = []
        self.started: list[types.SimpleNamespace] = []
        self.ended: list[types.SimpleNamespace] = []

    async def admit(self, session, who, content) -> types.SimpleNamespace:
        cap = types.SimpleNamespace(bytes=1 << 20, limit=None)
        recorder = types.SimpleNamespace(listener=lambda: None, code=content["code"])
        self.admitted.append(types.SimpleNamespace(recorder=recorder, cap=cap))
        return self.admitted[-1]

    def cell_started(self, session, admitted) -> None:
        self.started.append(admitted)

    def cell_ended(self, session, admitted) -> None:
        self.ended.append(admitted)


def request(code: str, msg_id: str) -> dict:
    return {
        "header": {"msg_id": msg_id, "msg_type": "execute_request"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False},
    }  # fmt: skip


def connect(session: types.SimpleNamespace, pipeline: Pipeline) -> tuple[ChannelsRelay, list]:
    """A relay of ``session`` with fake sockets: what it sends to the kernel is in its
    signer's ``sent``, what it answers the client in the list returned."""
    manager = types.SimpleNamespace(spawn=asyncio.ensure_future, kernel_said=lambda *args: None)
    delivered: list[str] = []
    options = RelayOptions(1.0, 100, 1 << 20)
    buffer = ReplayBuffer(options)
    relay = ChannelsRelay(manager, pipeline, session, None, delivered.append, 1.0, buffer)  # type: ignore[arg-type]
    relay.streams = {"shell": Stream(), "control": Stream()}
    relay.signer = Signer()
    relay.connected = True
    return relay, delivered


def fake_session() -> types.SimpleNamespace:
    from gateway.masking import NO_SECRETS

    return types.SimpleNamespace(
        id="s1", masker=NO_SECRETS, touch=lambda: None, relayed=set(), connections=1
    )


def refusals(delivered: list[str]) -> list[str]:
    return [m["content"]["evalue"] for m in map(json.loads, delivered) if m["msg_type"] == "error"]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_second_execute_reusing_a_running_ones_msg_id_is_refused_not_confused_with_it():
    async def main():
        pipeline = Pipeline()
        relay, delivered = connect(fake_session(), pipeline)
        relay.send(request("tools_called_here()", "x"))
        relay.send(request("print(1)", "x"))
        await settle()
        assert [m["content"]["code"] for m in relay.signer.sent] == ["tools_called_here()"]
        assert len(pipeline.admitted) == 1
        assert "msg_id x" in refusals(delivered)[0]
        busy = {"header": {"msg_id": "b1", "msg_type": "status"}, "msg_type": "status",
                "content": {"execution_state": "busy"},
                "parent_header": {"msg_id": "x"}}  # fmt: skip
        relay._observe("iopub", busy)
        assert pipeline.started == pipeline.admitted  # the first cell's window, on its record

    asyncio.run(main())


def test_another_connection_cannot_reuse_the_msg_id_iopub_showed_it():
    """iopub shows every connection each cell's msg_id; another connection's execute under it
    would have its window opened (and its token as the caller) when the first cell runs."""

    async def main():
        session, pipeline = fake_session(), Pipeline()
        first, _ = connect(session, pipeline)
        second, delivered = connect(session, pipeline)
        first.send(request("tools_called_here()", "x"))
        await settle()
        second.send(request("print(1)", "x"))
        await settle()
        assert second.signer.sent == [] and "msg_id x" in refusals(delivered)[0]

    asyncio.run(main())


def test_a_cells_window_closes_at_its_execute_reply_before_its_idle():
    """Its code and user expressions are done once the reply is sent; a thread it left may
    call before the idle status (on another socket, which may drop it) is seen."""

    async def main():
        pipeline = Pipeline()
        relay, _ = connect(fake_session(), pipeline)
        relay.send(request("threading.Thread(target=calls).start()", "x"))
        await settle()
        reply = {"header": {"msg_id": "r1", "msg_type": "execute_reply"},
                 "msg_type": "execute_reply", "content": {"status": "ok", "execution_count": 1},
                 "parent_header": {"msg_id": "x"}}  # fmt: skip
        relay._observe("shell", reply)
        assert pipeline.ended == pipeline.admitted
        busy = {"header": {"msg_id": "b1", "msg_type": "status"}, "msg_type": "status",
                "content": {"execution_state": "busy"},
                "parent_header": {"msg_id": "x"}}  # fmt: skip
        relay._observe("iopub", busy)  # seen after its reply (another socket): opens none
        assert pipeline.started == []

    asyncio.run(main())


def test_a_connection_closed_under_a_running_cell_closes_its_window():
    """Its idle will never be seen now; the cell may run on (a process it started too)."""

    async def main():
        session, pipeline = fake_session(), Pipeline()
        relay, _ = connect(session, pipeline)
        relay.send(request("while True: calls()", "x"))
        await settle()
        relay.close()
        assert pipeline.ended == pipeline.admitted and session.relayed == set()

    asyncio.run(main())
