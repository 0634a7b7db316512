"""Running code in a session: state, streams, rich results, errors."""

from __future__ import annotations

import base64

import pytest
from helpers import run, text_of

pytestmark = pytest.mark.docker


def test_state_persists_between_executes(api, session):
    first = run(api, session["id"], "x = 41")
    assert first["status"] == "ok", first
    reply = run(api, session["id"], "x + 1")
    results = [o for o in reply["outputs"] if o["output_type"] == "execute_result"]
    assert results, f"expected an execute_result for `x + 1`, got {reply['outputs']}"
    assert results[0]["data"]["text/plain"] == "42"
    assert reply["execution_count"] == results[0]["execution_count"] == 2
    assert reply["error"] is None and reply["duration_ms"] > 0


def test_stdout_and_stderr_are_separate_streams(api, session):
    reply = run(api, session["id"], "import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert text_of(reply, "stdout") == "out\n"
    assert text_of(reply, "stderr") == "err\n"


def test_exception_returns_error_output_and_session_stays_usable(api, session):
    reply = run(api, session["id"], "y = 1\n1 / 0")
    assert reply["status"] == "error"
    assert reply["error"]["ename"] == "ZeroDivisionError"
    assert "division by zero" in reply["error"]["evalue"]
    errors = [o for o in reply["outputs"] if o["output_type"] == "error"]
    assert errors and errors[0]["traceback"], "the error output must carry a traceback"
    assert run(api, session["id"], "print(y + 1)")["outputs"][0]["text"] == "2\n"


def test_matplotlib_figure_comes_back_as_png(api, session):
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()"
    reply = run(api, session["id"], code)
    assert reply["status"] == "ok", reply
    images = [o for o in reply["outputs"] if "image/png" in o.get("data", {})]
    assert images, f"no image/png output for a plot; outputs were {reply['outputs']}"
    assert images[0]["output_type"] == "display_data"
    assert base64.b64decode(images[0]["data"]["image/png"]).startswith(b"\x89PNG")


def test_html_table_from_pandas(api, session):
    reply = run(api, session["id"], "import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    data = reply["outputs"][-1]["data"]
    assert "<table" in data["text/html"] and "text/plain" in data


def test_outputs_are_valid_nbformat(api, session):
    import nbformat

    reply = run(api, session["id"], "print('hi')\n{'a': 1}")
    cell = nbformat.v4.new_code_cell("x", outputs=reply["outputs"])
    nb = nbformat.v4.new_notebook(cells=[cell])
    nbformat.validate(nb)
