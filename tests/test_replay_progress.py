"""A replay reports each code cell as it is decided: NDJSON from the API, ``on_cell`` in
the SDK's two halves, and a per-cell bar in ``sbx replay`` on a terminal (quiet with --json)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from gateway.client import AsyncClient, Client

pytestmark = pytest.mark.docker

SBX = str(Path(sys.executable).with_name("sbx"))


def notebook() -> dict:
    def cell(source: str, text: str, *tags: str):
        c = new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
        c.outputs = [new_output("stream", name="stdout", text=text)]
        return c

    return new_notebook(
        cells=[
            new_markdown_cell("three code cells"),
            cell("print('a')", "a\n"),
            cell("raise SystemExit", "", "sbx-skip"),
            cell("print('c')", "changed\n"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )


EXPECTED = [(1, 1, 3, "same"), (2, 2, 3, "skipped"), (3, 3, 3, "different")]


def test_the_api_streams_a_line_per_cell_then_the_report(api):
    with api.stream("POST", "/v1/notebooks/replay?progress=true", json=notebook()) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        events = [json.loads(line) for line in r.iter_lines() if line]
    cells = [(e["cell"]["index"], e["done"], e["total"], e["cell"]["result"]) for e in events[:-1]]
    assert cells == EXPECTED and [e["event"] for e in events[:-1]] == ["cell"] * 3
    assert events[-1]["event"] == "report" and events[-1]["report"]["summary"]["different"] == 1
    assert api.post("/v1/notebooks/replay?progress=maybe", json=notebook()).status_code == 400
    bad = notebook()
    bad["cells"][1]["metadata"]["tags"] = ["sbx-float-tolerance=lots"]
    refused = api.post("/v1/notebooks/replay?progress=true", json=bad)  # before any line: JSON
    assert refused.status_code == 400 and refused.headers["content-type"].startswith(
        "application/json"
    )
    assert "sbx-float-tolerance" in refused.json()["error"]["message"]


def test_the_sdk_hears_of_every_cell_sync_and_async(gateway):
    seen: list[tuple] = []
    with Client(gateway.url, gateway.token) as client:
        report = client.replay(
            notebook(), on_cell=lambda c, d, t: seen.append((c.index, d, t, c.result))
        )
    assert seen == EXPECTED
    assert [c.result for c in report.cells] == ["same", "skipped", "different"]

    async def run() -> list[tuple]:
        heard: list[tuple] = []

        async def on_cell(cell, done, total) -> None:
            heard.append((cell.index, done, total, cell.result))

        async with AsyncClient(gateway.url, gateway.token) as client:
            report = await client.replay(notebook(), on_cell=on_cell)
        assert not report.reproduced
        return heard

    assert asyncio.run(run()) == EXPECTED


def sbx_on_a_terminal(gateway, *args: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``sbx`` with stderr on a pseudo-terminal (as a person sees it), stdout piped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env.update(SBX_URL=gateway.url, SBX_TOKEN=gateway.token, COLUMNS="120", TERM="xterm")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [SBX, *args], stdout=subprocess.PIPE, stderr=follower, env=env, cwd=cwd, text=True
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    stdout, _ = proc.communicate(timeout=120)
    return (
        proc.returncode,
        stdout,
        re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace")),
    )


def test_sbx_replay_shows_a_line_per_cell_on_a_terminal_and_nothing_with_json(gateway, tmp_path):
    (tmp_path / "nb.ipynb").write_text(json.dumps(notebook()))
    code, stdout, terminal = sbx_on_a_terminal(gateway, "replay", "nb.ipynb", cwd=tmp_path)
    assert code == 1, stdout + terminal  # one cell differs
    for line in ("cell 1/3 [", "]: same", "cell 2/3 [", "]: skipped", "cell 3/3 [", "]: different"):
        assert line in terminal, terminal
    assert "did NOT reproduce" in stdout

    code, stdout, terminal = sbx_on_a_terminal(
        gateway, "replay", "nb.ipynb", "--json", cwd=tmp_path
    )
    assert code == 1 and json.loads(stdout)["summary"]["different"] == 1
    assert "cell 1/3" not in terminal, terminal
