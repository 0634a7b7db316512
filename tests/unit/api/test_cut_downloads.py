"""A download that breaks off after its headers reaches the client as broken, never whole.

The gateway sends a download's headers at once (an archive's first piece may
take a while), so a failure after them cannot be an error status; ending the
response as usual told the client it had the whole file, and the SDK kept a
truncated archive as complete. The real ``stream_file`` is served by Tornado
here; the SDK's ``copy_to`` and ``download`` read it.
"""

from __future__ import annotations

import asyncio
import io
import socket

import pytest
import tornado.httpserver
import tornado.web

from gateway.api.files import stream_file
from gateway.client.aio import AsyncClient, AsyncFiles
from gateway.client.base import VolumeOwner
from gateway.client.errors import GatewayUnreachable


class Failing:
    """An archive whose making fails after its first piece (a remote pull gone, an EIO)."""

    size, sha256 = 0, ""

    def __init__(self) -> None:
        self.pieces = 0

    async def __aenter__(self) -> Failing:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def read(self) -> bytes:
        self.pieces += 1
        if self.pieces == 1:
            return b"\x1f\x8b" + b"A" * 5000
        raise OSError("the sandbox's agent is gone")


class Download(tornado.web.RequestHandler):
    audit_detail: dict = {}

    async def get(self, path: str) -> None:
        self.set_header("Content-Type", "application/gzip")  # an archive: no Content-Length
        await stream_file(self, Failing())  # type: ignore[arg-type]


def test_an_archive_cut_after_its_headers_is_an_error_and_no_file_is_kept(tmp_path):
    async def scenario() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        server = tornado.httpserver.HTTPServer(
            tornado.web.Application([(r"/v1/volumes/v/files/(.*)", Download)])
        )
        server.add_sockets([sock])
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        try:
            async with AsyncClient(url, "t") as client:
                files = AsyncFiles(VolumeOwner(client, "v"))
                with pytest.raises(GatewayUnreachable, match="broke off after 5002 bytes"):
                    await files.copy_to("d", io.BytesIO(), archive="tar")
                with pytest.raises(GatewayUnreachable, match="download it again"):
                    await files.download("d", tmp_path / "d.tar.gz", archive="tar")
            assert list(tmp_path.iterdir()) == [], "a truncated archive was kept as complete"
        finally:
            server.stop()

    asyncio.run(scenario())
