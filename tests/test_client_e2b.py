"""The SDK where E2B users expect it: E2B's names where the meaning matches, no silent
surprise where it differs, results that show themselves in Jupyter, directories."""

from __future__ import annotations

import time

import pytest
from test_client import _seconds_between, client, sdk_session, token  # noqa: F401 (fixtures)

from gateway.client import RecordedExecution, ReplayReport


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
