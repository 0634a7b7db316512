"""How a named volume is bound into a session's container, with and without loop mounts.

With loop mounts a reader binds the volume's read-only, nosuid, nodev view
plainly (the runtime's read-only bind would drop nosuid and nodev). Without
them (a gateway not run as root) that "view" is the volume's writable
directory itself, so the runtime's read-only bind is all that keeps a reader
from writing: it must be asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.limits import Limits
from gateway.sandbox import volume
from gateway.sandbox.base import VolumeMount
from gateway.sandbox.docker.provisioner import SandboxSpec


def _binds(tmp_path: Path) -> dict[str, bool]:
    spec = SandboxSpec(
        docker=None,  # type: ignore[arg-type]  # run_kwargs asks the engine nothing
        image="sbx/python",
        session_id="s1",
        gateway_id="g1",
        limits=Limits(2**30, 1.0, 256, 2**30, 60.0, 2**20),
        env={},
        run_dir=tmp_path / "run",
        workspace=tmp_path / "workspace",
        tmp_bytes=2**20,
        max_message=0,
        volumes=(
            VolumeMount("v1", "ds", str(tmp_path / "v1" / "workspace"), "in", read_only=True),
            VolumeMount("v2", "out", str(tmp_path / "v2" / "workspace"), "out"),
        ),
    )
    mounts = spec.run_kwargs(["python"], {})["mounts"]
    return {m["Target"]: m.get("ReadOnly", False) for m in mounts if m["Target"].count("/") > 1}


@pytest.mark.parametrize("loops", [False, True])
def test_a_reader_never_binds_a_writable_directory(tmp_path, monkeypatch, loops):
    monkeypatch.setattr(volume, "loop_mounts_available", lambda: loops)
    binds = _binds(tmp_path)
    assert binds["/workspace/in"] is (not loops)  # else its source is the read-only view
    assert binds["/workspace/out"] is False
