"""The SDK's per-run environment variables and ``files.rename`` / ``files.make_dir``, in
both halves, against a real gateway; and the two /v1 routes under them."""

from __future__ import annotations

import asyncio

import pytest

from gateway.client import AsyncClient, Client
from gateway.errors import Conflict, FileNotFound

pytestmark = pytest.mark.docker

SHOW = "import os; print(os.environ.get('RUN_COLOUR', 'unset'))"


def test_run_takes_environment_variables_for_that_run_only(gateway):
    with Client(gateway.url, gateway.token) as client, client.create_session() as session:
        assert session.run(SHOW, env={"RUN_COLOUR": "teal"}).stdout == "teal\n"
        assert session.run(SHOW).stdout == "unset\n", "a run's env outlived the run"
        assert session.run_code(SHOW, envs={"RUN_COLOUR": "red"}).stdout == "red\n"  # E2B's name


def test_files_make_dir_and_rename(gateway):
    with Client(gateway.url, gateway.token) as client, client.create_session() as session:
        files = session.files
        assert files.make_dir("results/2026/11") is True
        assert files.make_dir("results/2026/11") is False  # already there, as E2B answers
        assert [(e.name, e.type) for e in files.list("results/2026")] == [("11", "directory")]

        files.write("draft.csv", "a,b\n1,2\n")
        moved = files.rename("draft.csv", "archive/final.csv")  # parents are made
        assert (moved.path, moved.type, moved.size) == ("archive/final.csv", "file", 8)
        assert not files.exists("draft.csv")
        assert files.read("archive/final.csv") == b"a,b\n1,2\n"
        assert files.rename("results", "old-results").type == "directory"
        assert files.exists("old-results/2026/11")

        with pytest.raises(FileNotFound, match=r"nothing\.csv"):
            files.rename("nothing.csv", "x.csv")
        with pytest.raises(Conflict, match="not a directory"):
            files.make_dir("archive/final.csv")


def test_the_routes_say_what_a_bad_request_lacks(api, session):
    sid = session["id"]
    r = api.post(f"/v1/sessions/{sid}/rename", json={"from": "a.txt"})
    assert r.status_code == 400 and "'to' must be a workspace path" in r.json()["error"]["message"]
    r = api.post(f"/v1/sessions/{sid}/directories", json={"path": ""})
    assert (
        r.status_code == 400 and "'path' must be a workspace path" in r.json()["error"]["message"]
    )
    r = api.post(f"/v1/sessions/{sid}/directories", json={"path": "../outside"})
    assert r.status_code in (400, 403), r.text
    r = api.post(f"/v1/sessions/{sid}/directories", json={"path": "d", "parents": True})
    assert r.status_code == 400 and "unknown field(s) ['parents']" in r.text, r.text
    r = api.post(f"/v1/sessions/{sid}/rename", json={"from": "a", "to": "b", "force": 1})
    assert r.status_code == 400 and "unknown field(s) ['force']" in r.text, r.text


def test_the_async_half_mirrors_it(gateway):
    async def run() -> None:
        async with AsyncClient(gateway.url, gateway.token) as client:
            async with client.create_session() as session:
                execution = await session.run(SHOW, env={"RUN_COLOUR": "amber"})
                assert execution.stdout == "amber\n"
                assert (await session.run_code(SHOW, envs={"RUN_COLOUR": "b"})).stdout == "b\n"
                assert (await session.run(SHOW)).stdout == "unset\n"
                assert await session.files.make_dir("in/raw") is True
                assert await session.files.make_dir("in/raw") is False
                await session.files.write("in/raw/x.txt", b"x")
                moved = await session.files.rename("in/raw/x.txt", "in/x.txt")
                assert moved.path == "in/x.txt" and await session.files.exists("in/x.txt")

    asyncio.run(run())


def test_download_dir_makes_the_local_parents(gateway, tmp_path):
    """docs/sdk.md's download_dir("results", "local/results") failed: no local/ yet."""
    with Client(gateway.url, gateway.token) as client, client.create_session() as session:
        session.files.write("results/r.txt", "r")
        dest = session.files.download_dir("results", tmp_path / "local" / "results")
        assert (dest / "r.txt").read_text() == "r"

        async def run() -> None:
            async with AsyncClient(gateway.url, gateway.token) as aclient:
                asession = aclient.session(session.id)
                got = await asession.files.download_dir("results", tmp_path / "a" / "b")
                assert (got / "r.txt").read_text() == "r"

        asyncio.run(run())
