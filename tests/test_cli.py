"""The ``sbx`` client commands, run as a user runs them: the installed entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tcp_proxy import TCPProxy

from gateway.client import Client

pytestmark = pytest.mark.docker

SBX = str(Path(sys.executable).with_name("sbx"))
PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
)


def sbx(*args: str, gateway=None, cwd: Path | None = None, stdin: str | None = None):
    """Run ``sbx`` with a clean environment, pointed at ``gateway`` as SBX_URL/SBX_TOKEN."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    if gateway is not None:
        env.update(SBX_URL=gateway.url, SBX_TOKEN=getattr(gateway, "token", ""))
    return subprocess.run(
        [SBX, *args], capture_output=True, text=True, env=env, cwd=cwd, input=stdin, timeout=180
    )


@pytest.fixture
def sdk(gateway):
    with Client(gateway.url, getattr(gateway, "token", "")) as client:
        yield client


@pytest.fixture
def cli_session(sdk):
    with sdk.create_session(metadata={"test": "cli"}) as session:
        yield session


def _help(capsys, command: list[str]) -> str:
    """``sbx COMMAND --help`` through the entry point's own parser, in this process."""
    from gateway.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0, f"sbx {' '.join(command)} --help failed: {err}"
    return out


def test_every_command_has_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # the same help width here and in the spawned sbx
    # In process: a new Python per command took 1.5 s of imports each (53 s in all);
    # the installed entry point itself is spawned once, below.
    commands = [
        [], ["run"], ["exec"], ["sessions"], ["sessions", "ls"], ["sessions", "new"],
        ["sessions", "show"], ["sessions", "rm"], ["files"], ["files", "put"], ["files", "get"],
        ["files", "ls"], ["files", "rm"], ["export"], ["replay"], ["mcp"], ["serve"],
        ["images"], ["images", "build"], ["images", "ls"], ["approvals"], ["approve"], ["deny"],
        ["pause"], ["resume"], ["snapshot"], ["snapshots"], ["fork"], ["e2b"], ["e2b", "env"],
    ]  # fmt: skip
    for command in commands:
        out = _help(capsys, command)
        assert out.startswith("usage: sbx"), out
    for command in (["run"], ["exec"], ["files", "put"], ["export"]):
        out = _help(capsys, command)
        assert "--url" in out and "--token" in out, out
    result = sbx("sessions", "--help")
    assert result.returncode == 0, f"sbx sessions --help failed: {result.stderr}"
    assert result.stdout == _help(capsys, ["sessions"]), result.stdout


def test_run_uploads_streams_saves_images_and_downloads(gateway, sdk, tmp_path):
    (tmp_path / "data.csv").write_text("x,y\n1,2\n3,4\n")
    (tmp_path / "job.py").write_text(
        "import pandas as pd\n"
        "df = pd.read_csv('data.csv')\n"
        "print('rows', len(df))\n"
        "df.assign(z=df.x * df.y).to_csv('out.csv', index=False)\n" + PLOT + "int(df.y.sum())\n"
    )
    result = sbx(
        "run", "job.py", "--file", "data.csv", "--get", "out.csv", "--out", "results",
        "--metadata", "test=cli-run", gateway=gateway, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["rows 2", "6"]
    assert (tmp_path / "results" / "job-1.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "results" / "out.csv").read_text() == "x,y,z\n1,2,2\n3,4,12\n"
    assert "saved image/png to results/job-1.png" in result.stderr
    assert "ok · execution 1" in result.stderr and "out.csv" in result.stderr
    assert sdk.list_sessions(metadata={"test": "cli-run"}) == [], "sbx run left its session"


def test_run_exits_1_on_error_and_reads_stdin(gateway, sdk, tmp_path):
    result = sbx(
        "run", "-", "--metadata", "test=cli-err", gateway=gateway, stdin="print('before')\n1/0"
    )
    assert result.returncode == 1
    assert result.stdout == "before\n"
    assert "ZeroDivisionError" in result.stderr and "\x1b[" not in result.stderr
    assert sdk.list_sessions(metadata={"test": "cli-err"}) == []

    kept = sbx("run", "-", "--keep", "-q", gateway=gateway, stdin="x = 1")
    assert kept.returncode == 0 and "kept" in kept.stderr
    session_id = kept.stderr.split("session ")[1].split()[0]
    with sdk.connect(session_id, keep=False) as session:
        assert session.run("x").text == "1"


def test_sessions_new_ls_show_rm(gateway, sdk):
    new = sbx("sessions", "new", "--memory", "300m", "--ttl", "600", "--metadata", "test=cli-ls",
              "--env", "A=b", "--allow", "example.com", "--runtime", "runc",
              gateway=gateway)  # fmt: skip
    assert new.returncode == 0, new.stderr
    session_id = new.stdout.strip()
    try:
        table = sbx("sessions", "ls", "--metadata", "test=cli-ls", gateway=gateway)
        header, row = table.stdout.splitlines()
        assert header.split()[:3] == ["ID", "STATE", "KERNEL"]
        assert row.split()[:3] == [session_id, "idle", "python3"] and "test=cli-ls" in row
        listed = json.loads(
            sbx("sessions", "ls", "--json", "--state", "idle", gateway=gateway).stdout
        )
        assert session_id in [s["id"] for s in listed]

        show = sbx("sessions", "show", session_id, gateway=gateway)
        assert (
            "memory 300 MiB" in show.stdout
            and "600 s" in show.stdout
            and "test=cli-ls" in show.stdout
        )
        shown = json.loads(sbx("sessions", "show", session_id, "--json", gateway=gateway).stdout)
        assert shown["env"] == ["A"] and shown["ttl"] == 600 and shown["runtime"] == "runc"
        assert shown["network"] == {"allow": ["example.com"]}
    finally:
        rm = sbx("sessions", "rm", session_id, gateway=gateway)
    assert rm.returncode == 0 and f"deleted {session_id}" in rm.stderr
    assert (
        sbx("sessions", "ls", "--metadata", "test=cli-ls", gateway=gateway).stderr
        == "no sessions\n"
    )


def test_exec_keeps_state_between_calls(gateway, cli_session, tmp_path):
    first = sbx("exec", cli_session.id, "total = 40", gateway=gateway)
    assert first.returncode == 0 and first.stdout == ""
    second = sbx("exec", cli_session.id, "total + 2", gateway=gateway)
    assert second.stdout == "42\n" and "execution 2" in second.stderr
    (tmp_path / "step.py").write_text("print(total * 2)\n" + PLOT)
    third = sbx("exec", cli_session.id, "--file", "step.py", "-q", gateway=gateway, cwd=tmp_path)
    assert third.stdout == "80\n" and third.stderr.startswith("saved image/png to output-1.png")
    assert (tmp_path / "output-1.png").exists()
    failed = sbx("exec", cli_session.id, "undefined_name", gateway=gateway)
    assert failed.returncode == 1 and "NameError" in failed.stderr


def test_pause_resume_snapshot_and_fork(gateway, sdk, cli_session):
    assert sbx("exec", cli_session.id, "kept = 21", gateway=gateway).returncode == 0
    for how, args in (("freeze", ()), ("namespace", ("--strategy", "namespace"))):
        paused = sbx("pause", cli_session.id, *args, gateway=gateway)
        assert paused.returncode == 0 and f"paused ({how})" in paused.stderr, paused.stderr
        resumed = sbx("resume", cli_session.id, gateway=gateway)
        assert resumed.returncode == 0 and f"idle ({how})" in resumed.stderr, resumed.stderr
    taken = sbx("snapshot", cli_session.id, "--name", "cli", gateway=gateway)
    assert taken.returncode == 0, taken.stderr
    snapshot_id = taken.stdout.strip()
    listed = sbx("snapshots", cli_session.id, gateway=gateway)
    assert snapshot_id in listed.stdout and "cli" in listed.stdout, listed.stdout
    forked = sbx("fork", snapshot_id, gateway=gateway)
    assert forked.returncode == 0, forked.stderr
    child = sdk.session(forked.stdout.strip(), keep=False)
    with child:
        assert child.run("print(kept * 2)").stdout == "42\n"
    assert sbx("fork", "no-such-snapshot", gateway=gateway).returncode == 2


def test_files_put_ls_get_rm(gateway, cli_session, tmp_path):
    (tmp_path / "in.bin").write_bytes(bytes(range(256)) * 4000)
    put = sbx(
        "files", "put", cli_session.id, "in.bin", "data/in.bin", gateway=gateway, cwd=tmp_path
    )
    assert put.returncode == 0 and "uploaded in.bin -> data/in.bin (1024000 bytes)" in put.stderr
    listing = sbx("files", "ls", cli_session.id, gateway=gateway).stdout.splitlines()
    assert listing[0].split() == ["PATH", "TYPE", "SIZE", "MODIFIED", "(UTC)"]
    assert listing[1].split()[:2] == ["data/", "directory"]
    entries = json.loads(
        sbx("files", "ls", cli_session.id, "data", "--json", gateway=gateway).stdout
    )
    assert [(e["path"], e["size"]) for e in entries] == [("data/in.bin", 1024000)]

    get = sbx(
        "files", "get", cli_session.id, "data/in.bin", "back.bin", gateway=gateway, cwd=tmp_path
    )
    assert (
        get.returncode == 0
        and (tmp_path / "back.bin").read_bytes() == (tmp_path / "in.bin").read_bytes()
    )
    cli_session.files.write("note.txt", "to stdout")
    assert (
        sbx("files", "get", cli_session.id, "note.txt", "-", gateway=gateway).stdout == "to stdout"
    )

    assert sbx("files", "rm", cli_session.id, "data", gateway=gateway).returncode == 0
    assert [e.path for e in cli_session.files.list()] == ["note.txt"]
    missing = sbx("files", "get", cli_session.id, "data/in.bin", gateway=gateway, cwd=tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_export_writes_the_notebook(gateway, cli_session, tmp_path):
    cli_session.run("print('hello')")
    result = sbx("export", cli_session.id, "-o", "s.ipynb", gateway=gateway, cwd=tmp_path)
    assert result.returncode == 0 and "wrote s.ipynb" in result.stdout
    notebook = json.loads((tmp_path / "s.ipynb").read_text())
    assert [c["source"] for c in notebook["cells"] if c["cell_type"] == "code"] == [
        "print('hello')"
    ]


def test_errors_exit_2_with_the_gateways_message(gateway, tmp_path):
    missing = sbx("exec", "no-such-session", "1", gateway=gateway)
    assert missing.returncode == 2 and "sbx: no session 'no-such-session'" in missing.stderr
    for command in (("files", "ls"), ("sessions", "rm"), ("export",)):
        unknown = sbx(*command, "no-such-session", gateway=gateway, cwd=tmp_path)
        assert unknown.returncode == 2 and "no session 'no-such-session'" in unknown.stderr, (
            command,
            unknown.stderr,
        )
    too_big = sbx("run", "-", "--memory", "900g", gateway=gateway, stdin="1")
    assert too_big.returncode == 2 and "memory" in too_big.stderr
    no_file = sbx("run", "nope.py", gateway=gateway, cwd=tmp_path)
    assert no_file.returncode == 2 and "cannot read nope.py" in no_file.stderr
    down = sbx("sessions", "ls", "--url", "http://127.0.0.1:9")
    assert down.returncode == 2 and "cannot reach the gateway at http://127.0.0.1:9" in down.stderr


def test_url_and_token_flags_win_over_the_environment(gateway):
    token = getattr(gateway, "token", "") or "t0ken"
    with TCPProxy(gateway.url) as proxy:
        result = sbx("sessions", "ls", "--url", proxy.url, "--token", token, gateway=gateway)
    assert result.returncode == 0, result.stderr
    assert f"authorization: bearer {token}".lower().encode() in bytes(proxy.received).lower()


def test_run_with_a_sealed_secret_shows_it_masked(gateway):
    gateway.client.put("/v1/secrets/CLI_KEY", json={"value": "cli-secret-value-7f3a"})
    try:
        code = "import os; print(os.environ['CLI_KEY'][::-1][::-1])"
        done = sbx("run", "-", "--secret", "CLI_KEY", gateway=gateway, stdin=code)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "***CLI_KEY***\n" and "cli-secret-value" not in done.stderr
        unknown = sbx("run", "-", "--secret", "NO_SUCH_KEY", gateway=gateway, stdin="1")
        assert unknown.returncode == 2 and "NO_SUCH_KEY" in unknown.stderr, unknown.stderr
    finally:
        gateway.client.delete("/v1/secrets/CLI_KEY")
