"""An execute's client tools over the agent stream: a call is a ``tool_call`` event, the
client's ``tool_result`` its answer (``relays.agent_stream.ClientTools``)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.relays.agent_stream import ClientTools
from gateway.tools.mcp_servers import ToolFailed


class Hub:
    def __init__(self) -> None:
        from gateway.masking import NO_SECRETS

        self.session = type("S", (), {"masker": NO_SECRETS})()
        self.events: list[dict] = []
        self.tool_calls: dict[str, asyncio.Future] = {}

    def publish(self, event: dict) -> None:
        self.events.append(event)

    def answer(self, message: dict) -> None:  # as StreamHub.answer
        waiting = self.tool_calls.get(str(message.get("call_id")))
        if waiting is not None and not waiting.done():
            waiting.set_result(message)


def test_a_call_is_published_and_answered_by_the_client():
    async def main():
        hub = Hub()
        client = ClientTools(hub, "run-1")
        call = asyncio.ensure_future(client.call("lookup", {"city": "Oslo"}, 5))
        await asyncio.sleep(0)
        (event,) = hub.events
        assert event["type"] == "tool_call" and event["id"] == "run-1"
        assert event["tool"] == "lookup" and event["arguments"] == {"city": "Oslo"}
        hub.answer({"type": "tool_result", "call_id": event["call_id"], "result": [1, 2]})
        answer = await call
        assert answer["structured"] == {"result": [1, 2]} and not answer["is_error"]
        assert hub.tool_calls == {}

    asyncio.run(main())


def test_a_clients_error_is_the_tools_error_and_silence_is_a_timeout():
    async def main():
        hub = Hub()
        client = ClientTools(hub, "run-1")
        call = asyncio.ensure_future(client.call("lookup", {}, 5))
        await asyncio.sleep(0)
        hub.answer({"call_id": hub.events[0]["call_id"], "error": "ValueError: no such city"})
        answer = await call
        assert answer["is_error"] and "no such city" in answer["content"][0]["text"]
        with pytest.raises(ToolFailed, match=r"did not answer lookup within 0\.1 s"):
            await client.call("lookup", {}, 0.1)
        assert hub.tool_calls == {}
        hub.answer({"call_id": "made-up", "result": 1})  # an unknown id is ignored

    asyncio.run(main())


def test_a_secret_in_a_calls_arguments_is_masked_in_the_event_the_stream_keeps():
    from gateway.masking import Masker

    async def main():
        hub = Hub()
        hub.session = type("S", (), {"masker": Masker({"WH_TOKEN": "s3cret-value-0042"})})()
        client = ClientTools(hub, "run-1")
        call = asyncio.ensure_future(client.call("lookup", {"key": "s3cret-value-0042"}, 5))
        await asyncio.sleep(0)
        assert hub.events[0]["arguments"] == {"key": "***WH_TOKEN***"}
        hub.answer({"call_id": hub.events[0]["call_id"], "result": 1})
        await call

    asyncio.run(main())
