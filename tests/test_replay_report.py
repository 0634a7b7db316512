"""``sbx replay --report``: recorded and replayed side by side, looked at in headless Chromium."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import ROOT, run, screenshot_path
from test_cli import PLOT, sbx

pytestmark = pytest.mark.docker

HOSTILE = (
    "from IPython.display import HTML\n"
    "HTML(\"<b>bold</b><script>parent.document.title='owned'</script>\")"
)


def test_the_report_shows_each_cell_side_by_side_with_images(gateway, api, session, tmp_path):
    sid = session["id"]
    for code in ("print(6 * 7)", PLOT, HOSTILE, "print('unchanged')"):
        assert run(api, sid, code)["status"] == "ok"
    nb = api.get(f"/v1/sessions/{sid}/notebook").json()
    code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code_cells[0]["outputs"][0]["text"] = "41\n"  # as if it had printed something else then
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))

    done = sbx("replay", "nb.ipynb", "--report", "report.html", gateway=gateway, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    page = (tmp_path / "report.html").read_text()
    assert "<script>" not in page, "the kernel's script reached the report unescaped"

    shot = screenshot_path("replay-report.png", tmp_path)
    browser = subprocess.run(
        ["node", "report.mjs", str(tmp_path / "report.html"), str(shot)],
        cwd=ROOT / "tests" / "browser", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert browser.returncode == 0, browser.stderr[-3000:]
    shown = json.loads(browser.stdout.strip().splitlines()[-1])
    assert shown["verdict"] == "did not reproduce"
    results = [c["result"] for c in shown["cells"]]
    assert results[0] == "different" and results[-1] == "same", results
    first = shown["cells"][0]
    assert first["recorded"].split() == ["RECORDED", "41"], first
    assert first["replayed"].split() == ["REPLAYED", "42"], first
    assert "-41" in first["diff"] and "+42" in first["diff"], first["diff"]
    sides = sorted(i["side"] for i in shown["images"] if i["width"] > 0)
    assert sides == ["recorded", "replayed"], f"images not shown on both sides: {shown['images']}"
    assert shown["frames"] == ["bold", "bold"], shown["frames"]
    assert shown["title"] == "Replay of nb.ipynb", "a kernel's script ran in the report"
    assert shot.read_bytes().startswith(b"\x89PNG")
