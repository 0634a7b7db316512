"""What a session is given as tools, read strictly from a client's JSON, and what a tool is.

A client sends::

    {"mcp": [{"url": "https://mcp.example/mcp", "name": "warehouse",
              "headers": {"Authorization": {"secret": "WAREHOUSE_TOKEN", "prefix": "Bearer "}}}],
     "rules": {"drop_orders": "deny", "post_result": {"action": "hold", "approval_covers": 100}},
     "limits": {"calls_per_execute": 200, "result_bytes": 1048576, "call_timeout": 30}}

A header's value is a literal or one of the tenant's sealed secrets (``secret``,
with an optional ``prefix``); only header names are ever shown back. A tool's
action is its rule, else what its annotations say (``default_action``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..errors import BadRequest

ACTIONS = ("allow", "hold", "deny")
MAX_SERVERS = 8
MAX_STDIO = 4  # stdio servers per session: each is a container of its own
MAX_ARGS = 64
MAX_ARGV_BYTES = 64 * 1024  # a whole stdio command, a script given with -c included
MAX_ENV = 32
MAX_HEADERS = 16
MAX_RULES = 256
MAX_URL = 2048
MAX_COVERS = 10_000
_HEADER = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}")
_VALUE = re.compile(r"[\t\x20-\x7e]{0,4096}")
_SECRET = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
TOOL_NAME = r"[A-Za-z0-9_.\-]{1,128}"  # MCP's tool-name characters: what a call can carry
_TOOL = re.compile(TOOL_NAME)
_LABEL = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}(:[0-9]{1,9})?")  # a kernel, a template[:n]


@dataclasses.dataclass(frozen=True)
class Header:
    """One header sent to an MCP server: a literal, or ``prefix`` + a sealed secret's value."""

    name: str
    value: str = ""
    secret: str | None = None
    prefix: str = ""

    def resolve(self, secrets: Mapping[str, str]) -> str:
        return self.prefix + secrets[self.secret] if self.secret else self.value


@dataclasses.dataclass(frozen=True)
class McpServer:
    """A streamable-HTTP MCP server the gateway connects to for a session."""

    url: str
    name: str
    headers: tuple[Header, ...] = ()

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(h.secret for h in self.headers if h.secret)

    def to_json(self) -> dict[str, Any]:
        """As shown back: header names only (a literal may be a credential too)."""
        return {"name": self.name, "url": self.url, "headers": [h.name for h in self.headers]}


@dataclasses.dataclass(frozen=True)
class StdioServer:
    """An MCP server the gateway starts in a sandbox of its own and speaks to over its stdio.

    ``image`` names a kernel (its image) and ``template`` one of the tenant's
    templates; neither: the Python kernel's image. ``command`` is an argv, never
    a shell string; ``env`` values are literals (only their names are shown back).
    """

    name: str
    command: tuple[str, ...]
    image: str | None = None
    template: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "command": list(self.command), "image": self.image,
                "template": self.template, "env": [k for k, _ in self.env]}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rule:
    """A tool's action, and how many calls one approval of it covers within an execute."""

    action: str
    approval_covers: int = 1


@dataclasses.dataclass(frozen=True)
class CallLimits:
    """Bounds on a session's tool calls (the server's maxima bound what a session asks)."""

    calls_per_execute: int = 1000
    result_bytes: int = 1 << 20
    call_timeout: float = 60.0
    concurrent: int = 8  # calls running at once per session; more wait their turn

    def within(self, ceiling: CallLimits) -> CallLimits:
        return CallLimits(
            min(self.calls_per_execute, ceiling.calls_per_execute),
            min(self.result_bytes, ceiling.result_bytes),
            min(self.call_timeout, ceiling.call_timeout),
            min(self.concurrent, ceiling.concurrent),
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ToolsConfig:
    """Everything a session was given as tools (``tools`` at create, ``PUT .../tools``)."""

    mcp: tuple[McpServer, ...] = ()
    stdio: tuple[StdioServer, ...] = ()
    rules: Mapping[str, Rule] = dataclasses.field(default_factory=dict)
    limits: CallLimits | None = None  # None: the server's defaults
    sent: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # as the client wrote it

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for server in self.mcp for s in server.secrets))


@dataclasses.dataclass(frozen=True)
class Tool:
    """One tool as an MCP server lists it, and the action its calls get."""

    name: str
    server: str
    description: str
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any]
    rule: Rule

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server": self.server,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": self.annotations,
            "action": self.rule.action,
            "approval_covers": self.rule.approval_covers,
        }


def default_action(annotations: Mapping[str, Any]) -> str:
    """MCP's annotations as an action: read-only or non-destructive allowed, the rest held.

    MCP's own default for a tool that is not read-only is destructive, so a
    tool that says nothing is held.
    """
    if annotations.get("readOnlyHint") is True or annotations.get("destructiveHint") is False:
        return "allow"
    return "hold"


def parse_tools(value: Any) -> ToolsConfig:
    """A client's ``tools`` object, or a 400 saying what is wrong and what to send."""
    if not isinstance(value, Mapping):
        raise BadRequest('tools must be an object: {"mcp": [{"url": ...}], "rules": {...}}')
    unknown = set(value) - {"mcp", "rules", "limits", "stdio"}
    if unknown:
        raise BadRequest(f"tools takes mcp, stdio, rules and limits, not {sorted(unknown)}")
    servers = value.get("mcp") or []
    if not isinstance(servers, list) or len(servers) > MAX_SERVERS:
        raise BadRequest(f"tools.mcp must be a list of at most {MAX_SERVERS} servers")
    mcp = tuple(_server(entry, n) for n, entry in enumerate(servers))
    stdio_servers = value.get("stdio") or []
    if not isinstance(stdio_servers, list) or len(stdio_servers) > MAX_STDIO:
        raise BadRequest(f"tools.stdio must be a list of at most {MAX_STDIO} servers")
    stdio = tuple(_stdio_server(entry, n) for n, entry in enumerate(stdio_servers))
    names = [s.name for s in (*mcp, *stdio)]
    if len(set(names)) != len(names):
        raise BadRequest("each MCP server needs a name of its own (tools.mcp[].name)")
    if len(names) > MAX_SERVERS:
        raise BadRequest(f"a session is given at most {MAX_SERVERS} MCP servers in all")
    rules, limits = _rules(value.get("rules")), _limits(value.get("limits"))
    return ToolsConfig(mcp, stdio, rules, limits, dict(value))


MAX_CLIENT_TOOLS = 64
MAX_SCHEMA = 16 * 1024  # bytes of one client tool's input schema, as JSON


def parse_client_tools(value: Any) -> tuple[dict[str, Any], ...]:
    """An execute's client tools: ``[{"name", "description", "input_schema"}]``, each a
    function the agent's own process runs when the execute's code calls it."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CLIENT_TOOLS:
        raise BadRequest(f"tools must be a list of at most {MAX_CLIENT_TOOLS} client tools")
    tools = []
    for n, entry in enumerate(value):
        if not isinstance(entry, Mapping) or set(entry) - {"name", "description", "input_schema"}:
            raise BadRequest(f"tools[{n}] is an object of name, description and input_schema")
        name, about = entry.get("name"), entry.get("description", "")
        schema = entry.get("input_schema") or {"type": "object"}
        if not isinstance(name, str) or not _TOOL.fullmatch(name):
            raise BadRequest(f"tools[{n}].name: letters, digits, '_', '.' or '-' (128 at most)")
        if not isinstance(about, str) or len(about) > 4096:
            raise BadRequest(f"tools[{n}].description must be a string of 4096 at most")
        if not isinstance(schema, Mapping) or len(json.dumps(schema)) > MAX_SCHEMA:
            raise BadRequest(f"tools[{n}].input_schema is a JSON schema of {MAX_SCHEMA} bytes")
        tools.append({"name": name, "description": about, "input_schema": dict(schema),
                      "annotations": {}})  # fmt: skip
    if len({t["name"] for t in tools}) != len(tools):
        raise BadRequest("each client tool needs a name of its own")
    return tuple(tools)


def _server(entry: Any, n: int) -> McpServer:
    where = f"tools.mcp[{n}]"
    if not isinstance(entry, Mapping) or set(entry) - {"url", "name", "headers"}:
        raise BadRequest(f"{where} is an object of url, name and headers")
    url = entry.get("url")
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise BadRequest(f"{where}.url must be the server's streamable-HTTP URL")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
        raise BadRequest(f"{where}.url must be an http(s) URL with a host and no user info")
    name = entry.get("name") or parts.hostname
    if not isinstance(name, str) or not _LABEL.fullmatch(name):
        raise BadRequest(f"{where}.name must be letters, digits, '.', '_' or '-' (64 at most)")
    headers = entry.get("headers") or {}
    if not isinstance(headers, Mapping) or len(headers) > MAX_HEADERS:
        raise BadRequest(f"{where}.headers must be an object of at most {MAX_HEADERS} headers")
    return McpServer(url, name, tuple(_header(k, v, where) for k, v in headers.items()))


def _stdio_server(entry: Any, n: int) -> StdioServer:
    where = f"tools.stdio[{n}]"
    if not isinstance(entry, Mapping) or set(entry) - {"name", "command", "image", "template",
                                                       "env"}:  # fmt: skip
        raise BadRequest(f"{where} is an object of name, command, image, template and env")
    name, command = entry.get("name"), entry.get("command")
    if not isinstance(name, str) or not _LABEL.fullmatch(name):
        raise BadRequest(f"{where}.name must be letters, digits, '.', '_' or '-' (64 at most)")
    if (
        not isinstance(command, list)
        or not 1 <= len(command) <= MAX_ARGS
        or not all(isinstance(a, str) and "\0" not in a for a in command)
        or not command[0]
        or sum(len(a.encode()) for a in command) > MAX_ARGV_BYTES
    ):
        raise BadRequest(
            f'{where}.command is an argv like ["python", "server.py"] (no shell string): '
            f"1 to {MAX_ARGS} strings, {MAX_ARGV_BYTES} bytes in all"
        )
    image, template = entry.get("image"), entry.get("template")
    if image is not None and template is not None:
        raise BadRequest(f"{where}: name an image (a kernel's) or a template, not both")
    for key, ref in (("image", image), ("template", template)):
        if ref is not None and (not isinstance(ref, str) or not _REF.fullmatch(ref)):
            raise BadRequest(f"{where}.{key} names a kernel (GET /v1/kernels) or a template")
    env = entry.get("env") or {}
    if not isinstance(env, Mapping) or len(env) > MAX_ENV:
        raise BadRequest(f"{where}.env is an object of at most {MAX_ENV} variables")
    for key, given in env.items():
        if not isinstance(key, str) or not _SECRET.fullmatch(key):
            raise BadRequest(f"{where}.env: {str(key)[:64]!r} is not a variable name")
        if not isinstance(given, str) or not _VALUE.fullmatch(given):
            raise BadRequest(f"{where}.env.{key}: printable ASCII only, 4096 at most")
    return StdioServer(name, tuple(command), image, template, tuple(env.items()))


def _header(name: Any, value: Any, where: str) -> Header:
    if not isinstance(name, str) or not _HEADER.fullmatch(name):
        raise BadRequest(f"{where}.headers: {str(name)[:64]!r} is not a header name")
    if isinstance(value, str):
        if not _VALUE.fullmatch(value):
            raise BadRequest(f"{where}.headers.{name}: printable ASCII only, 4096 at most")
        return Header(name, value)
    if not isinstance(value, Mapping) or set(value) - {"secret", "prefix"}:
        raise BadRequest(
            f'{where}.headers.{name} is a string or {{"secret": NAME, "prefix": "Bearer "}}'
        )
    secret, prefix = value.get("secret"), value.get("prefix", "")
    if not isinstance(secret, str) or not _SECRET.fullmatch(secret):
        raise BadRequest(f"{where}.headers.{name}.secret must name one of the tenant's secrets")
    if not isinstance(prefix, str) or not _VALUE.fullmatch(prefix):
        raise BadRequest(f"{where}.headers.{name}.prefix: printable ASCII only")
    return Header(name, secret=secret, prefix=prefix)


def _rules(value: Any) -> dict[str, Rule]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_RULES:
        raise BadRequest(f"tools.rules is an object of at most {MAX_RULES} tool names")
    rules = {}
    for tool, rule in value.items():
        if not isinstance(tool, str) or not _TOOL.fullmatch(tool):
            raise BadRequest(f"tools.rules: {str(tool)[:64]!r} is not a tool name")
        if isinstance(rule, str):
            rule = {"action": rule}
        if not isinstance(rule, Mapping) or set(rule) - {"action", "approval_covers"}:
            raise BadRequest(f'tools.rules.{tool} is an action or {{"action", "approval_covers"}}')
        action, covers = rule.get("action"), rule.get("approval_covers", 1)
        if action not in ACTIONS:
            raise BadRequest(f"tools.rules.{tool}: the action is one of {', '.join(ACTIONS)}")
        if isinstance(covers, bool) or not isinstance(covers, int) or not 1 <= covers <= MAX_COVERS:
            raise BadRequest(f"tools.rules.{tool}.approval_covers is 1 to {MAX_COVERS} calls")
        rules[tool] = Rule(action, covers)
    return rules


def _limits(value: Any) -> CallLimits | None:
    if value is None:
        return None
    fields = {f.name: f.type for f in dataclasses.fields(CallLimits)}
    if not isinstance(value, Mapping) or set(value) - set(fields):
        raise BadRequest(f"tools.limits is an object of {', '.join(fields)}")
    chosen = {}
    for key, given in value.items():
        number = not isinstance(given, bool) and isinstance(given, int | float)
        whole = key == "call_timeout" or isinstance(given, int)
        if not number or not whole or math.isnan(given) or given <= 0:
            raise BadRequest(f"tools.limits.{key} must be a positive number (whole, but timeouts)")
        chosen[key] = float(given) if key == "call_timeout" else given
    return CallLimits(**chosen)
