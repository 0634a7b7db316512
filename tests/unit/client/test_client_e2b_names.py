"""The SDK where E2B users expect it, with no gateway: an E2B-only meaning refused,
results that show themselves in Jupyter."""

from __future__ import annotations

import pytest

from gateway.client import Execution, Result
from gateway.client.base import session_request

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/"
    "PchI7wAAAABJRU5ErkJggg=="
)


def test_create_timeout_is_refused_rather_than_taken_for_another_meaning():
    # E2B's Sandbox.create(timeout=300) is a lifetime; here it was each run's limit, silently.
    with pytest.raises(TypeError, match=r"ttl=.*execution_timeout="):
        session_request({"timeout": 300})
    assert session_request({"execution_timeout": 30, "ttl": 300}) == {
        "ttl": 300,
        "limits": {"timeout": 30},
    }


def test_results_show_themselves_in_jupyter():
    result = Result({"text/plain": "<chart>", "image/png": PNG, "text/html": "<b>hi</b>"})
    bundle, metadata = result._repr_mimebundle_()  # IPython's (data, metadata) form
    assert bundle == result.data and bundle is not result.data and metadata == {}
    assert result._repr_png_().startswith(b"\x89PNG")
    assert result._repr_html_() == "<b>hi</b>"
    assert Result({"text/plain": "1"})._repr_png_() is None
    execution = Execution.from_json(
        {"status": "ok", "outputs": [
            {"output_type": "stream", "name": "stdout", "text": "out\n"},
            {"output_type": "execute_result", "data": {"text/plain": "42"}, "metadata": {}},
        ]}
    )  # fmt: skip
    assert execution._repr_mimebundle_() == ({"text/plain": "42"}, {})
    assert execution.logs.stdout == ["out\n"] and execution.logs.stderr == []
