"""The gateway's calls in a sandbox's directories: none follows a link, none is left half done."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest
from helpers import file_facts, host_file

from gateway.nofollow import NotASocket, bind_socket, connect_socket_file, write_file


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A sandbox's directory; its parent is the gateway's."""
    path = tmp_path / "session" / "run"
    path.mkdir(parents=True)
    return path


def test_a_socket_is_bound_with_its_mode_over_a_planted_link(run_dir, tmp_path):
    victim = host_file(tmp_path)
    before = file_facts(victim)
    (run_dir / "pkg.sock").symlink_to(victim)
    with bind_socket(run_dir, "pkg.sock", 0o777) as listener:
        st = os.lstat(run_dir / "pkg.sock")
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o777
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(run_dir / "pkg.sock"))
            listener.accept()[0].close()
    assert file_facts(victim) == before
    assert os.listdir(run_dir.parent) == ["run"], "the socket's first name was left behind"


def test_a_directory_in_the_sockets_place_is_an_error_and_leaves_nothing(run_dir):
    (run_dir / "pkg.sock").mkdir()
    with pytest.raises(OSError):
        bind_socket(run_dir, "pkg.sock", 0o777)
    assert os.listdir(run_dir.parent) == ["run"]
    assert (run_dir / "pkg.sock").is_dir()


def test_a_sandbox_directory_that_is_a_link_is_refused(tmp_path, run_dir):
    (tmp_path / "session" / "linked").symlink_to(run_dir)
    with pytest.raises(OSError):
        bind_socket(tmp_path / "session" / "linked", "pkg.sock", 0o777)
    assert not os.listdir(run_dir)


def test_a_file_is_made_new_with_its_mode_and_owner_in_place_of_a_link(run_dir, tmp_path):
    victim = host_file(tmp_path)
    before = file_facts(victim)
    (run_dir / "TOKEN").symlink_to(victim)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_file(fd, "TOKEN", b"value", 0o440, (1000, 1000))
    finally:
        os.close(fd)
    assert file_facts(run_dir / "TOKEN") == (0o440, 1000, 1000, b"value")
    assert file_facts(victim) == before


def test_a_socket_is_connected_only_where_no_link_stands(run_dir, tmp_path):
    host = socket.socket(socket.AF_UNIX)
    host.bind(str(tmp_path / "host.sock"))
    host.listen(1)
    (run_dir / "k-1").symlink_to(tmp_path / "host.sock")

    class Connected(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport.close()

    async def connect(path: Path) -> asyncio.Protocol:
        return await connect_socket_file(str(path), Connected)

    with host, pytest.raises(NotASocket):
        asyncio.run(connect(run_dir / "k-1"))
    with bind_socket(run_dir, "k-2", 0o700):
        assert isinstance(asyncio.run(connect(run_dir / "k-2")), Connected)


def test_a_socket_is_served_though_the_descriptor_its_name_was_bound_through_is_reused(
    run_dir, monkeypatch
):
    """The listener's name (/proc/self/fd/N/...) outlives N: Python 3.13's asyncio stats it
    to clean up on close, and N reused by a file failed the open (NotADirectoryError)."""
    from gateway import nofollow

    held, bind = [], nofollow.bind_socket

    def bind_then_reuse(*args, **kwargs):
        sock = bind(*args, **kwargs)
        held.append(open(os.devnull))  # the lowest free descriptor: the one bound through
        return sock

    async def answer(session_id, reader, writer):
        writer.write(session_id.encode())
        await writer.drain()
        writer.close()

    async def main():
        sockets = nofollow.SessionSockets("tools.sock", answer, 1024)
        await sockets.open("s1", run_dir)
        try:
            reader, writer = await asyncio.open_unix_connection(str(run_dir / "tools.sock"))
            assert await reader.read() == b"s1"
            writer.close()
        finally:
            sockets.stop()

    monkeypatch.setattr(nofollow, "bind_socket", bind_then_reuse)
    try:
        asyncio.run(main())
    finally:
        for f in held:
            f.close()
    assert (run_dir / "tools.sock").is_socket()
