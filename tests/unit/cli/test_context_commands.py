"""``sbx contexts ls / create / restart / rm`` and ``sbx exec --context``: what they ask the
SDK for, what they print, and how an unknown session or context is reported."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import httpx
import pytest

from gateway.cli import commands
from gateway.cli.main import main
from gateway.client import Client
from gateway.client.models import CodeContext
from gateway.client.settings import ClientSettings


def context(context_id: str, state: str = "running") -> CodeContext:
    doc = {"id": context_id, "kernel": "python3", "language": "python",
           "cwd": "/workspace/work", "state": state}  # fmt: skip
    return CodeContext.from_json(doc)


class FakeSession:
    def __init__(self, calls: list[tuple], session_id: str) -> None:
        self.calls = calls
        self.id = session_id

    def contexts(self):
        self.calls.append(("contexts", self.id))
        return [context("default"), context("3f9c0a1e", "stopped")]

    def create_context(self, *, kernel=None, language=None, cwd=None):
        self.calls.append(("create", self.id, kernel, language, cwd))
        return context("3f9c0a1e")

    def restart_context(self, context_id):
        self.calls.append(("restart", self.id, context_id))
        return context(context_id)

    def remove_context(self, context_id):
        self.calls.append(("remove", self.id, context_id))

    def run(self, code, **options):
        self.calls.append(("run", self.id, code, options.get("context")))
        why = "the session was paused to disk" if options.get("context") else None
        ran_in = {"id": options.get("context"), "kernel": "python3", "restarted": why}
        return SimpleNamespace(ok=True, raw={"status": "ok", "context": ran_in})


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def session(self, session_id: str) -> FakeSession:
        return FakeSession(self.calls, session_id)


@pytest.fixture
def client(use_client):
    return use_client(FakeClient())


def test_create_prints_the_new_contexts_id(client, sbx, capsys):
    assert sbx("contexts", "create", "s1", "--language", "python", "--cwd", "work") == 0
    assert sbx("contexts", "create", "s1", "--kernel", "xpython") == 0
    assert client.calls == [
        ("create", "s1", None, "python", "work"),
        ("create", "s1", "xpython", None, None),
    ]
    assert capsys.readouterr().out.split() == ["3f9c0a1e", "3f9c0a1e"]


def test_create_takes_a_kernel_or_a_language_not_both(client, sbx, capsys):
    with pytest.raises(SystemExit):
        sbx("contexts", "create", "s1", "--kernel", "python3", "--language", "python")
    assert "not allowed with argument" in capsys.readouterr().err
    assert client.calls == []


def test_ls_lists_each_context_and_json_gives_their_records(client, sbx, capsys):
    assert sbx("contexts", "ls", "s1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["default", "python3", "python", "running"],
        ["3f9c0a1e", "python3", "python", "stopped"],
    ]
    assert sbx("contexts", "ls", "s1", "--json") == 0
    assert [c["id"] for c in json.loads(capsys.readouterr().out)] == ["default", "3f9c0a1e"]


def test_restart_and_rm(client, sbx, capsys):
    assert sbx("contexts", "restart", "s1", "3f9c0a1e") == 0
    assert sbx("contexts", "rm", "s1", "3f9c0a1e", "--json") == 0
    assert client.calls == [("restart", "s1", "3f9c0a1e"), ("remove", "s1", "3f9c0a1e")]
    assert json.loads(capsys.readouterr().out) == {"deleted": ["3f9c0a1e"]}


def test_exec_runs_in_the_context_given(client, sbx, capsys):
    assert sbx("exec", "s1", "x = 1", "--context", "3f9c0a1e", "--json") == 0
    assert sbx("exec", "s1", "x = 2", "--json") == 0
    assert client.calls == [("run", "s1", "x = 1", "3f9c0a1e"), ("run", "s1", "x = 2", None)]


def test_exec_says_when_its_context_started_empty(client, sbx, capsys):
    assert sbx("exec", "s1", "x", "--context", "3f9c0a1e", "-q") == 0
    said = capsys.readouterr().err
    assert "context 3f9c0a1e started empty: the session was paused to disk" in said


def refusing(code: str, message: str):
    """A client whose gateway answers every request 404 with ``code``."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"code": code, "message": message}})

    def make(settings: ClientSettings) -> Client:
        made = Client(settings.url, settings.token)
        made._http = httpx.Client(base_url=settings.url, transport=httpx.MockTransport(answer))
        return made

    return make


@pytest.mark.parametrize(
    "argv",
    [
        ["contexts", "ls", "nope"],
        ["contexts", "create", "nope"],
        ["contexts", "restart", "s1", "gone"],
        ["contexts", "rm", "s1", "gone"],
    ],
)
def test_an_unknown_session_or_context_exits_2_saying_so(argv, monkeypatch, capsys):
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))  # main() sets them
    said = "context 'gone' does not exist in session s1; GET /v1/sessions/s1/contexts lists them"
    monkeypatch.setattr(commands, "_client", refusing("not_found", said))
    assert main([*argv, "--url", "http://gw.test", "--token", "t"]) == 2
    assert capsys.readouterr().err.strip() == f"sbx: {said}"
