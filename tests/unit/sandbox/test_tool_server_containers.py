"""A stdio MCP server's container, as it is asked of the engine (no engine: the create and
the exec are stood in for)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.limits import Limits
from gateway.sandbox.base import Isolation
from gateway.sandbox.docker import tool_servers
from gateway.sandbox.docker.provisioner import SandboxSpec

BIG = Limits(memory=8 << 30, cpus=4.0, pids=4096, disk=1 << 30, timeout=60, output_bytes=1 << 20)


class Made:
    id = "c0ffee"


def started(monkeypatch, limits: Limits) -> dict:
    asked: dict = {}

    def create(client, kwargs):
        asked.update(kwargs)
        return Made()

    async def process(*args, **kwargs):
        asked["argv"] = args[2]
        return object()

    monkeypatch.setattr(tool_servers, "_create_and_start", create)
    monkeypatch.setattr(tool_servers.DockerProcess, "start", process)
    spec = SandboxSpec(
        docker=None, image="sbx/python:latest", session_id="s1", gateway_id="g1", limits=limits,
        env={"SESSION_SECRET": "x"}, run_dir=Path("/nonexistent/run"),
        workspace=Path("/nonexistent/ws"), tmp_bytes=1 << 30, max_message=0,
        isolation=Isolation(network="sbx-egress", env={"HTTPS_PROXY": "http://proxy"}),
        secret_files={"KEY": "v"},
    )  # fmt: skip
    asyncio.run(tool_servers.start_tool_server(spec, "notes", "sbx/notes:1", ["notes"], {}))
    return asked


def test_the_container_is_hardened_with_no_network_mount_or_session_env(monkeypatch):
    asked = started(monkeypatch, BIG)
    assert asked["network_mode"] == "none" and asked["mounts"] == [] and asked["environment"] == {}
    assert asked["read_only"] and asked["cap_drop"] == ["ALL"] and asked["user"] == "1000:1000"
    assert "no-new-privileges" in asked["security_opt"] and asked["image"] == "sbx/notes:1"
    assert asked["labels"] == {
        "sbx.gateway": "g1",
        "sbx.tool-server": "s1",
        "sbx.run-dir": "/nonexistent/run",
    }
    assert asked["argv"] == ["notes"]


def test_each_server_is_bounded_below_its_session_so_four_do_not_take_four_sessions(monkeypatch):
    asked = started(monkeypatch, BIG)
    assert asked["mem_limit"] <= 512 << 20 and asked["memswap_limit"] == asked["mem_limit"]
    assert asked["nano_cpus"] <= 1e9 and asked["pids_limit"] <= 128
    small = Limits(memory=256 << 20, cpus=0.5, pids=64, disk=1, timeout=1, output_bytes=1)
    asked = started(monkeypatch, small)
    assert (
        asked["mem_limit"] == 256 << 20 and asked["nano_cpus"] == 5e8 and asked["pids_limit"] == 64
    )


def test_the_live_reconcile_never_lists_a_servers_container_only_a_start_removes_them(
    monkeypatch, tmp_path
):
    """The suspicion: reconciliation (``Upkeep._reconcile``: sandboxes of the live sessions)
    counting a live session's server container, which carries the gateway's label but no
    session label, as a leftover. It lists by the session label, so never sees one; only
    recovery at start (every container of the gateway) removes them, when no session of
    this process holds one."""
    from gateway.sandbox.docker.placement import DockerPlacement
    from gateway.sandbox.docker.provisioner import LABEL_SESSION

    asked = started(monkeypatch, BIG)
    kernel = {"Id": "k1", "Names": ["/sbx-s1"], "State": "running",
              "Labels": {"sbx.gateway": "g1", LABEL_SESSION: "s1"}}  # fmt: skip
    server = {"Id": "t1", "Names": [f"/{asked['name']}"], "State": "running",
              "Labels": asked["labels"]}  # fmt: skip

    def containers(all: bool, filters: dict) -> list[dict]:  # the engine's label filter
        key, _, value = filters["label"].partition("=")
        return [
            c for c in (kernel, server) if key in c["Labels"] and value in ("", c["Labels"][key])
        ]

    client = type("Client", (), {"api": type("Api", (), {"containers": staticmethod(containers)})})
    placement = DockerPlacement(client, None, tmp_path, 0, 0)  # type: ignore[arg-type]
    live = asyncio.run(placement.sandboxes("g1", ["s1"]))
    assert [s.id for s in live] == ["k1"]
    at_start = asyncio.run(placement.sandboxes("g1"))
    assert {s.id for s in at_start} == {"k1", "t1"}
