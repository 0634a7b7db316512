"""Code contexts over /v1 and the SDK (both halves): more kernels in one session's sandbox.

On the shared gateway; the stock E2B SDK's side is in test_e2b.py.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.client import AsyncClient, Client
from gateway.errors import NotFound

pytestmark = pytest.mark.docker


def test_v1_contexts_run_apart_and_export_a_notebook_each(api, session) -> None:
    sid = session["id"]
    base = f"/v1/sessions/{sid}/contexts"
    r = api.post(base, json={"language": "python", "cwd": "/workspace/work"})
    assert r.status_code == 201, r.text
    ctx = r.json()
    assert (ctx["kernel"], ctx["cwd"], ctx["state"]) == ("python3", "/workspace/work", "running")
    run = lambda code, context=None: api.post(  # noqa: E731
        f"/v1/sessions/{sid}/execute", json={"code": code, "context": context}
    ).json()
    run("x = 'default'")
    assert run("x = 'ctx'\nx", ctx["id"])["context"] == {
        "id": ctx["id"], "kernel": "python3", "restarted": None,
    }  # fmt: skip
    assert run("x")["outputs"][0]["data"]["text/plain"] == "'default'"
    r = api.post(
        f"/v1/sessions/{sid}/execute",
        json={
            "code": "import time\nwhile True: time.sleep(0.05)",
            "context": ctx["id"],
            "timeout": 1,
        },
    ).json()  # interrupted in its own kernel, its state kept
    assert r["status"] == "timeout" and not r["error"]["kernel_restarted"], r
    assert run("x", ctx["id"])["outputs"][0]["data"]["text/plain"] == "'ctx'"
    listed = api.get(base).json()["contexts"]
    assert [c["id"] for c in listed] == ["default", ctx["id"]]
    assert [c["id"] for c in api.get(f"/v1/sessions/{sid}").json()["contexts"]] == [ctx["id"]]

    own = api.get(f"/v1/sessions/{sid}/notebook").json()
    theirs = api.get(f"/v1/sessions/{sid}/notebook", params={"context": ctx["id"]}).json()
    assert [c["source"] for c in own["cells"]] == ["x = 'default'", "x"]
    assert own["metadata"]["sbx"]["contexts"] == [ctx["id"]]
    assert theirs["cells"][0]["source"] == "x = 'ctx'\nx"
    assert theirs["metadata"]["sbx"]["context"] == ctx["id"]
    assert theirs["metadata"]["kernelspec"]["name"] == "python3"

    for bad, status, code in (
        ({"language": "cobol"}, 400, "bad_request"),
        ({"cwd": "/etc"}, 400, "bad_request"),
        ({"cwd": "../.."}, 400, "bad_request"),
        ({"colour": "red"}, 400, "bad_request"),
    ):
        r = api.post(base, json=bad)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (bad, r.text)
    assert "python (python3), python (xpython)" in api.post(base, json={"language": "r"}).text
    r = api.post(f"/v1/sessions/{sid}/execute", json={"code": "1", "context": "../x"})
    assert r.status_code == 404 and "does not exist" in r.text

    assert api.post(f"{base}/{ctx['id']}/restart").json()["state"] == "running"
    assert run("'x' in dir()", ctx["id"])["outputs"][0]["data"]["text/plain"] == "False"
    assert api.delete(f"{base}/{ctx['id']}").status_code == 204
    assert api.get(f"{base}/{ctx['id']}").status_code == 404
    assert api.delete(f"{base}/default").status_code == 400


def test_the_sdk_runs_code_in_contexts_both_halves(gateway) -> None:
    token = getattr(gateway, "token", "")
    with Client(gateway.url, token) as client, client.create_session() as s:
        ctx = s.create_context(kernel="xpython")
        s.run("y = 1")
        assert s.run("'y' in dir()", context=ctx).text == "False"
        assert [c.id for c in s.contexts()] == ["default", ctx.id]
        assert s.export(context=ctx)["metadata"]["kernelspec"]["name"] == "xpython"
        s.remove_context(ctx)
        with pytest.raises(NotFound):
            s.run("1", context=ctx)

    async def halves() -> None:
        async with AsyncClient(gateway.url, token) as client:
            async with await client.create_session() as s:
                first = await s.create_code_context()
                await s.run("z = 2", context=first)
                await s.restart_code_context(first)
                assert (await s.run("'z' in dir()", context=first)).text == "False"

    asyncio.run(halves())


def test_a_freeze_keeps_a_context_and_a_pause_to_disk_restarts_it_empty(api, session) -> None:
    sid = session["id"]
    ctx = api.post(f"/v1/sessions/{sid}/contexts", json={}).json()["id"]

    def run(code: str) -> dict:
        r = api.post(f"/v1/sessions/{sid}/execute", json={"code": code, "context": ctx})
        assert r.status_code == 200, r.text
        return r.json()

    run("kept = 1")
    assert api.post(f"/v1/sessions/{sid}/pause", json={}).json()["strategy"] == "freeze"
    kept = run("kept")  # resumes the sandbox first, its context's kernel with it
    assert kept["outputs"][0]["data"]["text/plain"] == "1" and kept["context"]["restarted"] is None
    r = api.post(f"/v1/sessions/{sid}/pause", json={"strategy": "namespace"})
    assert r.status_code == 200, r.text
    view = api.get(f"/v1/sessions/{sid}/contexts/{ctx}").json()
    assert view["state"] == "stopped" and "paused to disk" in view["stopped"], view
    again = run("'kept' in dir()")
    assert again["outputs"][0]["data"]["text/plain"] == "False"
    assert "paused to disk" in again["context"]["restarted"]
