"""``sbx``: JSON from every command that prints, restart / interrupt / extend,
directory downloads, and a clear message for each bad argument."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
import zipfile
from datetime import UTC, datetime

import pytest
from test_cli import SBX, cli_session, sbx, sdk  # noqa: F401 (fixtures)

pytestmark = pytest.mark.docker


def as_json(*args: str, gateway, cwd=None, stdin=None, code: int = 0):
    done = sbx(*args, "--json", gateway=gateway, cwd=cwd, stdin=stdin)
    assert done.returncode == code, f"sbx {' '.join(args)} --json: {done.stderr}"
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"sbx {' '.join(args)} --json printed no JSON: {done.stdout!r}")


def test_json_from_the_session_commands(gateway, sdk, tmp_path):  # noqa: F811
    new = as_json("sessions", "new", "--metadata", "test=cli-json", gateway=gateway)
    sid = new["id"]
    try:
        assert new["state"] == "idle"
        ran = as_json("exec", sid, "print('hi'); 6 * 7", gateway=gateway)
        assert ran["status"] == "ok" and ran["outputs"][-1]["data"]["text/plain"] == "42", ran
        failed = as_json("exec", sid, "1 / 0", gateway=gateway, code=1)
        assert failed["error"]["ename"] == "ZeroDivisionError"
        (tmp_path / "in.txt").write_text("data")
        put = as_json("files", "put", sid, "in.txt", gateway=gateway, cwd=tmp_path)
        assert put["path"] == "in.txt" and put["size"] == 4
        got = as_json("files", "get", sid, "in.txt", "out.txt", gateway=gateway, cwd=tmp_path)
        assert got["local"].endswith("out.txt") and got["size"] == 4
        exported = as_json("export", sid, "-o", "s.ipynb", gateway=gateway, cwd=tmp_path)
        assert exported["cells"] >= 2 and exported["output"] == "s.ipynb"
        snap = as_json("snapshot", sid, "--name", "j", gateway=gateway)
        assert snap["name"] == "j"
        forked = as_json("fork", snap["id"], gateway=gateway)
        assert as_json("sessions", "rm", forked["id"], gateway=gateway) == {
            "deleted": [forked["id"]]
        }
        assert as_json("files", "rm", sid, "in.txt", gateway=gateway) == {"removed": "in.txt"}
        assert as_json("pause", sid, gateway=gateway)["state"] == "paused"
        assert as_json("resume", sid, gateway=gateway)["state"] == "idle"
        assert isinstance(as_json("approvals", gateway=gateway), list)
        assert isinstance(as_json("images", "ls", gateway=gateway), list)
        replayed = as_json("replay", "s.ipynb", gateway=gateway, cwd=tmp_path)
        assert replayed["reproduced"] and "notebook" not in replayed, replayed
        assert replayed["output"] == "s.replayed.ipynb"
        run = as_json("run", "-", gateway=gateway, stdin="print(1 + 1)")
        assert run["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "2\n"}]
    finally:
        sdk.session(sid).delete()


def test_restart_interrupt_and_extend(gateway, cli_session):  # noqa: F811
    sid = cli_session.id
    assert sbx("exec", sid, "kept = 1", gateway=gateway).returncode == 0
    restarted = sbx("restart", sid, gateway=gateway)
    assert restarted.returncode == 0 and f"{sid} restarted" in restarted.stderr, restarted.stderr
    assert sbx("exec", sid, "kept", gateway=gateway).returncode == 1, "the kernel kept its state"

    long = subprocess.Popen(
        [SBX, "exec", sid, "import time; time.sleep(120)", "--json"],
        stdout=subprocess.PIPE, text=True, env={**gateway_env(gateway)},
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while cli_session.refresh().state != "busy" and time.monotonic() < deadline:
        time.sleep(0.1)
    interrupted = sbx("interrupt", sid, gateway=gateway)
    assert interrupted.returncode == 0, interrupted.stderr
    out, _ = long.communicate(timeout=60)
    assert long.returncode == 1 and json.loads(out)["status"] in ("interrupted", "error"), out

    extended = as_json("extend", sid, "7200", gateway=gateway)
    left = datetime.fromisoformat(extended["expires_at"]) - datetime.now(UTC)
    assert 7000 < left.total_seconds() <= 7200, extended["expires_at"]


def gateway_env(gateway) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    return {**env, "SBX_URL": gateway.url, "SBX_TOKEN": gateway.token}


def test_files_get_a_directory_as_an_archive(gateway, cli_session, tmp_path):  # noqa: F811
    cli_session.files.write("results/a.txt", "alpha")
    cli_session.files.write("results/deep/b.txt", "beta")
    done = sbx("files", "get", cli_session.id, "results/", gateway=gateway, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
        assert {n.split("results/")[-1] for n in names} == {"a.txt", "deep/b.txt"}, names
    done = sbx(
        "files", "get", cli_session.id, "results", "r.zip", "--format", "zip",
        gateway=gateway, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(io.BytesIO((tmp_path / "r.zip").read_bytes())) as z:
        assert {n.split("results/")[-1] for n in z.namelist() if not n.endswith("/")} == {
            "a.txt", "deep/b.txt",
        }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sessions", "new", "--ttl", "soon"], "argument --ttl: invalid positive number: 'soon'"),
        (["sessions", "new", "--ttl", "-5"], "argument --ttl: invalid positive number: '-5'"),
        (["exec", "S", "1", "--timeout", "0"], "argument --timeout: invalid positive number"),
        (["extend", "S", "later"], "argument seconds: invalid positive number: 'later'"),
        (["replay", "x.ipynb", "--image-tolerance", "2"], "--image-tolerance: invalid fraction"),
        (["sessions", "new", "--env", "NOEQUALS"], "--env must look like KEY=VALUE"),
        (["sessions", "ls", "--url", "notaurl"], "must be an http:// or https:// URL, not"),
        (["sessions", "ls", "--url", "ftp://host"], "must be an http:// or https:// URL, not"),
        (["files", "get", "S", "x", "--format", "rar"], "argument --format: invalid choice"),
        (["replay", "/etc/hostname"], "/etc/hostname is not a notebook"),
        (["exec", "S"], "give the code to run"),
        (["approvals", "--state", "maybe"], "argument --state: invalid choice"),
        (["mcp", "--port", "http"], "argument --port: invalid int value"),
    ],
)
def test_a_bad_argument_gets_a_clear_message(args, message):
    done = sbx(*args, "--url", "http://127.0.0.1:9") if "--url" not in args else sbx(*args)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_network_replaces_a_running_sessions_lists(gateway):
    made = gateway.client.post("/v1/sessions", json={"network": {"allow": []}})
    sid = made.json()["id"]
    try:
        changed = as_json(
            "network", sid, "--allow", "public", "--deny", "10.0.0.0/8", gateway=gateway
        )
        assert changed["network"] == {"allow": ["public"], "deny": ["10.0.0.0/8"]}
        refused = sbx("network", sid, "--allow", "bad host", gateway=gateway)
        assert refused.returncode == 2 and "network.allow entry 'bad host'" in refused.stderr
    finally:
        gateway.client.delete(f"/v1/sessions/{sid}")
