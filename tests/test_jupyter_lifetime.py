"""Kernels started through the Jupyter API live while they are used, as JupyterLab expects."""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers import closed, run_over_channels, wait_for
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.docker

# Short, so the test waits seconds, not half a minute: a ttl, and the cap past it.
TTL = 4
MAX_TTL = 12


def _state(api, sid: str) -> dict:
    return api.get(f"/v1/sessions/{sid}").json()


def test_a_used_jupyter_kernel_outlives_its_ttl_up_to_the_max(start_gateway):
    gw = start_gateway(
        "--default-ttl", str(TTL), "--max-ttl", str(MAX_TTL), "--default-idle-timeout", "600",
        "--cull-interval", "0.5",
    )  # fmt: skip
    api = gw.client
    unused = api.post("/api/kernels", json={}).json()["id"]
    plain = api.post("/v1/sessions", json={}).json()["id"]  # a v1 session: ttl from creation
    used = api.post("/api/kernels", json={"name": "python3"}).json()["id"]
    assert _state(api, used)["ttl_from"] == "activity" and _state(api, plain)["ttl_from"] == (
        "created"
    )
    born = time.monotonic()
    url = gw.ws_url(f"/api/kernels/{used}/channels")
    while time.monotonic() - born < TTL + 5:
        # A client that comes, runs a cell and goes, again and again (no connection held).
        asyncio.run(run_over_channels(url, "x = 1"))
        time.sleep(1)
    assert _state(api, used)["state"] == "idle", "a kernel in use must outlive its ttl"
    assert _state(api, unused)["state"] == "deleted"
    assert _state(api, unused)["reason"] == f"ttl expired: no activity for {TTL} s"
    assert _state(api, plain)["reason"] == f"ttl expired after {TTL} s"

    # The operator's cap still ends it, client connected or not, and the client is told.
    async def held_until_closed() -> str | None:
        ws = await websocket_connect(url)
        while await asyncio.wait_for(ws.read_message(), 30) is not None:
            pass
        await closed(ws)  # closed by the server; this lets the client object go too
        return ws.close_reason

    reason = asyncio.run(held_until_closed())
    assert MAX_TTL - 2 < time.monotonic() - born < MAX_TTL + 10
    assert _state(api, used)["reason"] == f"max lifetime of {MAX_TTL} s reached"
    assert reason == f"the kernel's session ended: max lifetime of {MAX_TTL} s reached"


def test_a_connected_jupyter_client_keeps_its_kernel(start_gateway):
    """An open channels WebSocket is activity: neither the idle culler nor the ttl ends it."""
    gw = start_gateway(
        "--default-ttl", "4", "--default-idle-timeout", "3", "--cull-interval", "0.5",
        "--reconnect-grace", "1",
    )  # fmt: skip
    api = gw.client
    kernel_id = api.post("/api/kernels", json={}).json()["id"]

    async def hold() -> str:
        ws = await websocket_connect(gw.ws_url(f"/api/kernels/{kernel_id}/channels"))
        await asyncio.sleep(9)  # a person reading, with JupyterLab open: no messages
        state = await asyncio.to_thread(lambda: _state(api, kernel_id)["state"])
        await closed(ws)
        return state

    assert asyncio.run(hold()) == "idle", "a connected client's kernel was taken for gone"
    assert wait_for(lambda: _state(api, kernel_id)["state"] == "deleted", timeout=10)
    assert _state(api, kernel_id)["reason"] in ("idle for 3 s", "ttl expired: no activity for 4 s")
