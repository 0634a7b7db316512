"""A crashed kernel's checkpoint, against a hostile sandbox: what a comeback replays, how big."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.errors import StateNotSaved
from gateway.sessions.state import _EXCHANGED, KernelState
from gateway.store.base import HistoryPage


class Kernel:
    """Runs nothing: records each cell it is given; ``evaluate`` runs ``write`` (a dump)."""

    def __init__(self, write=None) -> None:
        self.ran: list[str] = []
        self.write = write

    async def execute(self, code, **kw):
        self.ran.append(code)
        return SimpleNamespace(outputs=[], status="ok")

    async def evaluate(self, code, expression, timeout):
        self.write()
        return repr('{"lost": [], "execution_count": 3}')


def kernel_state(tmp_path: Path, rows: list[dict]) -> KernelState:
    placement = SimpleNamespace(
        session_dir=lambda sid: tmp_path, kernel_exchange=lambda sid: ("/run/sbx", tmp_path / "run")
    )

    async def history(session_id, after, limit):
        return HistoryPage(rows, None)

    store = SimpleNamespace(history=history)
    return KernelState(SimpleNamespace(placement=placement), store, lambda a, b: "", 1.0)  # type: ignore[arg-type]


def session(kernel: Kernel) -> SimpleNamespace:
    limits = SimpleNamespace(timeout=10.0, output_bytes=1000)
    return SimpleNamespace(id="s", kernel=kernel, limits=limits, masker=None, executions=3)


def row(code: str, count: int | None, kind: str = "cell", status: str = "ok") -> dict:
    return {"code": code, "execution_count": count, "status": status, "outputs": [],
            "review": {"kind": kind}}  # fmt: skip


def test_a_comeback_by_replay_runs_only_the_executions_its_checkpoint_covers(tmp_path):
    # The session counts every execution (a command, a denied cell); its kernel numbers only
    # the cells it ran. The checkpoint covers the session's first three executions.
    rows = [
        row("ls", None, kind="command"),
        row("pip list", None, kind="command"),
        row("x = 1", 1),
        row("open('log', 'a').write('charged')", 2),  # lost: after the checkpoint
        row("import os; os._exit(1)", 3, status="dead"),  # the cell that killed the kernel
    ]
    kernel = Kernel()
    asyncio.run(kernel_state(tmp_path, rows)._replay(session(kernel), 3))  # type: ignore[arg-type]
    assert kernel.ran == ["x = 1"], f"cells past the checkpoint ran again: {kernel.ran}"


def test_a_checkpoint_the_sandbox_grew_past_its_bound_is_refused_on_the_host(tmp_path):
    # Code in the namespace (a __reduce__) can lift the in-kernel cap (gc finds the writer)
    # or write to the dump's file itself: the gateway must not trust the kernel for the bound.
    (tmp_path / "run").mkdir()
    big = lambda: (tmp_path / "run" / _EXCHANGED).write_bytes(b"x" * 5000)  # noqa: E731
    state = kernel_state(tmp_path, [])
    target = tmp_path / "checkpoint.new"
    with pytest.raises(StateNotSaved, match="larger than 1000"):
        asyncio.run(state.save(session(Kernel(big)), "namespace", 5.0, target, 1000))  # type: ignore[arg-type]
    assert not target.exists(), "the oversized checkpoint was kept on the host's disk"
