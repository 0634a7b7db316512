"""Kernels that come back: a session that asks survives its kernel's death with its checkpoint."""

from __future__ import annotations

import signal
import time

import pytest
from helpers import Canary, canary_session, full_history, run, text_of, wait_for

pytestmark = pytest.mark.docker


def view(api, sid: str) -> dict:
    return api.get(f"/v1/sessions/{sid}").json()


def test_a_kernel_that_dies_comes_back_with_its_checkpoint_and_says_what_was_lost(api, new_session):
    sid = new_session(survive_crashes=True, limits={"memory": "256m"})["id"]
    run(api, sid, "x = 41\ngen = (i for i in range(3))")
    checkpointed = lambda: (view(api, sid)["checkpoint"] or {}).get("execution_count") == 1  # noqa: E731
    assert wait_for(checkpointed, 20), f"no checkpoint was taken: {view(api, sid)['checkpoint']}"
    run(api, sid, "y = 1")
    died = api.post(f"/v1/sessions/{sid}/execute", json={"code": "import os; os._exit(1)"}).json()
    recovery = died["error"]["recovery"]
    assert recovery["from_execution"] == 1 and recovery["lost_cells"] == [2, 3], died
    assert [entry["name"] for entry in recovery["lost"]] == ["gen"], recovery
    assert "comes back with its checkpoint after cell 1" in died["error"]["evalue"], died
    assert wait_for(lambda: view(api, sid)["state"] == "idle", 60), view(api, sid)
    recovered = view(api, sid)["recovered"]
    assert recovered["lost_cells"] == [2, 3] and recovered["reason"], recovered
    reply = run(api, sid, "print(x + 1, 'y' in globals())")
    assert text_of(reply) == "42 False\n" and reply["execution_count"] == 4, reply
    assert full_history(api, sid)[2]["error"]["recovery"]["lost_cells"] == [2, 3]
    # Out of memory: the same, from the same checkpoint.
    died = run(api, sid, "b = bytearray(600 * 2**20)")
    assert died["error"]["recovery"]["lost_cells"] == [2, 3, 4, 5], died
    assert "memory" in died["error"]["evalue"], died
    assert wait_for(lambda: view(api, sid)["state"] == "idle", 60), view(api, sid)
    assert text_of(run(api, sid, "print(x)")) == "41\n"


def test_a_session_that_did_not_ask_stays_dead(api, new_session):
    sid = new_session()["id"]
    run(api, sid, "x = 1")
    died = api.post(f"/v1/sessions/{sid}/execute", json={"code": "import os; os._exit(1)"}).json()
    assert "recovery" not in died["error"] and "restart the session" in died["error"]["evalue"]
    assert view(api, sid)["state"] == "dead" and view(api, sid)["checkpoint"] is None


def test_a_checkpoint_past_its_bound_is_refused_and_the_last_one_kept(start_gateway):
    gw = start_gateway("--checkpoint-max-size", "1m", "--checkpoint-every", "0")
    api = gw.client
    sid = api.post("/v1/sessions", json={"survive_crashes": True}).json()["id"]
    with canary_session(gw) as canary, Canary(gw, canary):
        run(api, sid, "x = 41")
        first = lambda: (view(api, sid)["checkpoint"] or {}).get("execution_count") == 1  # noqa: E731
        assert wait_for(first, 20), view(api, sid)["checkpoint"]
        run(api, sid, "big = bytes(8 * 2**20)")
        refused = lambda: "refused" in (view(api, sid)["checkpoint"] or {})  # noqa: E731
        assert wait_for(refused, 20), view(api, sid)["checkpoint"]
        checkpoint = view(api, sid)["checkpoint"]
        assert checkpoint["refused"] == "its namespace is larger than 1 MiB", checkpoint
        assert checkpoint["execution_count"] == 1, "the last checkpoint was not kept"
        died = run(api, sid, "import os; os._exit(1)")
        assert died["error"]["recovery"]["lost_cells"] == [2, 3], died
        assert wait_for(lambda: view(api, sid)["state"] == "idle", 60), view(api, sid)
        assert text_of(run(api, sid, "print(x, 'big' in globals())")) == "41 False\n"


def test_a_restart_drops_the_checkpoint_so_a_later_death_brings_back_nothing_from_before(
    api, new_session
):
    sid = new_session(survive_crashes=True)["id"]
    run(api, sid, "x = 41")
    checkpointed = lambda: (view(api, sid)["checkpoint"] or {}).get("execution_count") == 1  # noqa: E731
    assert wait_for(checkpointed, 20), view(api, sid)["checkpoint"]
    assert api.post(f"/v1/sessions/{sid}/restart").status_code == 200
    assert view(api, sid)["checkpoint"] is None, "the restart threw the state away"
    died = run(api, sid, "import os; os._exit(1)")
    assert "recovery" not in died["error"], f"the state a restart discarded came back: {died}"
    assert "restart the session" in died["error"]["evalue"], died
    assert view(api, sid)["state"] == "dead", view(api, sid)


def test_a_checkpoint_whose_load_kills_the_kernel_leaves_it_dead_at_once_with_the_reason(
    api, new_session
):
    sid = new_session(survive_crashes=True)["id"]
    run(
        api,
        sid,
        "import os\nclass Bomb:\n    def __reduce__(self): return (os._exit, (3,))\nb = Bomb()",
    )
    checkpointed = lambda: (view(api, sid)["checkpoint"] or {}).get("execution_count") == 1  # noqa: E731
    assert wait_for(checkpointed, 20), view(api, sid)["checkpoint"]
    died = run(api, sid, "import os; os._exit(1)")
    assert died["error"]["recovery"]["from_execution"] == 1, died
    # It was 'starting' for 300 s, holding every execute sent meanwhile.
    assert wait_for(lambda: view(api, sid)["state"] == "dead", 20), view(api, sid)
    assert "could not come back" in view(api, sid)["reason"], view(api, sid)
    assert api.post(f"/v1/sessions/{sid}/restart").status_code == 200
    assert text_of(run(api, sid, "print('b' in globals())")) == "False\n"


def test_a_gateway_killed_while_a_kernel_comes_back_keeps_the_session(start_gateway):
    gw = start_gateway(
        "--checkpoint-every", "0", "--checkpoint-idle-after", "0.2", keep_sessions=True
    )
    api = gw.client
    sid = api.post("/v1/sessions", json={"survive_crashes": True}).json()["id"]
    slow = "import time\nclass Slow:\n    def __reduce__(self): return (time.sleep, (4,))"
    run(api, sid, f"x = 41\n{slow}\ns = Slow()")  # its load takes 4 s
    checkpointed = lambda: (view(api, sid)["checkpoint"] or {}).get("execution_count") == 1  # noqa: E731
    assert wait_for(checkpointed, 20), view(api, sid)["checkpoint"]
    died = run(api, sid, "import os; os._exit(1)")
    assert died["error"]["recovery"]["from_execution"] == 1, died
    assert wait_for(lambda: view(api, sid)["state"] == "starting", 10), view(api, sid)
    time.sleep(1.5)  # the dying execute's record is saved within 1 s, the comeback under way
    gw.stop(signal.SIGKILL)
    again = start_gateway(data_dir=gw.data_dir, keep_sessions=True)
    session = again.client.get(f"/v1/sessions/{sid}").json()
    # It was ended, its workspace removed: recovery took it for a create cut short.
    assert session["state"] in ("dead", "starting"), f"the restart ended it: {session}"
    back = lambda: again.client.get(f"/v1/sessions/{sid}").json()["state"] == "idle"  # noqa: E731
    assert wait_for(back, 30), again.client.get(f"/v1/sessions/{sid}").json()
    assert text_of(run(again.client, sid, "print(x)")) == "41\n"


def test_a_session_paused_and_resumed_still_comes_back_after_a_death(api, new_session):
    sid = new_session(survive_crashes=True)["id"]
    run(api, sid, "x = 41")
    checkpointed = lambda: (view(api, sid)["checkpoint"] or {}).get("execution_count") == 1  # noqa: E731
    assert wait_for(checkpointed, 20), view(api, sid)["checkpoint"]
    # Saved to disk at once, resumed in a pooled sandbox: the checkpoint beside the workspace
    # stayed in the old directory, and the death was promised a comeback that failed.
    paused = api.post(f"/v1/sessions/{sid}/pause", json={"strategy": "namespace"})
    assert paused.status_code == 200, paused.text
    assert api.post(f"/v1/sessions/{sid}/resume").status_code == 200
    died = run(api, sid, "import os; os._exit(1)")
    assert "recovery" in died["error"], died
    assert wait_for(lambda: view(api, sid)["state"] != "starting", 30), view(api, sid)
    assert view(api, sid)["state"] == "idle", (
        f"it was promised back, and stayed dead: {view(api, sid)}"
    )
    assert text_of(run(api, sid, "print(x)")) == "41\n"
