"""``sbx volumes get NAME PATH [LOCAL]`` streams a volume's file to disk, as ``sbx files get``.

A volume's file may be whatever a sandbox wrote there, e.g. a sparse file of
tens of gigabytes that costs the sandbox nothing; read whole into memory
first, it took the user's machine down with it.
"""

from __future__ import annotations

import argparse

import httpx

from gateway.cli import commands
from gateway.client import Client
from gateway.client.settings import ClientSettings
from gateway.client.sync import Files

BODY = b"x" * 100_000


def answer(request: httpx.Request) -> httpx.Response:
    assert request.url.path == "/v1/volumes/ds/files/out/big.bin"
    return httpx.Response(200, content=BODY, headers={"Content-Length": str(len(BODY))})


def _client(settings: ClientSettings) -> Client:
    client = Client(settings.url, settings.token)
    client._http = httpx.Client(base_url=settings.url, transport=httpx.MockTransport(answer))
    return client


def test_a_volume_file_is_streamed_to_its_local_file_never_held_whole(tmp_path, monkeypatch):
    def whole(*args, **kwargs):
        raise AssertionError("the file was read whole into memory")

    monkeypatch.setattr(Files, "read", whole)
    monkeypatch.setattr(commands, "_client", _client)
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(name="ds", remote="out/big.bin", local=None, json=False)
    assert commands.volumes_get(ClientSettings("http://gw", "t"), args) == 0
    assert (tmp_path / "big.bin").read_bytes() == BODY


class Stdout:
    """``sys.stdout`` with the binary buffer the commands write a file's bytes to."""

    def __init__(self) -> None:
        self.buffer = self
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.writes.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def test_a_file_sent_to_stdout_is_streamed_there_never_held_whole(monkeypatch):
    """``-`` as the local name (a pipe: ``sbx volumes get ds out/big.bin - | gzip``) read the
    file whole first, however big a sandbox had made it."""

    def whole(*args, **kwargs):
        raise AssertionError("the file was read whole into memory")

    def session_answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=BODY, headers={"Content-Length": str(len(BODY))})

    def session_client(settings: ClientSettings) -> Client:
        client = Client(settings.url, settings.token)
        transport = httpx.MockTransport(session_answer)
        client._http = httpx.Client(base_url=settings.url, transport=transport)
        return client

    monkeypatch.setattr(Files, "read", whole)
    for command, args, client in (
        (commands.volumes_get, argparse.Namespace(name="ds", remote="out/big.bin", local="-",
                                                  json=False), _client),
        (commands.files_get, argparse.Namespace(session="s1", remote="out/big.bin", local="-",
                                                json=False, format=None), session_client),
    ):  # fmt: skip
        out = Stdout()
        monkeypatch.setattr(commands, "_client", client)
        monkeypatch.setattr(commands.sys, "stdout", out)
        assert command(ClientSettings("http://gw", "t"), args) == 0
        assert b"".join(out.writes) == BODY
