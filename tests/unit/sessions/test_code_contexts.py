"""Code contexts: more kernels in one session, each a namespace, every execute through the pipeline.

Built on test_manager's local placement (kernels as local processes), with one
more hook: a context's kernel is another local process, its sockets under a
prefix of its own in the session's run directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from unit.sessions.test_manager import (
    WHO,
    LocalKernelProvisioner,
    LocalPlacement,
    build,
    local_kernels,
    started,
    stopped,
)

from gateway.access.auth import Principal
from gateway.app import build_domain
from gateway.errors import (
    BadRequest,
    Conflict,
    KernelStartFailed,
    NotFound,
    SessionNotFound,
    TooManyContexts,
)
from gateway.execution.recorder import ran_in_kernel
from gateway.sessions.contexts import working_dir
from gateway.sessions.model import Session
from gateway.sessions.requests import CreateSession, ExecuteCode

OTHER = Principal(tenant="other", token_id="t2")


class LocalContextSpec:
    """A context's kernel as one more local process beside the session's."""

    def __init__(self, spec: Any, context_id: str, started: list) -> None:
        self.session_id = spec.session_id
        self.run_dir = spec.run_dir
        self.prefix = f"c-{context_id}"
        self.started = started

    def provisioner_class(self, **kwargs: Any) -> Any:
        provisioner = LocalKernelProvisioner(**kwargs)
        self.started.append((self.session_id, provisioner))
        return provisioner

    def manager_options(self) -> dict[str, Any]:
        return {
            "transport": "ipc",
            "ip": str(self.run_dir / self.prefix),
            "connection_file": str(self.run_dir / f"{self.prefix}.json"),
        }


class ContextPlacement(LocalPlacement):
    def __init__(self, placement: LocalPlacement) -> None:
        self.__dict__.update(placement.__dict__)
        self.contexts: list[str] = []
        self.leftovers: list[bool] = []
        self.exits: list[Any] = []  # each context kernel's on_exit, to say it stopped
        self.started: list[tuple[str, Any]] = []  # (session, provisioner) of context kernels

    def context_sandbox(
        self, spec, container_id, context_id, cwd, on_exit, leftover
    ) -> LocalContextSpec:
        assert container_id.startswith("local-")
        self.contexts.append(context_id)
        self.leftovers.append(leftover)
        self.exits.append(on_exit)
        return LocalContextSpec(spec, context_id, self.started)

    async def remove(self, session_id: str) -> None:
        """As a container's removal ends every process in it."""
        await super().remove(session_id)
        for owner, provisioner in self.started:
            if owner == session_id and provisioner.process is not None:
                await provisioner.kill()
                await provisioner.wait()


def two_kernels(tmp_path: Path) -> Path:
    """python3, and a second kernelspec of the same image (as xpython is of the python one)."""
    kernels = local_kernels(tmp_path)
    other = kernels / "python3b"
    other.mkdir()
    doc = json.loads((kernels / "python3" / "kernel.json").read_text())
    (other / "kernel.json").write_text(json.dumps({**doc, "display_name": "another"}))
    lonely = kernels / "lonely"  # a kernel of another image: not in this session's
    lonely.mkdir()
    argv = [sys.executable, "-c", "pass"]
    (lonely / "kernel.json").write_text(
        json.dumps(
            {
                "argv": argv,
                "display_name": "R",
                "language": "R",
                "metadata": {"sandbox": {"image": "r"}},
            }
        )
    )
    return kernels


def run(tmp_path: Path, scenario) -> None:
    async def main() -> None:
        manager, placement, store = build(tmp_path, two_kernels(tmp_path))
        manager.lifecycle.placement = ContextPlacement(placement)
        await started(manager, store)
        try:
            await scenario(manager, build_domain(manager.settings, manager).executions)
        finally:
            await stopped(manager, store)

    asyncio.run(main())


async def value(executions, session: Session, code: str, context: str | None = None) -> str:
    result = await executions.execute(session.id, WHO, ExecuteCode(code, context=context))
    assert result.status == "ok", result
    return result.outputs[0]["data"]["text/plain"] if result.outputs else ""


def test_contexts_are_namespaces_of_their_own_and_their_history_is_apart(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        contexts = manager.contexts
        a = await contexts.create(session)
        b = await contexts.create(session, language="python3b")
        assert (a.kernel_name, b.kernel_name) == ("python3", "python3b")
        await value(executions, session, "x = 'default'")
        await value(executions, session, "x = 'a'", a.id)
        missing = await executions.execute(session.id, WHO, ExecuteCode("x", context=b.id))
        assert missing.status == "error" and missing.error["ename"] == "NameError"
        assert missing.context == {"id": b.id, "kernel": "python3b", "restarted": None}
        assert await value(executions, session, "x") == "'default'"
        assert await value(executions, session, "x", a.id) == "'a'"
        assert [c["id"] for c in contexts.views(session)] == ["default", a.id, b.id]
        history = (await manager.store.history(session.id)).executions
        assert [h["review"].get("context") for h in history] == [None, a.id, b.id, None, a.id]
        # A replay of the session's own kernel runs its own cells only.
        assert [ran_in_kernel(h) for h in history] == [True, False, False, True, False]
        assert session.to_json()["contexts"][0]["executions"] == 2

        # A restart empties one context; a removed one is gone; the session's kernel stays.
        await contexts.restart(session, a.id)
        gone = await executions.execute(session.id, WHO, ExecuteCode("x", context=a.id))
        assert gone.error["ename"] == "NameError"
        await contexts.remove(session, b.id)
        with pytest.raises(NotFound):
            await executions.execute(session.id, WHO, ExecuteCode("1", context=b.id))
        assert await value(executions, session, "x") == "'default'"
        kernel = a.kernel
        await manager.delete(session.id, WHO)
        assert a.kernel is None and not kernel.connected
        assert not await kernel.manager.is_alive()  # it ended with the sandbox

    run(tmp_path, scenario)


def test_a_context_is_of_a_kernel_the_image_holds_and_a_session_holds_a_few(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        contexts = manager.contexts
        assert contexts.offered(session) == {"python3": "python", "python3b": "python"}
        assert contexts.choose(session, None, "Python") == "python3"
        with pytest.raises(BadRequest, match=r"holds no language 'r'.*python \(python3\)"):
            await contexts.create(session, language="R")
        with pytest.raises(BadRequest, match="holds no kernel 'lonely'"):
            await contexts.create(session, kernel="lonely")
        contexts.limit = 2
        made = await asyncio.gather(
            *(contexts.create(session) for _ in range(4)), return_exceptions=True
        )
        assert sum(isinstance(m, TooManyContexts) for m in made) == 2, made
        assert len(session.contexts) == 2
        assert sorted(placement_made(manager)) == sorted(session.contexts)

    run(tmp_path, scenario)


def test_each_kernel_of_a_session_keeps_a_share_of_its_memory(tmp_path):
    """A context past what the session's memory holds is refused, not started to be killed."""

    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        session.limits = dataclasses.replace(session.limits, memory=256 * 2**20)
        for _ in range(3):  # four kernels of 64 MiB each
            await manager.contexts.create(session)
        with pytest.raises(TooManyContexts, match="256 MiB of memory holds 4 kernels"):
            await manager.contexts.create(session)
        assert len(session.contexts) == 3

    run(tmp_path, scenario)


def test_a_context_whose_kernel_dies_at_its_start_is_a_409_naming_the_sessions_limits(tmp_path):
    """It ran out of the session's own memory or processes: the caller's to change, no 503."""

    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)

        async def dies(tenant, start):
            raise KernelStartFailed("the kernel did not start (it stopped before it answered)")

        manager.contexts.starts = SimpleNamespace(run=dies)
        with pytest.raises(Conflict, match=r"limits .* may not hold another kernel") as refused:
            await manager.contexts.create(session)
        assert refused.value.status == 409 and not session.contexts

    run(tmp_path, scenario)


def placement_made(manager) -> list[str]:
    return manager.lifecycle.placement.contexts


def test_a_context_id_names_a_context_of_that_session_only(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        mine = await manager.contexts.create(session)
        for wrong in ("../" + mine.id, mine.id + "/..", "x" * 10_000, "\0"):
            with pytest.raises(NotFound):
                await executions.execute(session.id, WHO, ExecuteCode("1", context=wrong))
        with pytest.raises(SessionNotFound):  # another tenant's session, with a real context id
            await executions.execute(session.id, OTHER, ExecuteCode("1", context=mine.id))
        other = await manager.create(CreateSession(), WHO)
        with pytest.raises(NotFound):  # a context of another session of the same tenant
            await executions.execute(other.id, WHO, ExecuteCode("1", context=mine.id))

    run(tmp_path, scenario)


def test_a_session_restart_leaves_its_contexts_to_start_empty_saying_why(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        a = await manager.contexts.create(session)
        await value(executions, session, "y = 1", a.id)
        await manager.mark_dead(session, "out of memory: limit 512 MiB")
        assert a.kernel is None and "died (out of memory" in a.stopped
        await manager.restart(session.id, WHO)
        result = await executions.execute(session.id, WHO, ExecuteCode("y", context=a.id))
        assert result.error["ename"] == "NameError"
        assert "died (out of memory" in result.context["restarted"]
        assert session.to_json()["contexts"][0]["restarted"] == result.context["restarted"]

        # After a gateway restart, a context is defined again, stopped, and says why.
        again = Session.from_record(json.loads(json.dumps(session.record())))
        (back,) = again.contexts.values()
        assert (back.id, back.kernel_name, back.cwd) == (a.id, "python3", "")
        assert "gateway restarted" in back.stopped and back.leftover

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("cwd", "relative"),
    [
        (None, ""),
        ("/home/user", ""),
        ("/home/user/data", "data"),
        ("/workspace/a/./b/", "a/b"),
        ("sub", "sub"),
    ],
)
def test_a_context_works_in_a_directory_of_the_workspace(cwd, relative):
    assert working_dir(cwd) == relative


@pytest.mark.parametrize("cwd", ["/etc", "/home/user/../..", "a/../../b", "/workspace2", 7])
def test_a_context_cannot_work_outside_the_workspace(cwd):
    with pytest.raises(BadRequest):
        working_dir(cwd)


def test_a_context_started_while_its_session_ends_is_stopped_not_left(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        creating = asyncio.ensure_future(manager.contexts.create(session))
        await asyncio.sleep(0.05)  # its kernel is starting
        await manager.delete(session.id, WHO)
        with pytest.raises(Exception):  # noqa: B017 (ended meanwhile: whichever error says so)
            await creating
        placement = manager.lifecycle.placement
        for _, provisioner in placement.started:
            assert provisioner.process is None or provisioner.process.poll() is not None
        assert not session.contexts

    run(tmp_path, scenario)


def test_a_context_kernel_that_stops_leaves_the_next_one_its_files(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        a = await manager.contexts.create(session)
        await value(executions, session, "x = 1", a.id)
        manager.lifecycle.placement.exits[-1](137)  # as a kill of its process reports it
        assert a.kernel is None and "exited with code 137" in a.stopped
        result = await executions.execute(session.id, WHO, ExecuteCode("x", context=a.id))
        assert result.error["ename"] == "NameError", result  # a fresh kernel answered
        assert "exited with code 137" in result.context["restarted"]
        await asyncio.sleep(0.5)  # the stopped kernel's cleanup has long finished
        assert (
            await executions.execute(session.id, WHO, ExecuteCode("1", context=a.id))
        ).status == "ok"

    run(tmp_path, scenario)


def test_a_context_stopped_by_its_sessions_kernel_restart_at_a_timeout_says_so(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        a = await manager.contexts.create(session)
        session.kernel.restarting = True  # a cell past its timeout and its grace: a new sandbox
        manager.lifecycle.placement.exits[-1](-1)  # the old sandbox's removal ends the exec
        session.kernel.restarting = False
        assert a.stopped == "the session's kernel was restarted in a new sandbox"

    run(tmp_path, scenario)


def test_a_context_removed_while_its_kernel_starts_leaves_no_kernel_running(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        creating = asyncio.ensure_future(manager.contexts.create(session))
        await asyncio.sleep(0.05)  # its kernel is starting
        await manager.contexts.remove(session, next(iter(session.contexts)))
        with pytest.raises(NotFound):
            await creating
        for _, provisioner in manager.lifecycle.placement.started:
            assert provisioner.process is None or provisioner.process.poll() is not None
        assert not session.contexts

    run(tmp_path, scenario)


def test_a_context_removed_while_its_kernel_restarts_leaves_no_kernel_running(tmp_path):
    async def scenario(manager, executions) -> None:
        session = await manager.create(CreateSession(), WHO)
        a = await manager.contexts.create(session)
        restarting = asyncio.ensure_future(manager.contexts.restart(session, a.id))
        await asyncio.sleep(0.05)  # its new kernel is starting
        await manager.contexts.remove(session, a.id)
        with pytest.raises(NotFound):
            await restarting
        for _, provisioner in manager.lifecycle.placement.started:
            assert provisioner.process is None or provisioner.process.poll() is not None

    run(tmp_path, scenario)
