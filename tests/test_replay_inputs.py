"""Replay that brings its inputs: exports record every upload (path, size, sha256), a bundle
carries them, and a replay uploads them (hash-checked) before the first cell runs."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest
from test_cli import sbx
from test_examples import example

pytestmark = pytest.mark.docker

CSV = "region,sales\nnorth,10\nsouth,32\n"
READS = "import pandas as pd\ndf = pd.read_csv('data/sales.csv')\nprint(int(df.sales.sum()))"


@pytest.fixture
def analysis(gateway, new_session):
    """A session that uploaded two files and read them, as an analyst's does."""
    sid = new_session()["id"]
    api = gateway.client
    assert api.put(f"/v1/sessions/{sid}/files/data/sales.csv", content=CSV).status_code == 201
    assert api.put(f"/v1/sessions/{sid}/files/notes.txt", content=b"keep").status_code == 201
    for code in (READS, "print(open('notes.txt').read())"):
        r = api.post(f"/v1/sessions/{sid}/execute", json={"code": code})
        assert r.json()["status"] == "ok", r.text
    return sid


def test_the_export_records_every_upload(gateway, analysis):
    nb = gateway.client.get(f"/v1/sessions/{analysis}/notebook").json()
    inputs = {i["path"]: i for i in nb["metadata"]["sbx"]["inputs"]}
    assert set(inputs) == {"data/sales.csv", "notes.txt"}, inputs
    assert inputs["data/sales.csv"]["size"] == len(CSV)
    assert inputs["data/sales.csv"]["sha256"] == hashlib.sha256(CSV.encode()).hexdigest()


def test_a_bundle_replays_with_its_inputs(gateway, analysis, tmp_path):
    done = sbx("export", analysis, "--with-inputs", "-o", "a.zip", gateway=gateway, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(tmp_path / "a.zip") as bundle:
        names = set(bundle.namelist())
        assert {"notebook.ipynb", "inputs/data/sales.csv", "inputs/notes.txt"} <= names, names
        assert bundle.read("inputs/data/sales.csv").decode() == CSV
    replayed = sbx("replay", "a.zip", "--json", gateway=gateway, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["reproduced"] and sorted(report["inputs"]) == ["data/sales.csv", "notes.txt"]


def test_a_notebook_replays_with_inputs_from_a_directory(gateway, analysis, tmp_path):
    assert sbx("export", analysis, "-o", "a.ipynb", gateway=gateway, cwd=tmp_path).returncode == 0
    without = sbx("replay", "a.ipynb", gateway=gateway, cwd=tmp_path)
    assert without.returncode == 1, "a replay without its inputs reproduced"
    assert "data/sales.csv" in without.stdout and "--inputs" in without.stdout, without.stdout
    (tmp_path / "in" / "data").mkdir(parents=True)
    (tmp_path / "in" / "data" / "sales.csv").write_text(CSV)
    (tmp_path / "in" / "notes.txt").write_bytes(b"keep")
    done = sbx("replay", "a.ipynb", "--inputs", "in", gateway=gateway, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    (tmp_path / "in" / "data" / "sales.csv").write_text(CSV + "east,1\n")
    changed = sbx("replay", "a.ipynb", "--inputs", "in", gateway=gateway, cwd=tmp_path)
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "data/sales.csv" in changed.stderr and "sha256" in changed.stderr, changed.stderr


def test_the_data_analysis_example_replays_on_a_fresh_gateway(gateway, start_gateway, tmp_path):
    ran = example("data_analysis_agent.py", gateway, "--out", "out", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    fresh = start_gateway()
    done = sbx(
        "replay", "out/analysis.ipynb", "--inputs", "out/inputs", gateway=fresh, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reproduced" in done.stdout and "warning" not in done.stdout, done.stdout
