"""A code context's kernel is a process exec'd in the session's container: what the engine
says when that container is gone or stopped reaches the client as the session's state."""

from __future__ import annotations

import asyncio
import types

import docker.errors
import pytest

from gateway.errors import Conflict
from gateway.sandbox.docker import contexts


def _launch(monkeypatch, error: Exception) -> None:
    async def refused(*args, **kwargs):
        raise error

    monkeypatch.setattr(contexts.DockerProcess, "start", refused)
    provisioner = contexts.ContextProvisioner.__new__(contexts.ContextProvisioner)
    spec = types.SimpleNamespace(leftover=False, docker=None, container_id="c0ffee", cwd=None)
    asyncio.run(provisioner.launch_kernel(["ipykernel"], sandbox=spec, env={}))


def test_a_context_started_in_a_container_that_stopped_is_a_409_saying_so(monkeypatch):
    """schemathesis restarted a context as its session's container was killed (137): the
    engine's 500 'is not running' came back as a 503 'the container engine refused'."""
    stopped = docker.errors.APIError(
        "500 Server Error for http+docker://localhost/v1.41/exec/x/start",
        explanation="Container c0ffee is not running: Exited (137) Less than a second ago",
    )
    with pytest.raises(Conflict, match="not running"):
        _launch(monkeypatch, stopped)


def test_a_context_started_in_a_container_that_is_gone_is_a_409(monkeypatch):
    with pytest.raises(Conflict, match="gone"):
        _launch(monkeypatch, docker.errors.NotFound("No such container: c0ffee"))
