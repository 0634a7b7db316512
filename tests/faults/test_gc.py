"""``sbx gc`` finds and removes real leftovers, and nothing a gateway still needs.

The leftovers are made for real on the tests' own engine: a kernel container
of a stopped gateway that no session accounts for, and a session of a data
directory deleted under it (its container, and its workspace's loop mount,
which outlives ``rm -rf``). A session a stopped gateway kept, and a running
gateway's warm pool, which no store knows of, must survive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from helpers import GatewayProcess, gateway_id, remove_leftovers, run, wait_for

from gateway.sandbox import volume

pytestmark = [pytest.mark.docker, pytest.mark.faults]


def sbx_gc(engine, *args: str) -> str:
    """Run ``sbx gc`` against the test engine; its output, after checking it went well."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "gc", *args],
        capture_output=True, text=True, timeout=120, env={**env, "DOCKER_HOST": engine.host},
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, (
        f"sbx gc {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def kernel_like_container(engine, image: str, data_dir: Path, gid: str, sid: str) -> str:
    """A container labelled and mounted as a gateway's kernel container would be."""
    run_dir = data_dir / "sessions" / sid / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return engine.docker(
        "run", "-d", "--network", "none", "--entrypoint", "sleep",
        "--label", f"sbx.gateway={gid}", "--label", f"sbx.session={sid}",
        "-v", f"{run_dir}:/run/sbx", image, "600",
    ).strip()  # fmt: skip


def test_gc_removes_orphans_and_nothing_else(own_engine, python_image):
    root = Path(tempfile.mkdtemp(prefix="sbxg-"))
    kept_dir, gone_dir = root / "a", root / "b"
    env = {"DOCKER_HOST": own_engine.host}
    gateways: list[GatewayProcess] = []
    try:
        # A gateway stops and keeps its session running, as it does by default.
        gw = GatewayProcess(kept_dir, "--pool", "", env=env)
        gateways.append(gw)
        kept = gw.client.post("/v1/sessions", json={}).json()["id"]
        assert run(gw.client, kept, "x = 7")["status"] == "ok"
        gw.stop()
        gid = gateway_id(kept_dir)
        assert gid
        stray = kernel_like_container(own_engine, python_image, kept_dir, gid, str(uuid.uuid4()))
        lost = str(uuid.uuid4())
        lost_dir = gone_dir / "sessions" / lost
        volume.create(lost_dir, 8 * 2**20, 1000, 1000)
        lost_container = kernel_like_container(own_engine, python_image, gone_dir, "0" * 12, lost)
        lost_server = own_engine.docker(
            "run", "-d", "--network", "none", "--entrypoint", "sleep",
            "--name", f"sbxtool-{lost}-notes-0a1b2c3d",
            "--label", f"sbx.gateway={'0' * 12}", "--label", f"sbx.tool-server={lost}",
            "--label", f"sbx.run-dir={lost_dir / 'run'}", python_image, "600",
        ).strip()  # a stdio tool server's, labelled as the gateway labels them  # fmt: skip
        # An operator deletes the data dir: rm fails at the mount point and leaves it mounted.
        subprocess.run(["rm", "-rf", str(gone_dir)], capture_output=True, check=False)
        assert os.path.ismount(lost_dir / "workspace")

        listed = sbx_gc(own_engine, "--under", str(root))
        for orphan in (stray[:12], lost_container[:12], lost_server[:12], str(lost_dir)):
            assert orphan in listed, f"sbx gc did not list {orphan}:\n{listed}"
        assert kept not in listed, f"sbx gc listed a session its gateway kept:\n{listed}"
        assert "--yes" in listed and os.path.ismount(lost_dir / "workspace"), "a dry run acts"

        sbx_gc(own_engine, "--yes", "--under", str(root))
        left = set(own_engine.docker("ps", "-aq", "--no-trunc").split())
        assert not {stray, lost_container, lost_server} & left, "orphan containers survived"
        assert not os.path.ismount(lost_dir / "workspace"), "the orphan loop mount survived"
        assert not gone_dir.exists(), "the deleted data dir's remains survived"
        assert (kept_dir / "sessions" / kept).is_dir() and len(left) == 1

        # A running gateway: its reattached session and its warm pool (in no store) stay.
        gw = GatewayProcess(kept_dir, "--pool", "python3=1", "--end-sessions-on-stop", env=env)
        gateways.append(gw)
        ready = wait_for(lambda: gw.client.get("/healthz").json()["pool_ready"]["python3"], 60)
        assert ready, "the warm pool did not fill"
        pooled = set(own_engine.docker("ps", "-q", "--no-trunc").split())
        assert len(pooled) == 2
        assert "0 orphan(s)" in sbx_gc(own_engine, "--under", str(root))
        sbx_gc(own_engine, "--yes", "--under", str(root))
        assert set(own_engine.docker("ps", "-q", "--no-trunc").split()) == pooled
        assert run(gw.client, kept, "x * 6")["outputs"][0]["data"]["text/plain"] == "42"
    finally:
        for gw in gateways:
            gw.stop()
        with contextlib.closing(own_engine.client()) as engine:
            remove_leftovers(engine, kept_dir)
        for session_dir in gone_dir.glob("sessions/*"):
            volume.destroy(session_dir)
        shutil.rmtree(root, ignore_errors=True)


def test_gc_leaves_alone_a_kept_session_that_resumed_in_a_pooled_container(own_engine):
    data_dir = Path(tempfile.mkdtemp(prefix="sbxg-"))
    env = {"DOCKER_HOST": own_engine.host}
    gw = GatewayProcess(data_dir, "--pool", "python3=1", env=env)
    try:
        pool_ready = lambda: gw.client.get("/healthz").json()["pool_ready"]["python3"]  # noqa: E731
        assert wait_for(pool_ready, 60), "the warm pool did not fill"
        created = gw.client.post("/v1/sessions", json={}).json()
        sid = created["id"]
        assert run(gw.client, sid, "x = 7")["status"] == "ok"
        saved = {"strategy": "namespace"}  # a frozen one would resume in its own container
        assert gw.client.post(f"/v1/sessions/{sid}/pause", json=saved).status_code == 200
        assert wait_for(pool_ready, 60), "the warm pool did not refill"
        resumed = gw.client.post(f"/v1/sessions/{sid}/resume", json={}).json()
        assert resumed["container_id"] != created["container_id"], "not resumed in the pool's"
        gw.stop()  # keeps the session; its container still bears the pooled id in its label
        listed = sbx_gc(own_engine, "--under", str(data_dir))
        assert resumed["container_id"][:12] not in listed, f"gc lists a kept session:\n{listed}"
        assert "0 orphan(s)" in listed, listed
    finally:
        gw.stop()
        with contextlib.closing(own_engine.client()) as engine:
            remove_leftovers(engine, data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
