"""The MCP server's code-context tools and ``run_code``'s ``context``, on a stand-in gateway.

Each tool is one SDK call on the caller's own client, the same ``/v1`` call the
HTTP API answers: the gateway's tenancy is the only check, so a caller holding
another tenant's token gets that session's 404, never its contexts.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver.exceptions import ToolError

from gateway.client import AsyncClient, AsyncSession, Execution
from gateway.mcp.access import GatewayClients
from gateway.mcp.server import build_server

URL = "http://gateway.test"
OWNER = "acme-token"  # the tenant whose session s1 is
CONTEXT = {"id": "3f9c0a1e", "kernel": "python3", "language": "python",
           "cwd": "/workspace/work", "state": "running", "stopped": None}  # fmt: skip
DEFAULT = {**CONTEXT, "id": "default", "cwd": "/workspace", "default": True}


class Gateway:
    """The contexts API of one session, ``s1``, owned by ``OWNER``'s tenant."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body))
        if request.headers["Authorization"] != f"Bearer {OWNER}" or not request.url.path.startswith(
            "/v1/sessions/s1/"
        ):
            message = "no session 's1': it never existed or was deleted"
            return httpx.Response(
                404, json={"error": {"code": "session_not_found", "message": message}}
            )
        answers = {
            ("GET", "/v1/sessions/s1/contexts"): (200, {"contexts": [DEFAULT, CONTEXT]}),
            ("POST", "/v1/sessions/s1/contexts"): (201, CONTEXT),
            ("POST", "/v1/sessions/s1/contexts/3f9c0a1e/restart"): (200, CONTEXT),
            ("DELETE", "/v1/sessions/s1/contexts/3f9c0a1e"): (204, None),
        }
        status, doc = answers[(request.method, request.url.path)]
        return httpx.Response(status, json=doc) if doc is not None else httpx.Response(status)


def client_of(token: str, gateway: Gateway) -> AsyncClient:
    client = AsyncClient(URL, token)
    client._http = httpx.AsyncClient(
        base_url=URL, headers=client.headers, transport=httpx.MockTransport(gateway)
    )
    return client


def call(gateway: Gateway, token: str, tool: str, arguments: dict[str, Any]) -> Any:
    """Call ``tool`` as an HTTP caller holding ``token`` (each caller: its own client)."""

    async def main() -> Any:
        clients = GatewayClients(URL, None)
        for known in (OWNER, "beta-token"):
            clients._clients[known] = client_of(known, gateway)
        caller = AuthenticatedUser(AccessToken(token=token, client_id="caller", scopes=[]))
        auth_context_var.set(caller)
        try:
            return await build_server(clients, http=True).call_tool(tool, arguments)
        finally:
            await clients.aclose()

    return asyncio.run(main())


def structured(result: Any) -> Any:
    assert not result.is_error, result.content
    return result.structured_content


def test_the_context_tools_call_the_sessions_contexts_api():
    gateway = Gateway()
    listed = structured(call(gateway, OWNER, "list_contexts", {"session_id": "s1"}))
    made = structured(
        call(gateway, OWNER, "create_context",
             {"session_id": "s1", "language": "python", "cwd": "work"})
    )  # fmt: skip
    fresh = structured(
        call(gateway, OWNER, "restart_context", {"session_id": "s1", "context_id": "3f9c0a1e"})
    )
    removed = call(gateway, OWNER, "remove_context", {"session_id": "s1", "context_id": "3f9c0a1e"})
    assert [c["context_id"] for c in listed["contexts"]] == ["default", "3f9c0a1e"]
    assert made["context_id"] == fresh["context_id"] == "3f9c0a1e"
    assert made["language"] == "python" and made["cwd"] == "/workspace/work"
    assert not removed.is_error and "3f9c0a1e" in removed.content[0].text
    assert gateway.seen == [
        ("GET", "/v1/sessions/s1/contexts", None),
        ("POST", "/v1/sessions/s1/contexts", {"language": "python", "cwd": "work"}),
        ("POST", "/v1/sessions/s1/contexts/3f9c0a1e/restart", None),
        ("DELETE", "/v1/sessions/s1/contexts/3f9c0a1e", None),
    ]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("list_contexts", {"session_id": "s1"}),
        ("create_context", {"session_id": "s1"}),
        ("restart_context", {"session_id": "s1", "context_id": "3f9c0a1e"}),
        ("remove_context", {"session_id": "s1", "context_id": "3f9c0a1e"}),
    ],
)
def test_another_tenants_sessions_contexts_are_refused(tool, arguments):
    gateway = Gateway()
    with pytest.raises(ToolError, match=f"{tool}: session_not_found: no session 's1'"):
        call(gateway, "beta-token", tool, arguments)  # the model reads it as an is_error result
    # Asked of the gateway with the caller's own token, which it refused.
    assert len(gateway.seen) == 1


def test_run_code_runs_in_the_context_given(monkeypatch):
    ran: list[Any] = []

    async def run(self, code: str, **options: Any) -> Execution:
        ran.append((self.id, code, options["context"]))
        restarted = "the session was paused to disk" if options["context"] else None
        context = {"id": options["context"], "kernel": "python3", "restarted": restarted}
        return Execution.from_json(
            {"status": "ok", "outputs": [], "context": context if options["context"] else None}
        )

    monkeypatch.setattr(AsyncSession, "run", run)
    gateway = Gateway()
    in_context = structured(
        call(gateway, OWNER, "run_code", {"session_id": "s1", "code": "x", "context": "3f9c0a1e"})
    )
    in_kernel = structured(call(gateway, OWNER, "run_code", {"session_id": "s1", "code": "y"}))
    assert ran == [("s1", "x", "3f9c0a1e"), ("s1", "y", None)]
    assert in_context["context"]["restarted"] == "the session was paused to disk"
    assert "context" not in in_kernel
