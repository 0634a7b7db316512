"""The unit tier: tests that need no Docker engine, no gateway process and no PostgreSQL.

``scripts/test --unit`` runs only what is under this directory. Each test sits in
the room of ``gateway/`` it tests (``unit/policy/`` for ``gateway/policy/``,
``unit/config/`` for the top-level module ``gateway/config.py``). A test that asks
for an integration fixture of ``tests/conftest.py`` or is marked ``docker`` fails
collection: it belongs beside the integration tests in ``tests/``. Test file names
stay unique across ``tests/`` (pytest imports them by their base name).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
# What starts an engine, a gateway or a database server (tests/conftest.py).
INTEGRATION = {
    "engine", "start_gateway", "gateway", "api", "new_session", "session", "postgres",
    "e2b_sandbox", "tenants", "canary",
}  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = [
        item.nodeid
        for item in items
        if item.path.is_relative_to(HERE)
        and (
            INTEGRATION & set(getattr(item, "fixturenames", ()))
            or item.get_closest_marker("docker")
        )
    ]
    if wrong:
        raise pytest.UsageError(
            "the unit tier (tests/unit/) takes no engine, gateway or PostgreSQL; move these "
            f"to tests/ or drop the integration fixture or docker marker: {', '.join(wrong)}"
        )
