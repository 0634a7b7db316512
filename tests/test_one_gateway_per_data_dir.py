"""A data directory has one gateway (issue 35, item 9).

A data directory holds a gateway's identity (its id labels its kernels'
containers and its leases), its store and its sessions' directories. A
second gateway started on one in use took the same identity: it answered 404
for sessions its store said were running, and at its stop ended or reaped
what the first one served. It now refuses to start, saying which process
holds the directory; the hold ends with the process, however it ends.
"""

from __future__ import annotations

import signal

import pytest
from helpers import run, text_of

pytestmark = pytest.mark.docker


def test_a_second_gateway_on_a_data_directory_in_use_refuses(start_gateway) -> None:
    first = start_gateway(keep_sessions=True)
    sid = first.client.post("/v1/sessions", json={}).json()["id"]
    run(first.client, sid, "x = 41")
    with pytest.raises(RuntimeError) as refused:
        start_gateway(data_dir=first.data_dir)
    said = str(refused.value)
    assert "in use by another gateway" in said and f"pid {first.pid}" in said, said
    assert "--data-dir" in said, said
    assert text_of(run(first.client, sid, "print(x + 1)")) == "42\n"
    # A crash lets go of it: the next gateway on the directory takes the session over.
    first.stop(signal.SIGKILL)
    again = start_gateway(data_dir=first.data_dir)
    assert text_of(run(again.client, sid, "print(x + 1)")) == "42\n"


def test_workers_each_hold_their_own_directory(start_gateway, postgres) -> None:
    """``--workers`` and a shared PostgreSQL store: one directory per worker, each held."""
    database = postgres.database()
    workers = start_gateway("--database-url", database, "--workers", "2")
    assert workers.client.get("/healthz").status_code == 200
    with pytest.raises(RuntimeError, match="in use by another gateway"):
        start_gateway("--database-url", database, "--workers", "2", data_dir=workers.data_dir)
    with pytest.raises(RuntimeError, match="in use by another gateway"):
        start_gateway("--database-url", database, data_dir=workers.data_dir / "worker-1")
    # A gateway of its own directory shares the store beside them.
    beside = start_gateway("--database-url", database)
    assert beside.client.get("/healthz").status_code == 200
