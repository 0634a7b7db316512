"""The store's parts: the protocol both backends satisfy, its imports, its dialects' SQL."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import pytest

from gateway.execution.outputs import OutputCollector
from gateway.store.base import Store
from gateway.store.database import format_placeholders
from gateway.store.executions import replay_outputs
from gateway.store.postgres import PostgresStore
from gateway.store.sqlite import SQLiteStore

STORE = Path(__file__).resolve().parents[3] / "gateway" / "store"


def backends(tmp_path: Path) -> list:
    """Both backends, built (not opened: no server is needed to build one)."""
    return [
        SQLiteStore(tmp_path / "db.sqlite3"),
        PostgresStore("postgresql:///nowhere", tmp_path / "pg"),
    ]


def test_both_backends_satisfy_the_store_protocol_method_for_method(tmp_path):
    members = [
        name
        for name, value in vars(Store).items()
        if inspect.isfunction(value) and not name.startswith("_")
    ]
    assert len(members) > 30

    async def check() -> None:
        for store in backends(tmp_path):
            assert isinstance(store, Store)
            for name in members:
                wanted = inspect.signature(getattr(Store, name))
                got = inspect.signature(getattr(store, name))
                assert list(got.parameters.values()) == list(wanted.parameters.values())[1:], (
                    f"{type(store).__name__}.{name}{got} is not the protocol's {name}{wanted}"
                )
                assert got.return_annotation == wanted.return_annotation, name
                assert inspect.iscoroutinefunction(getattr(store, name)) == (
                    inspect.iscoroutinefunction(getattr(Store, name))
                ), name
            assert store.down is None
            await store.close()  # never opened: ends its threads

    asyncio.run(check())


def test_the_store_imports_nothing_from_the_rooms_above_it():
    """Not execution, sandbox or sessions (nor anything else above), at any level of a module."""
    allowed = {"gateway.errors", "gateway.timestamps", "gateway.tasks"}
    statement = re.compile(r"^\s*(?:from\s+(\.*)([\w.]*)\s+import|import\s+([\w.]+))", re.M)
    for path in STORE.glob("*.py"):
        for dots, module, imported in statement.findall(path.read_text()):
            base = {"": "", ".": "gateway.store.", "..": "gateway."}[dots]
            name = base + (module or imported) if dots or module else imported
            if name.startswith("gateway") and not name.startswith("gateway.store"):
                assert name in allowed, f"{path.name} imports {name}"


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ("SELECT a FROM t WHERE b = ? AND c > ?", "SELECT a FROM t WHERE b = %s AND c > %s"),
        ("SELECT '?' FROM t WHERE b = ?", "SELECT '?' FROM t WHERE b = %s"),
        ("SELECT a WHERE b LIKE 'x%' AND c = ?", "SELECT a WHERE b LIKE 'x%%' AND c = %s"),
    ],
)  # fmt: skip
def test_postgres_statements_take_psycopg_placeholders_outside_quoted_text(written, sent):
    assert format_placeholders(written) == sent


def test_outputs_replayed_from_the_record_are_the_outputs_the_collector_kept():
    """What the recorder stored as an execution ran rebuilds what its collector finished with."""
    recorded: list = []
    collector = OutputCollector(cap_bytes=1 << 20, listener=recorded.append)

    def message(kind: str, **content) -> dict:
        return {"header": {"msg_type": kind}, "content": content}

    for msg in (
        message("stream", name="stdout", text="gone"),
        message("clear_output", wait=False),
        message("stream", name="stdout", text="a"),
        message("stream", name="stdout", text="b"),
        message("stream", name="stderr", text="c"),
        message("display_data", data={"text/plain": "d"}, metadata={}),
        message("stream", name="stderr", text="e"),
        message("stream", name="stderr", text="f"),
    ):
        collector.add_message(msg)
    kept = collector.finish()
    assert replay_outputs(recorded) == kept
    assert [o.get("text") for o in kept] == ["ab", "c", None, "ef"]
    assert replay_outputs([*recorded, None]) == []
