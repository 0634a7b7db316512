"""A scenario run against a fresh SQLite store, opened before and closed after."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store.sqlite import SQLiteStore


@pytest.fixture
def in_store(tmp_path):
    """``in_store(scenario)`` awaits ``scenario(store)``; each call opens the same file again."""

    def run(scenario) -> None:
        async def go() -> None:
            store = SQLiteStore(tmp_path / "db.sqlite3")
            await store.open()
            try:
                await scenario(store)
            finally:
                await store.close()

        asyncio.run(go())

    return run
