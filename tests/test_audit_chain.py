"""Records nobody rewrites unseen, through a gateway: ``sbx audit verify`` finds a row edited
by direct SQL in the data dir's database, and an exported notebook's chain head is checked
against the gateway's (the tamper kinds, one by one, are tests/unit/store/test_chain.py)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from test_cli import sbx

from gateway.client import Client


@pytest.fixture
def sdk_session(gateway):
    with Client(gateway.url, gateway.token) as client, client.create_session() as session:
        yield session


def test_sbx_audit_verify_finds_a_row_edited_in_the_database_and_checks_an_export(
    gateway, sdk_session, tmp_path
):
    sid = sdk_session.id
    sdk_session.run("1 + 1")
    clean = sbx("audit", "verify", "--session", sid, "--json", gateway=gateway)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert json.loads(clean.stdout)["ok"]

    db = sqlite3.connect(gateway.data_dir / "gateway.sqlite3", timeout=10)
    [(execution, code)] = db.execute(
        "SELECT id, code FROM executions WHERE session_id = ?", (sid,)
    ).fetchall()
    with db:
        db.execute("UPDATE executions SET code = 'print(2)' WHERE id = ?", (execution,))
    try:
        tampered = sbx("audit", "verify", "--session", sid, gateway=gateway)
        assert tampered.returncode == 1, tampered.stdout + tampered.stderr
        assert f"executions {execution}: edited" in tampered.stdout, tampered.stdout
    finally:  # the shared gateway's store as it was
        with db:
            db.execute("UPDATE executions SET code = ? WHERE id = ?", (code, execution))
        db.close()

    notebook = tmp_path / "s.ipynb"
    notebook.write_text(gateway.client.get(f"/v1/sessions/{sid}/notebook").text)
    head = json.loads(notebook.read_text())["metadata"]["sbx"]["chain"]
    assert head["count"] >= 2 and len(head["hash"]) == 64  # its creation, the execute
    checked = sbx("audit", "check-notebook", str(notebook), gateway=gateway)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    nb = json.loads(notebook.read_text())
    nb["metadata"]["sbx"]["chain"]["hash"] = "0" * 64
    notebook.write_text(json.dumps(nb))
    mismatch = sbx("audit", "check-notebook", str(notebook), gateway=gateway)
    assert mismatch.returncode == 1 and "does not match" in mismatch.stdout, mismatch.stdout
