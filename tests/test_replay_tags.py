"""Cell tags in nbval's spirit: skip a cell, ignore its outputs, compare floats within a
tolerance; the comparison rules as units, and a replay that honours the tags."""

from __future__ import annotations

import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output


@pytest.mark.docker
def test_a_replay_honours_skip_ignore_output_and_tolerance_tags(api):
    def cell(source: str, text: str, *tags: str):
        c = new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
        c.outputs = [new_output("stream", name="stdout", text=text)]
        return c

    nb = new_notebook(
        cells=[
            cell("raise SystemExit('would fail here')", "", "nbval-skip"),
            cell("import random; print(random.random())", "0.123\n", "nbval-ignore-output"),
            cell("print(0.1 + 0.2)", "0.3\n", "sbx-float-tolerance=1e-9"),
            cell("print(0.1 + 0.2)", "0.3\n"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    report = api.post("/v1/notebooks/replay", json=nb).json()
    verdicts = [(c["index"], c["result"]) for c in report["cells"]]
    assert verdicts == [(0, "skipped"), (1, "same"), (2, "same"), (3, "different")], report
    assert report["summary"]["skipped"] == 1 and not report["reproduced"]
