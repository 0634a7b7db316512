"""The engine's pause and unpause as a pause's first tier: each is safe to repeat.

A gateway killed between the engine's thaw and the record saying so finds a
frozen record over a running container; the resume's unpause of it answered
409 "is not paused", and the session was marked dead with its state.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import docker.errors
import pytest

from gateway.sandbox.docker.placement import DockerPlacement


def refusing(status: int, said: str, error: type = docker.errors.APIError):
    def call(sandbox_id: str) -> None:
        raise error(said, SimpleNamespace(status_code=status, url="/x", reason=""), said)

    return call


def placement(tmp_path: Path, **api) -> DockerPlacement:
    client = SimpleNamespace(api=SimpleNamespace(**api))
    return DockerPlacement(client, None, tmp_path, 0, 0)  # type: ignore[arg-type]


def inspected(running: bool):
    return lambda sandbox_id: {"State": {"Running": running, "Paused": False}}


def test_a_thaw_or_freeze_of_a_sandbox_already_so_is_no_error(tmp_path):
    p = placement(
        tmp_path,
        unpause=refusing(409, "Container c is not paused"),
        pause=refusing(409, "Container c is already paused"),
        inspect_container=inspected(running=True),
    )
    asyncio.run(p.thaw("c"))
    asyncio.run(p.freeze("c"))


def test_a_thaw_of_a_sandbox_that_stopped_meanwhile_is_an_error(tmp_path):
    """Not paused because it exited (stopped from outside while frozen): it is gone."""
    p = placement(
        tmp_path,
        unpause=refusing(409, "Container c is not paused"),
        inspect_container=inspected(running=False),
    )
    with pytest.raises(docker.errors.APIError, match="not paused"):
        asyncio.run(p.thaw("c"))


def test_a_thaw_or_freeze_the_engine_refuses_otherwise_is_raised(tmp_path):
    p = placement(
        tmp_path,
        unpause=refusing(404, "No such container: c", docker.errors.NotFound),
        pause=refusing(409, "Container c is not running"),
    )
    with pytest.raises(docker.errors.NotFound):
        asyncio.run(p.thaw("c"))
    with pytest.raises(docker.errors.APIError, match="not running"):
        asyncio.run(p.freeze("c"))
