"""A session holding sealed secrets keeps no secret value in saved state, and its forks show none.

A namespace file (a pause's or a snapshot's) held whatever the kernel
computed from a secret, in the clear, and a fork loaded it into a kernel
whose masker did not know the value. Such a session's state is kept by
replay: the masked history, run again by a fork that asks for its parent's
secrets (and masks them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import Canary, canary_session, run, text_of

pytestmark = pytest.mark.docker

VALUE = "wh-7Qx9/z+Lk2=pass&word"
MASK = "***WAREHOUSE_KEY***"
SETUP = "import os, json\nkey = os.environ['WAREHOUSE_KEY']\nnote = json.dumps({'k': key})"
SHOW = "print(key, note)"


@pytest.fixture
def holding(start_gateway):
    """A gateway, and a session there whose namespace holds the secret's value."""
    gw = start_gateway()
    assert gw.client.post("/v1/secrets", json={"name": "WAREHOUSE_KEY", "value": VALUE}).is_success
    sid = gw.client.post("/v1/sessions", json={"secrets": ["WAREHOUSE_KEY"]}).json()["id"]
    run(gw.client, sid, SETUP)
    return gw, sid


def files_showing(directory: Path, value: str) -> list[str]:
    """Files under ``directory`` that hold ``value``'s bytes."""
    return [
        str(path)
        for path in directory.rglob("*")
        if path.is_file() and not path.is_symlink() and value.encode() in path.read_bytes()
    ]


def test_a_snapshot_keeps_no_value_and_a_fork_shows_none(holding):
    gw, sid = holding
    api = gw.client
    taken = api.post(f"/v1/sessions/{sid}/snapshots", json={"name": "s"})
    assert taken.status_code == 201, taken.text
    snapshot = taken.json()
    assert snapshot["strategy"] == "replay", snapshot
    kept = Path(gw.data_dir) / "snapshots" / snapshot["id"]
    assert files_showing(kept, VALUE) == [], "the snapshot keeps the secret in the clear"

    fork = api.post("/v1/sessions", json={"from_snapshot": snapshot["id"]})
    assert fork.status_code == 201, fork.text
    assert fork.json()["secrets"] == ["WAREHOUSE_KEY"], "a fork asks for its parent's secrets"
    shown = run(api, fork.json()["id"], SHOW)
    assert text_of(shown) == f'{MASK} {{"k": "{MASK}"}}\n', f"the fork shows the secret: {shown}"

    api.delete("/v1/secrets/WAREHOUSE_KEY")
    gone = api.post("/v1/sessions", json={"from_snapshot": snapshot["id"]})
    assert gone.status_code == 400 and "WAREHOUSE_KEY" in gone.text, gone.text


def test_namespace_state_is_refused_with_a_reason_and_a_pause_keeps_no_value(holding):
    gw, sid = holding
    api = gw.client
    for path in ("pause", "snapshots"):
        refused = api.post(f"/v1/sessions/{sid}/{path}", json={"strategy": "namespace"})
        assert refused.status_code == 409, refused.text
        assert "WAREHOUSE_KEY" in refused.text and "replay" in refused.text, refused.text
    paused = api.post(f"/v1/sessions/{sid}/pause", json={})
    assert paused.status_code == 200 and paused.json()["strategy"] == "freeze", paused.text
    # A snapshot saves the frozen session to disk first: by the best strategy it may use.
    assert api.post(f"/v1/sessions/{sid}/snapshots", json={}).status_code == 201
    assert api.get(f"/v1/sessions/{sid}").json()["paused"]["strategy"] == "replay"
    session_dir = Path(gw.data_dir) / "sessions" / sid
    assert files_showing(session_dir / "state", VALUE) == [], "the pause keeps the secret"
    assert files_showing(session_dir / "run", VALUE) == []
    resumed = api.post(f"/v1/sessions/{sid}/resume", json={})
    assert resumed.status_code == 200, resumed.text
    assert text_of(run(api, sid, SHOW)) == f'{MASK} {{"k": "{MASK}"}}\n'


def test_output_made_to_keep_the_masker_holding_back_stalls_nobody(holding):
    """Megabytes of the secret's first characters, from a command and a cell, beside a canary."""
    gw, sid = holding
    api = gw.client
    flood = "head -c 20000000 /dev/zero | tr '\\0' w; printf 'h-7Qx9'"
    with canary_session(gw) as canary, Canary(gw, canary, max_rss_growth=128 * 2**20) as watch:
        r = api.post(f"/v1/sessions/{sid}/commands", json={"command": flood, "timeout": 120})
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text[:500]
        cell = "import sys\nfor _ in range(200):\n    sys.stdout.write('wh-7Qx9' * 9000)"
        assert run(api, sid, cell)["status"] == "ok"
    print(watch)
