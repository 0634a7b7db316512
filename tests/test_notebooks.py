"""Export sessions as notebooks and replay them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import nbformat
import pytest
from helpers import ROOT, run

pytestmark = pytest.mark.docker

EXAMPLES = sorted((ROOT / "notebooks").glob("*.ipynb"))


def export(api, sid: str, **params) -> dict:
    r = api.get(f"/v1/sessions/{sid}/notebook", params=params)
    assert r.status_code == 200, r.text
    assert "attachment" in r.headers["content-disposition"]
    return r.json()


def replay(api, nb: dict, **params) -> dict:
    r = api.post("/v1/notebooks/replay", content=json.dumps(nb), params=params)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def recorded(api, session) -> tuple[str, dict]:
    """A session with prose, a plot, an error and a table, and its export."""
    sid = session["id"]
    run(api, sid, "import pandas as pd\nx = 20", description="# Setup\nLoad the tools.")
    run(api, sid, "print('x is', x)\nobject()")
    run(api, sid, "x / 0")
    run(api, sid, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()")
    run(api, sid, "pd.DataFrame({'a': [x]})", description="A table.")
    return sid, export(api, sid)


def test_export_is_a_valid_notebook_of_the_history(recorded, session):
    _, nb = recorded
    nbformat.validate(nbformat.from_dict(nb))
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds == ["markdown", "code", "code", "code", "code", "markdown", "code"]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == [1, 2, 3, 4, 5]
    assert code[1]["outputs"][0] == {"output_type": "stream", "name": "stdout", "text": "x is 20\n"}
    assert "image/png" in code[3]["outputs"][0]["data"]
    assert "<table" in code[4]["outputs"][0]["data"]["text/html"]
    timing = code[0]["metadata"]["execution"]
    assert timing["iopub.execute_input"] <= timing["shell.execute_reply"]
    assert code[2]["metadata"]["sbx"]["status"] == "error"
    assert code[2]["metadata"]["tags"] == ["raises-exception"]
    assert code[2]["metadata"]["sbx"]["error"]["ename"] == "ZeroDivisionError"
    meta = nb["metadata"]
    assert meta["kernelspec"]["name"] == "python3" and meta["kernelspec"]["language"] == "python"
    assert meta["language_info"]["name"] == "python"
    gateway = meta["sbx"]
    assert gateway["image"] == session["image"] and gateway["image_digest"].startswith("sha256:")
    assert gateway["limits"] == session["limits"] and gateway["created_at"]
    assert any(p.startswith("ipykernel==") for p in gateway["packages"])


def test_descriptions_can_be_left_out(api, recorded):
    sid, _ = recorded
    nb = export(api, sid, descriptions="false")
    assert {c["cell_type"] for c in nb["cells"]} == {"code"}


def test_replay_reproduces_an_export(api, recorded):
    _, nb = recorded
    report = replay(api, nb)
    assert report["reproduced"], json.dumps(report["cells"], indent=1)
    assert report["summary"] == {"same": 5, "different": 0, "error": 0, "skipped": 0}
    assert [c["result"] for c in report["cells"]] == ["same"] * 5
    assert report["warnings"] == []
    executed = report["notebook"]
    nbformat.validate(nbformat.from_dict(executed))
    assert "image/png" in executed["cells"][4]["outputs"][0]["data"]


def test_changed_output_is_reported_with_the_cell_and_a_diff(api, recorded):
    _, nb = recorded
    changed = copy.deepcopy(nb)
    changed["cells"][2]["outputs"][0]["text"] = "x is 21\n"
    report = replay(api, changed)
    assert not report["reproduced"]
    different = [c for c in report["cells"] if c["result"] != "same"]
    assert [(c["index"], c["result"]) for c in different] == [(2, "different")]
    assert "-x is 21" in different[0]["diff"] and "+x is 20" in different[0]["diff"]


def test_a_cell_that_now_fails_is_an_error(api, recorded):
    _, nb = recorded
    changed = copy.deepcopy(nb)
    changed["cells"][1]["source"] = "raise RuntimeError('broken')"
    report = replay(api, changed)
    assert report["cells"][0]["result"] == "error" and report["cells"][0]["status"] == "error"
    assert not report["reproduced"]


def test_replay_warns_when_the_image_differs(api, recorded):
    _, nb = recorded
    changed = copy.deepcopy(nb)
    changed["metadata"]["sbx"]["image_digest"] = "sha256:" + "0" * 64
    changed["metadata"]["sbx"]["image"] = "sbx/python:000000000000"
    report = replay(api, changed)
    assert report["reproduced"]
    assert any("not available here" in w for w in report["warnings"]), report["warnings"]
    assert any("image digest differs" in w for w in report["warnings"]), report["warnings"]


@pytest.mark.parametrize(
    "image",
    [
        "../containers/{container}",  # GET /images/../containers/<name>/json: a container
        "../containers/json",
        "debian:bookworm-slim",  # not an image the gateway builds
        "sbx/python:x/../../../info",
        42,
    ],
)
def test_a_recorded_image_is_checked_before_the_engine_sees_it(api, session, image):
    """The notebook's image names no engine endpoint: a bad one is a warning, not a lookup."""
    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "sbx": {"image": image},
            "kernelspec": {"name": "python3", "display_name": "Python 3"},
        },
        "cells": [{"cell_type": "code", "id": "c1", "source": "1 + 1", "metadata": {},
                   "outputs": [], "execution_count": None}],
    }  # fmt: skip
    if isinstance(image, str):
        nb["metadata"]["sbx"]["image"] = image.format(container=f"sbx-{session['id']}")
    report = replay(api, nb)
    assert report["image"] == session["image"], report
    assert any("not available here" in w for w in report["warnings"]), report["warnings"]


def test_export_works_after_the_session_is_deleted(api, new_session):
    sid = new_session()["id"]
    run(api, sid, "print('kept')")
    assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    nb = export(api, sid)
    assert nb["metadata"]["sbx"]["state"] == "deleted" and nb["metadata"]["sbx"]["ended_at"]
    assert nb["cells"][0]["outputs"][0]["text"] == "kept\n"


def test_timeouts_and_interrupts_are_flagged(api, session):
    run(api, session["id"], "while True: pass", timeout=1)
    cell = export(api, session["id"])["cells"][0]
    assert cell["metadata"]["sbx"]["status"] == "timeout"
    assert cell["metadata"]["sbx"]["error"]["ename"] == "ExecutionTimeout"
    assert "raises-exception" in cell["metadata"]["tags"]


def test_bad_notebook_is_a_400(api):
    r = api.post("/v1/notebooks/replay", content=b'{"cells": 3}')
    assert r.status_code == 400 and "not a valid nbformat v4 notebook" in r.text
    r = api.post("/v1/notebooks/replay?image_tolerance=7", content=b"{}")
    assert r.status_code == 400 and "image_tolerance" in r.text
    r = api.get("/v1/sessions/missing/notebook")
    assert r.status_code == 404


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_shipped_examples_replay(api, path):
    nb = json.loads(path.read_text())
    nbformat.validate(nbformat.from_dict(nb))
    report = replay(api, nb)
    assert report["reproduced"], json.dumps(report["cells"], indent=1)


def test_examples_are_there():
    assert {p.stem for p in EXAMPLES} >= {"sales-analysis", "error-midway"}


def test_export_runs_in_stock_nbclient_with_a_local_kernel(api, session):
    from nbclient import NotebookClient

    sid = session["id"]
    run(api, sid, "values = [3, 1, 2]\nprint(sorted(values))")
    run(api, sid, "values['a']")
    run(api, sid, "sum(values)")
    nb = nbformat.from_dict(export(api, sid))
    NotebookClient(nb, kernel_name="python3", timeout=60).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].outputs[0]["text"] == "[1, 2, 3]\n"
    assert code[1].outputs[0]["ename"] == "TypeError"
    assert code[2].outputs[0]["data"]["text/plain"] == "6"


def test_cli_export_and_replay(gateway, recorded, tmp_path):
    sid, _ = recorded
    cli = [sys.executable, "-m", "gateway.cli"]
    path = tmp_path / "s.ipynb"
    client = ["--url", gateway.url, "--token", gateway.token]
    subprocess.run([*cli, "export", sid, "-o", str(path), *client], check=True)
    ok = subprocess.run([*cli, "replay", str(path), *client], capture_output=True)
    assert ok.returncode == 0, ok.stdout.decode() + ok.stderr.decode()
    assert b"reproduced (5 same" in ok.stdout
    assert (tmp_path / "s.replayed.ipynb").exists()
    nb = json.loads(path.read_text())
    nb["cells"][2]["outputs"][0]["text"] = "changed\n"
    path.write_text(json.dumps(nb))
    bad = subprocess.run([*cli, "replay", str(path), *client], capture_output=True)
    assert bad.returncode == 1 and b"did NOT reproduce" in bad.stdout
    assert b"different" in bad.stdout and b"+x is 20" in bad.stdout
