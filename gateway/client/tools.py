"""Client tools: functions of the agent's own process that code in the sandbox calls.

``session.tools.register(fn)`` (or ``create_session(tools=[fn])``) makes
``fn`` callable from the session's code as ``sbx_tools.<name>`` during every
``session.run``: the run's request lists the tools (name, description from the
docstring, input schema from the signature), the gateway sends each call as a
``tool_call`` event on the run's stream, and this process answers with the
function's return value (JSON) or the error it raised. Without I/O: both
halves of the SDK send the ``ToolReply`` a call produces.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
               dict: "object", tuple: "array"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ToolReply:
    """What to send back on the stream for one call."""

    text: str


class ClientTools:
    """A session's client tools, by name."""

    def __init__(self) -> None:
        self.functions: dict[str, Callable[..., Any]] = {}
        self._specs: dict[str, dict[str, Any]] = {}

    def register(
        self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> Callable[..., Any]:
        """Make ``fn`` callable from the session's code; returns it (usable as a decorator)."""
        name = name or fn.__name__
        self.functions[name] = fn
        self._specs[name] = {
            "name": name,
            "description": description or inspect.getdoc(fn) or name,
            "input_schema": input_schema(fn),
        }
        return fn

    def specs(self) -> list[dict[str, Any]]:
        return list(self._specs.values())

    def answer(self, event: dict[str, Any]) -> ToolReply | Awaitable[ToolReply]:
        """Run the function a ``tool_call`` event names; a coroutine function's answer is
        awaitable (the async half awaits it, the sync half runs it to its end)."""
        call_id = event.get("call_id")
        fn = self.functions.get(str(event.get("tool")))
        arguments = event.get("arguments")
        if fn is None or not isinstance(arguments, dict):
            return _reply(call_id, error=f"this client has no tool {event.get('tool')!r}")
        try:
            value = fn(**arguments)
        except Exception as e:
            return _reply(call_id, error=f"{type(e).__name__}: {e}")
        if inspect.isawaitable(value):
            return _awaited(call_id, value)
        return _reply(call_id, value)


async def _awaited(call_id: Any, value: Awaitable[Any]) -> ToolReply:
    try:
        return _reply(call_id, await value)
    except Exception as e:
        return _reply(call_id, error=f"{type(e).__name__}: {e}")


def _reply(call_id: Any, result: Any = None, error: str | None = None) -> ToolReply:
    message: dict[str, Any] = {"type": "tool_result", "call_id": call_id}
    if error is None:
        try:
            message["result"] = json.loads(json.dumps(result, default=str))
        except (TypeError, ValueError) as e:
            error = f"the result is not JSON: {e}"
    if error is not None:
        message["error"] = error
    return ToolReply(json.dumps(message))


def input_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON schema of ``fn``'s parameters, from its annotations and defaults."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    properties: dict[str, Any] = {}
    required = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop: dict[str, Any] = {}
        kind = _json_type(hints.get(param.name))
        if kind:
            prop["type"] = kind
        if param.default is param.empty:
            required.append(param.name)
        else:
            prop["default"] = param.default
        properties[param.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return json.loads(json.dumps(schema, default=str))


def _json_type(hint: Any) -> str | None:
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):
        kinds = {_json_type(a) for a in typing.get_args(hint) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else None
    return _JSON_TYPES.get(origin)
