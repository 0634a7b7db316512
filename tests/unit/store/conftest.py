"""The store the unit tier's store tests run on: SQLite, in a file of the test's own.

tests/test_store_postgres.py runs the tests taking ``make_store`` or ``in_store`` again,
with ``make_store`` opening PostgreSQL instead (it imports ``in_store`` from here).
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.store.sqlite import SQLiteStore


@pytest.fixture
def make_store(tmp_path):
    """Build a store (again, on the same data)."""
    return lambda retention=None: SQLiteStore(tmp_path / "db.sqlite3", retention)


@pytest.fixture
def in_store(make_store):
    """``in_store(scenario)`` awaits ``scenario(store)``; each call opens the same data again."""

    def run(scenario) -> None:
        async def go() -> None:
            store = make_store()
            await store.open()
            try:
                await scenario(store)
            finally:
                await store.close()

        asyncio.run(go())

    return run
