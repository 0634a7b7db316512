"""This session's tools as plain functions: ``from sbx_tools import query_warehouse``.

Runs inside the sandbox (the gateway puts it in a Python kernel's
``sys.modules``; it needs only the standard library). Each tool the session
was given is a function named after it, its signature and docstring made from
its input schema; a call goes to the gateway over the session's tool socket,
through the policy gate, and returns the tool's answer as Python objects. A
tool's error raises ``ToolError``; a call the gateway refuses (the policy, an
approver, a limit, no execute running) raises ``ToolRefused``. Calls work from
threads (each its own connection) and from asyncio (``await acall(...)`` or
``await asyncio.to_thread(fn, ...)``); ``call(name, **arguments)`` reaches a
tool whose name is not a Python identifier.
"""

import asyncio
import http.client
import inspect
import json
import keyword
import re
import socket

SOCKET = "/run/sbx/tools.sock"

__all__ = ["ToolError", "ToolRefused", "acall", "call", "tools"]


class ToolError(Exception):
    """A tool failed, or answered with an error."""


class ToolRefused(ToolError):
    """The gateway refused the call: the policy, an approver, a limit, or no execute running."""


_REFUSALS = {400, 403, 404, 408, 409, 413, 429, 431}  # the gateway said no


class _Connection(http.client.HTTPConnection):
    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(SOCKET)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _request(method, path, body=None):
    # No timeout of its own: the gateway bounds each call (an approver's time, then the
    # call's) and always answers; giving up first would leave an approved call running.
    connection = _Connection("tools", timeout=None)
    data = None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"Content-Type": "application/json"}
    try:
        connection.connect()
        try:
            connection.request(method, path, body=data, headers=headers)
        except OSError:
            pass  # answered (a refusal) and closed before the request was read: read it
        response = connection.getresponse()
        status, raw = response.status, response.read()
    except (OSError, http.client.HTTPException) as e:
        why = f"the tool socket did not answer ({e!r}); was this session given tools?"
        raise ToolError(why) from None
    finally:
        connection.close()
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ToolError(f"the gateway's answer was not JSON (status {status})") from None
    if status != 200:
        error = doc.get("error") or {}
        kind = ToolRefused if status in _REFUSALS else ToolError
        raise kind(error.get("message") or f"status {status}")
    return doc


def tools():
    """The session's tools as the gateway lists them (name, description, input schema...)."""
    return _request("GET", "/tools")["tools"]


def call(name, /, **arguments):
    """Call the tool ``name`` with ``arguments`` (one may be called ``name`` too); its answer
    as Python objects."""
    return _request("POST", f"/call/{name}", {"arguments": arguments})["result"]


async def acall(name, /, **arguments):
    """``call`` for asyncio code: the call runs on a thread, the loop goes on."""
    return await asyncio.to_thread(call, name, **arguments)


_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
          "array": "list", "object": "dict", "null": "None"}  # fmt: skip


def python_name(name):
    """A tool's name as a Python identifier (``-``, ``.`` and ``/`` become ``_``)."""
    text = re.sub(r"\W", "_", name)
    if not text or text[0].isdigit() or keyword.iskeyword(text):
        text = "_" + text
    return text


def function(spec):
    """A plain function that calls the tool ``spec`` describes."""
    name = spec["name"]
    schema = spec.get("input_schema")
    schema = schema if isinstance(schema, dict) else {}  # a server's word: checked
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    params, lines = [], []
    usable = [p for p in properties if isinstance(p, str) and p.isidentifier()]
    usable = [p for p in usable if not keyword.iskeyword(p)]
    for prop in sorted(usable, key=lambda p: p not in required):
        info = properties[prop] if isinstance(properties[prop], dict) else {}
        kind = _TYPES.get(info.get("type"), "") if isinstance(info.get("type"), str) else ""
        if prop in required:
            params.append(inspect.Parameter(prop, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        else:
            default = info.get("default")
            params.append(inspect.Parameter(prop, inspect.Parameter.KEYWORD_ONLY, default=default))
        about = info.get("description") or info.get("title") or ""
        lines.append(f"    {prop}{f' ({kind})' if kind else ''}: {about}".rstrip(": "))
    signature = inspect.Signature(params)

    def tool(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        return call(name, **bound.arguments)

    tool.__name__ = tool.__qualname__ = python_name(name)
    tool.__signature__ = signature
    doc = str(spec.get("description") or name)
    tool.__doc__ = doc + ("\n\nArgs:\n" + "\n".join(lines) if lines else "")
    tool.tool_name = name
    return tool


def __getattr__(attribute):
    """A tool of the session, made on first use (the gateway lists the tools of now)."""
    if attribute.startswith("_"):  # probes (IPython's, pytest's) ask the socket nothing
        raise AttributeError(attribute)
    for spec in tools():
        if python_name(spec["name"]) == attribute:
            return function(spec)
    raise AttributeError(f"this session has no tool named {attribute!r}")


def __dir__():
    try:
        names = [python_name(spec["name"]) for spec in tools()]
    except ToolError:
        names = []
    return sorted({*__all__, *names})
