"""A preview asked for while its sandbox stops: a 409 saying so, never a 500."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import docker.errors
import pytest

from gateway.errors import Conflict
from gateway.limits import Limits
from gateway.sandbox.preview import PreviewCaps
from gateway.sessions.model import Session
from gateway.sessions.previews import Previews


class StoppedEngine:
    """A placement whose container stopped: ``docker exec`` answers 409 (schemathesis found the
    500 this made, asking for a session's ports while it was being deleted)."""

    async def start_process(self, *args, **kwargs):
        raise docker.errors.APIError("409 Client Error: Conflict (container is not running)")


def test_a_forwarder_that_cannot_start_in_a_stopped_sandbox_is_a_409(tmp_path: Path):
    async def scenario():
        previews = Previews(StoppedEngine(), PreviewCaps())  # type: ignore[arg-type]
        session = Session(
            "python3", "img", Limits(2**30, 1.0, 256, 2**30, 30.0, 2**20), 60, 60, {}, {}
        )
        session.state = "idle"
        session.kernel = types.SimpleNamespace(  # type: ignore[assignment]
            container_id="c0ffee", sandbox=types.SimpleNamespace(run_dir=tmp_path)
        )
        with pytest.raises(Conflict, match="sandbox is not running"):
            await previews.ports(session)
        previews.stop()

    asyncio.run(scenario())
