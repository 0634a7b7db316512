"""Every example in examples/ runs, as a user would run it, against the real gateway."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from gateway.client import Session

pytestmark = pytest.mark.docker

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str, gateway, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run an example script with the gateway's URL and token as arguments."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    token = getattr(gateway, "token", "")
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--url", gateway.url, "--token", token, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=240,
    )


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_example_has_a_test():
    tested = {"data_analysis_agent.py", "self_correcting_loop.py", "multi_step_agent.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_data_analysis_agent(gateway, api, tmp_path):
    result = example("data_analysis_agent.py", gateway, "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validated: total" in result.stdout and "over 4 regions" in result.stdout
    assert (tmp_path / "out" / "sales_by_region.png").read_bytes().startswith(b"\x89PNG")
    notebook = nbformat.read(tmp_path / "out" / "analysis.ipynb", as_version=4)
    nbformat.validate(notebook)
    kinds = [c.cell_type for c in notebook.cells]
    assert kinds == ["markdown", "code", "markdown", "code"], kinds
    assert "application/json" in notebook.cells[3].outputs[-1]["data"]
    ended = api.get("/v1/sessions", params={"metadata.agent": "analysis"}).json()["sessions"]
    assert ended == [], "the agent's session outlived the example"


def test_self_correcting_loop_fixes_its_first_mistake(gateway, tmp_path):
    result = example("self_correcting_loop.py", gateway, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "attempt 1: error (TypeError: unsupported operand type(s) for +: 'int' and 'str')",
        "attempt 2: ok",
        "solved on attempt 2: 3.9",
    ]


def test_self_correcting_loop_gives_up_after_three_attempts(gateway):
    loop = load("self_correcting_loop.py")
    prompts: list[str | None] = []

    def stubborn(task: str, last) -> str:
        prompts.append(None if last is None else last.feedback)
        return "print(undefined_name)"

    with Session.create(gateway.url, getattr(gateway, "token", "")) as session:
        with pytest.raises(loop.GaveUp) as gave_up:
            loop.solve(session, "anything", stubborn, loop.expected_output)
        assert len(session.history()) == 3
    assert len(gave_up.value.attempts) == 3
    assert prompts[0] is None and all("NameError" in p for p in prompts[1:]), (
        "the error was not fed back to the generator"
    )


def test_multi_step_agent_keeps_state_in_one_session(gateway, api, tmp_path):
    result = example("multi_step_agent.py", gateway, "--ttl", "90", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    session_id = lines[0].split()[1]
    assert [line.split(":")[0] for line in lines[1:5]] == [
        "step collect",
        "step clean",
        "step summarise",
        "step report",
    ]
    report = json.loads(lines[-1].split("report.json: ")[1].replace("'", '"'))
    assert report["n"] > 900 and 19 < report["mean"] < 21
    record = api.get(f"/v1/sessions/{session_id}").json()
    assert record["state"] == "deleted" and record["executions"] == 4
    assert record["ttl"] > 90, "the agent never extended the session's TTL"
