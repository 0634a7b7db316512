"""History and exports at scale: paged, pruned, streamed, and never stalling the gateway.

A session holds a few hundred executions of about 1 MiB each. Reading its
history or exporting it must cost the gateway a page of memory, not the
session's, and a canary session on the same gateway keeps answering.
"""

from __future__ import annotations

import json

import pytest
from helpers import (
    Canary,
    GatewayProcess,
    memory_kib,
    reset_peak_memory,
    run,
    wait_for,
)

pytestmark = pytest.mark.docker

MiB = 2**20
BIG_EXECUTIONS = 160
# A page of history, or a batch of an export, with the JSON around it; far below the session.
GROWTH_MIB = 80
BIG_OUTPUT = (
    "import base64, os\n"
    "display({'image/png': base64.b64encode(os.urandom(768 * 1024)).decode()}, raw=True)"
)


@pytest.fixture(scope="module")
def gw(start_gateway) -> GatewayProcess:
    return start_gateway()


@pytest.fixture(scope="module")
def heavy(gw) -> str:
    """An ended session with BIG_EXECUTIONS executions of ~1 MiB of image each."""
    r = gw.client.post("/v1/sessions", json={"limits": {"output_bytes": "2m"}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for _ in range(BIG_EXECUTIONS):
        assert run(gw.client, sid, BIG_OUTPUT)["status"] == "ok"
    gw.client.delete(f"/v1/sessions/{sid}")
    return sid


def grown_mib(gw: GatewayProcess, before: dict[str, int]) -> int:
    after = memory_kib(gw.pid)
    print(f"gateway RSS {before['VmRSS'] // 1024} MiB before, peak {after['VmHWM'] // 1024} MiB")
    return (after["VmHWM"] - before["VmRSS"]) // 1024


def test_reading_a_big_history_costs_a_page_not_the_session(gw, canary, heavy):
    reset_peak_memory(gw.pid)
    before = memory_kib(gw.pid)
    with Canary(gw, canary):
        r = gw.client.get(f"/v1/sessions/{heavy}/history")
        grown = grown_mib(gw, before)
    assert r.status_code == 200, r.text
    assert grown < GROWTH_MIB, (
        f"one history request of a {BIG_EXECUTIONS}-execution session made the gateway grow "
        f"by {grown} MiB: it loaded the whole history at once"
    )


def test_exporting_a_big_session_streams_it(gw, canary, heavy, tmp_path):
    reset_peak_memory(gw.pid)
    before = memory_kib(gw.pid)
    path = tmp_path / "big.ipynb"
    with Canary(gw, canary), path.open("wb") as out:
        with gw.client.stream("GET", f"/v1/sessions/{heavy}/notebook") as r:
            assert r.status_code == 200, r.read()
            for chunk in r.iter_bytes():
                out.write(chunk)
        grown = grown_mib(gw, before)
    assert grown < GROWTH_MIB, (
        f"exporting a {BIG_EXECUTIONS}-execution session made the gateway grow by {grown} MiB: "
        "it built the whole notebook in memory"
    )
    nb = json.loads(path.read_bytes())
    assert [c["execution_count"] for c in nb["cells"]] == list(range(1, BIG_EXECUTIONS + 1))


def test_history_pages_follow_next_to_the_end(gw, heavy):
    seen, after, pages = [], 0, 0
    while after is not None:
        r = gw.client.get(f"/v1/sessions/{heavy}/history", params={"after": after, "limit": 50})
        assert r.status_code == 200, r.text
        body = r.json()
        assert 1 <= len(body["executions"]) <= 50
        seen += body["executions"]
        after, pages = body["next"], pages + 1
    counts = [e["execution_count"] for e in seen]
    assert counts == list(range(1, BIG_EXECUTIONS + 1)), "pages skipped or repeated executions"
    # ~1 MiB each: a page stops at its byte budget before its count.
    assert pages > BIG_EXECUTIONS // 50 + 1


def test_history_paging_arguments(api, session):
    sid = session["id"]
    for code in ("a = 1", "a += 1", "print(a)"):
        run(api, sid, code)
    first = api.get(f"/v1/sessions/{sid}/history", params={"limit": 2}).json()
    assert [e["code"] for e in first["executions"]] == ["a = 1", "a += 1"]
    assert first["next"] == first["executions"][-1]["id"]
    rest = api.get(f"/v1/sessions/{sid}/history", params={"after": first["next"]}).json()
    assert [e["code"] for e in rest["executions"]] == ["print(a)"] and rest["next"] is None
    whole = api.get(f"/v1/sessions/{sid}/history").json()
    assert len(whole["executions"]) == 3 and whole["next"] is None
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"after": -1}, {"after": "y"}):
        r = api.get(f"/v1/sessions/{sid}/history", params=params)
        assert r.status_code == 400, f"{params} answered {r.status_code}: {r.text}"
        assert r.json()["error"]["code"] == "bad_request"


def test_retention_keeps_the_newest_executions_per_session(start_gateway):
    gw = start_gateway("--history-max-executions", "3", "--history-prune-interval", "0.2")
    sid = gw.client.post("/v1/sessions", json={}).json()["id"]
    for n in range(6):
        run(gw.client, sid, f"print({n})")

    def codes() -> list[str]:
        page = gw.client.get(f"/v1/sessions/{sid}/history").json()
        return [e["code"] for e in page["executions"]]

    assert wait_for(lambda: len(codes()) == 3, 10), f"history was not pruned: {codes()}"
    assert codes() == ["print(3)", "print(4)", "print(5)"]
    cells = gw.client.get(f"/v1/sessions/{sid}/notebook").json()["cells"]
    assert [c["source"] for c in cells] == ["print(3)", "print(4)", "print(5)"]
    assert run(gw.client, sid, "print(6)")["execution_count"] == 7, "the kernel kept its count"


def test_a_replayed_notebook_is_bounded_by_the_body_limit(gw):
    huge = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [],
                       "padding": "x" * (17 * MiB)})  # fmt: skip
    r = gw.client.post("/v1/notebooks/replay", content=huge)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large", r.text
