"""Docs that cannot rot: every shell and Python example in README.md and docs/ runs here.

Each file's fenced ``sh``/``bash``/``console``/``python`` blocks are taken from
the markdown and run in order against the shared test gateway, as a reader
runs them: shell blocks in one bash (``set -euo pipefail``), Python blocks in
one interpreter, with ``SBX_URL`` and ``SBX_TOKEN`` set as the README tells
users to, in a directory holding the local files the examples name. A failure
names the file and line. A block that cannot run in a test (it starts a
second server, installs system packages, sets up a Swarm...) follows an
``<!-- not-tested: reason -->`` line, and the reason is required. Every
``toml`` and ``yaml`` block is parsed, and a policy in docs/approvals.md is
read by the gateway's own policy loader, so a reader can paste any of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from helpers import ROOT

from gateway.policy.model import Policy

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "sh", "python": "python"}
# Configuration a reader pastes into a file: parsed, never run.
SETTINGS = {"toml": "toml", "yaml": "yaml", "yml": "yaml"}
FENCE = re.compile(r"^(```|~~~)\s*([\w+-]*)")
MARKER = re.compile(r"<!--\s*not-tested\b(.*?)-->")
# What the README's "Use it" defines; shell blocks elsewhere use the same `api`.
API = 'api() { curl -sS -H "Authorization: Bearer $SBX_TOKEN" "$@"; }'
# Files the examples read as a reader's own, made in the directory they run in.
LOCAL_FILES = {
    "data.csv": "x,y\n1,2\n3,5\n",
    "local.csv": "a,b\n1,2\n",
    "data/sales.csv": "region,total\nnorth,10\nsouth,12\n",
    "inputs/a.txt": "a\n",
    "inputs/deep/b.txt": "b\n",
}
RUN_PYTHON = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for block in json.load(sys.stdin):
    code = "\\n" * block["line"] + block["code"]  # so tracebacks give the markdown's lines
    try:
        exec(compile(code, block["path"], "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"__failed__ {block['path']}:{block['line']}", file=sys.stderr)
        sys.exit(1)
"""


@dataclasses.dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str  # "sh" or "python"
    code: str
    not_tested: str | None  # the marker's reason

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def examples(path: Path, languages: dict[str, str] = LANGUAGES) -> list[Block]:
    """The file's fenced blocks in one of ``languages``, with their markers."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].startswith(fence[1])), len(lines)
        )
        language = languages.get(fence[2].lower())
        if language:
            before = next((text for text in reversed(lines[:i]) if text.strip()), "")
            marker = MARKER.search(before)
            reason = marker[1].strip().removeprefix(":").strip() if marker else None
            code = lines[i + 1 : end]
            if fence[2].lower() == "console":  # only the prompted lines are commands
                code = [c[2:] for c in code if c.startswith("$ ")]
            found.append(Block(path, i + 1, language, "\n".join(code), reason))
        i = end + 1
    return found


ALL = [block for path in DOCS for block in examples(path)]
SETTINGS_BLOCKS = [block for path in DOCS for block in examples(path, SETTINGS)]
POLICIES = ROOT / "docs" / "approvals.md"  # every settings block there is a policy


def test_every_toml_and_yaml_block_parses():
    assert {b.language for b in SETTINGS_BLOCKS} >= {"toml"}, "no settings block found"
    problems = []
    for block in SETTINGS_BLOCKS:
        try:
            if block.language == "toml":
                tomllib.loads(block.code)
            else:
                yaml.safe_load(block.code)
            if block.path == POLICIES:
                Policy.parse(block.code, block.language, block.where)
        except Exception as e:
            problems.append(f"{block.where}: {type(e).__name__}: {e}")
    assert not problems, "\n".join(problems)


def test_every_marker_gives_a_reason_and_stands_before_an_example():
    problems = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        for number, text in enumerate(lines, 1):
            if not (marker := MARKER.search(text)):
                continue
            where = f"{path.relative_to(ROOT)}:{number}"
            if not marker[1].strip().removeprefix(":").strip():
                problems.append(f"{where}: not-tested without a reason (<!-- not-tested: why -->)")
            after = next((t for t in lines[number:] if t.strip()), "")
            fence = FENCE.match(after)
            if not fence or fence[2].lower() not in LANGUAGES:
                problems.append(f"{where}: not-tested marks no shell or Python example")
    assert not problems, "\n".join(problems)
    tested = sum(b.not_tested is None for b in ALL)
    assert tested * 2 >= len(ALL), f"only {tested} of {len(ALL)} examples run"


def test_the_readme_defines_api_as_the_tests_do():
    assert API in (ROOT / "README.md").read_text()


def live_sessions(api) -> set[str]:
    return {s["id"] for s in api.get("/v1/sessions").json()["sessions"]}


def workdir(tmp_path: Path) -> Path:
    for name, text in LOCAL_FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "big.bin").write_bytes(os.urandom(1 << 20))
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # examples run `.venv/bin/sbx` as given
    (tmp_path / "home").mkdir()
    return tmp_path


def environment(gateway, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env.update(
        SBX_URL=gateway.url,
        SBX_TOKEN=gateway.token,
        HOME=str(home),  # nothing of the person running the tests is read
        PYTHONPATH=str(ROOT),  # this checkout's gateway, for `sbx` and the SDK alike
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        COLUMNS="120",
    )
    return env


def run_shell(blocks: list[Block], env: dict[str, str], cwd: Path) -> None:
    # errtrace: a failure inside `api` is reported too, with the line that called it
    trap = "trap 'echo \"__failed__ $LINENO ${BASH_LINENO[*]}\" >&2' ERR"
    script, origin = ["set -Eeuo pipefail", trap, API], {}
    # an answer of 4xx/5xx fails the example too, not only a refused connection
    script.append('curl() { command curl --fail-with-body "$@"; }')
    for block in blocks:
        for offset, text in enumerate(block.code.splitlines(), 1):
            script.append(text)
            origin[len(script)] = f"{block.path.relative_to(ROOT)}:{block.line + offset}"
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        failed = re.search(r"__failed__ ([\d ]+)", result.stderr)
        lines = [int(n) for n in failed[1].split() if n != "0"] if failed else []
        where = origin.get(lines[-1], blocks[0].where) if lines else blocks[0].where
        pytest.fail(f"{where}: this example failed (exit {result.returncode}):\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")  # fmt: skip


def run_python(blocks: list[Block], env: dict[str, str], cwd: Path) -> None:
    payload = [{"path": b.where.rsplit(":", 1)[0], "line": b.line, "code": b.code} for b in blocks]
    result = subprocess.run(
        [sys.executable, "-c", RUN_PYTHON],
        input=json.dumps(payload), capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        failed = re.findall(r"__failed__ (\S+)", result.stderr)
        pytest.fail(f"{failed[0] if failed else blocks[0].where}: this example failed:\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")  # fmt: skip


RUNNABLE = sorted({b.path for b in ALL if b.not_tested is None})


@pytest.mark.docker
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_run(path, gateway, api, tmp_path):
    blocks = [b for b in ALL if b.path == path and b.not_tested is None]
    cwd = workdir(tmp_path)
    env = environment(gateway, cwd / "home")
    before = live_sessions(api)
    try:
        for language, run in (("sh", run_shell), ("python", run_python)):
            if mine := [b for b in blocks if b.language == language]:
                run(mine, env, cwd)
    finally:
        left = live_sessions(api) - before
        for sid in left:
            api.delete(f"/v1/sessions/{sid}")
    assert not left, f"{path.relative_to(ROOT)}'s examples left sessions running: {sorted(left)}"


@pytest.mark.docker
def test_a_broken_example_fails_naming_its_file_and_line(gateway, tmp_path):
    """kernels.md's curl without the Authorization header: a 401 fails, at its line."""
    old = Block(
        ROOT / "docs" / "kernels.md", 16, "sh",
        'echo "a line that works"\ncurl -s $SBX_URL/v1/kernels', None,
    )  # fmt: skip
    cwd = workdir(tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"docs/kernels\.md:18: this example failed"):
        run_shell([old], environment(gateway, cwd / "home"), cwd)
    python = Block(ROOT / "docs" / "sdk.md", 40, "python", "x = 1\nSession.nothing", None)
    with pytest.raises(pytest.fail.Exception, match=r"docs/sdk\.md:40: this example failed"):
        run_python([python], environment(gateway, cwd / "home"), cwd)
