"""The SDK where E2B users expect it: E2B's names where the meaning matches, no silent
surprise where it differs, results that show themselves in Jupyter, directories."""

from __future__ import annotations

import time

import pytest
from test_client import _seconds_between, client, sdk_session, token  # noqa: F401 (fixtures)

from gateway.client import Execution, RecordedExecution, ReplayReport, Result
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


@pytest.mark.docker
def test_set_timeout_counts_from_now_as_in_e2b(sdk_session):  # noqa: F811
    time.sleep(3)
    info = sdk_session.set_timeout(5)
    left = _seconds_between(info.last_activity, info.expires_at)
    assert 4.5 < left <= 5.5, f"set_timeout(5) left the session {left} s, not 5 s from now"
    info = sdk_session.set_ttl(900, idle_timeout=300)  # the API's own meaning: from creation
    assert (info.ttl, info.idle_timeout) == (900, 300)


@pytest.mark.docker
def test_e2b_names_where_the_meaning_matches(sdk_session, tmp_path):  # noqa: F811
    assert sdk_session.sandbox_id == sdk_session.id
    assert sdk_session.get_info().id == sdk_session.id
    execution = sdk_session.run_code("print('hi'); 6 * 7")
    assert execution.text == "42" and execution.logs.stdout == ["hi\n"]
    sdk_session.files.write("a/b.txt", "x")
    assert sdk_session.files.exists("a/b.txt") and sdk_session.files.exists("a")
    assert not sdk_session.files.exists("a/nope.txt") and not sdk_session.files.exists("zz/y")


@pytest.mark.docker
def test_directories_go_up_and_come_down_whole(sdk_session, tmp_path):  # noqa: F811
    source = tmp_path / "inputs"
    (source / "deep").mkdir(parents=True)
    (source / "one.csv").write_text("a,b\n")
    (source / "deep" / "two.bin").write_bytes(bytes(range(256)))
    uploaded = sdk_session.files.upload_dir(source, "data")
    assert sorted(f.path for f in uploaded) == ["data/deep/two.bin", "data/one.csv"]
    assert sdk_session.run_code("open('data/deep/two.bin','rb').read()[-1]").text == "255"
    back = sdk_session.files.download_dir("data", tmp_path / "back")
    assert (back / "one.csv").read_text() == "a,b\n"
    assert (back / "deep" / "two.bin").read_bytes() == bytes(range(256))


@pytest.mark.docker
def test_history_and_replay_results_are_typed(sdk_session, client):  # noqa: F811
    sdk_session.run("x = 6", description="# set")
    sdk_session.run("x * 7")
    first, second = sdk_session.history()
    assert isinstance(first, RecordedExecution) and first.description == "# set"
    assert second.code == "x * 7" and second.text == "42" and second.id > first.id
    report = client.replay(sdk_session.export())
    assert isinstance(report, ReplayReport) and report.reproduced, report
    assert [c.result for c in report.cells] == ["same", "same"]
    assert report.summary["same"] == 2 and report.notebook["cells"]
