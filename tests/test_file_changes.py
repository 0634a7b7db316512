"""Every file change recorded: per execution (created, modified, deleted, with sizes and
SHA-256) in the reply and the history, and uploads and downloads with their hashes."""

from __future__ import annotations

import hashlib

import pytest
from helpers import full_history, run

pytestmark = pytest.mark.docker


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_executions_changes_are_recorded_with_sizes_and_hashes(api, session):
    sid = session["id"]
    uploaded = api.put(f"/v1/sessions/{sid}/files/data/in.txt", content=b"uploaded\n")
    assert uploaded.status_code == 201
    assert uploaded.json()["sha256"] == sha(b"uploaded\n"), "an upload answers with its hash"
    first = run(api, sid, "open('gone.txt', 'w').write('short-lived')")
    (made,) = first["files"]
    assert made == {
        "path": "gone.txt", "size": 11, "mime_type": "text/plain", "change": "created",
        "sha256": sha(b"short-lived"),
    }  # fmt: skip
    assert first["artifacts"] == first["files"], "created files are still artifacts"
    second = run(
        api, sid,
        "import os\n"
        "os.remove('gone.txt')\n"
        "open('data/in.txt', 'a').write('more\\n')\n"
        "os.makedirs('out', exist_ok=True); open('out/new.bin', 'wb').write(bytes(range(256)))",
    )  # fmt: skip
    changes = {c["path"]: c for c in second["files"]}
    assert set(changes) == {"gone.txt", "data/in.txt", "out/new.bin"}, second["files"]
    assert changes["gone.txt"] == {
        "path": "gone.txt", "size": 11, "change": "deleted", "sha256": sha(b"short-lived")
    }  # fmt: skip
    assert changes["data/in.txt"]["change"] == "modified"
    assert changes["data/in.txt"]["sha256"] == sha(b"uploaded\nmore\n")
    assert changes["out/new.bin"]["sha256"] == sha(bytes(range(256)))
    assert "gone.txt" not in {a["path"] for a in second["artifacts"]}
    assert run(api, sid, "1 + 1")["files"] == [], "an execution that touches nothing records none"
    history = full_history(api, sid)
    assert [len(e["files"]) for e in history] == [1, 3, 0]
    assert history[1]["files"] == second["files"], "the history shows each execution's changes"


def test_uploads_and_downloads_are_recorded_with_their_hashes(api, session):
    sid = session["id"]
    data = bytes(range(256)) * 1000
    assert api.put(f"/v1/sessions/{sid}/files/blob.bin", content=data).status_code == 201
    assert api.get(f"/v1/sessions/{sid}/files/blob.bin").content == data
    events = api.get("/v1/audit", params={"session_id": sid, "limit": 20}).json()["events"]
    by_action = {e["action"]: e["detail"] for e in events}
    assert by_action["files.upload"]["sha256"] == sha(data)
    download = by_action["files.download"]
    assert download == {"path": "blob.bin", "size": len(data), "sha256": sha(data)}
