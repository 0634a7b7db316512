"""Client tools in the SDK, without I/O: the schema a function gets, the request a run sends,
and the reply each ``tool_call`` event produces."""

from __future__ import annotations

import asyncio
import json

from gateway.client.base import session_request
from gateway.client.stream import Run
from gateway.client.tools import ClientTools, ToolReply, input_schema


def lookup(city: str, days: int = 3, *, metric: bool | None = None) -> dict:
    """Weather for a city."""
    return {"city": city, "days": days, "metric": metric}


async def later(x: float) -> float:
    await asyncio.sleep(0)
    return x * 2


def broken() -> None:
    raise ValueError("no such city")


def test_a_functions_schema_comes_from_its_signature():
    assert input_schema(lookup) == {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "default": 3},
            "metric": {"type": "boolean", "default": None},
        },
        "required": ["city"],
    }


def test_a_run_lists_the_tools_and_answers_their_calls():
    tools = ClientTools()
    tools.register(lookup)
    tools.register(broken, name="broken_tool", description="Fails.")
    run = Run("x", tools=tools)
    request = json.loads(run.take_request())
    assert [t["name"] for t in request["tools"]] == ["lookup", "broken_tool"]
    assert request["tools"][0]["description"] == "Weather for a city."

    def call(tool: str, **arguments) -> dict:
        event = {"type": "tool_call", "id": run.id, "call_id": "c1", "tool": tool,
                 "arguments": arguments}  # fmt: skip
        (reply,) = run.feed(json.dumps(event))
        assert isinstance(reply, ToolReply)
        return json.loads(reply.text)

    assert call("lookup", city="Oslo") == {
        "type": "tool_result", "call_id": "c1",
        "result": {"city": "Oslo", "days": 3, "metric": None},
    }  # fmt: skip
    assert call("broken_tool")["error"] == "ValueError: no such city"
    assert "no tool 'nope'" in call("nope")["error"]
    assert "TypeError" in call("lookup", town="x")["error"]  # wrong arguments: an error reply
    other = {"type": "tool_call", "id": "another-run", "call_id": "c2", "tool": "lookup"}
    assert run.feed(json.dumps(other)) == []  # another run's call is not this one's


def test_an_async_tool_is_awaited():
    tools = ClientTools()
    tools.register(later)
    event = {"type": "tool_call", "id": "r", "call_id": "c", "tool": "later",
             "arguments": {"x": 2}}  # fmt: skip
    reply = asyncio.run(tools.answer(event))
    assert json.loads(reply.text)["result"] == 4


def test_a_run_without_tools_sends_none_and_create_keeps_functions_out_of_the_body():
    assert "tools" not in json.loads(Run("x").take_request())
    assert session_request({"tools": [lookup]}) == {}
    assert session_request({"tools": {"mcp": []}}) == {"tools": {"mcp": []}}
