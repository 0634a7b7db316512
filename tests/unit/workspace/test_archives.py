"""Directory archives made as they are read: sizes known up front, files read as listed."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import threading
import time
import zipfile

import pytest
from helpers import deleted_files_held

from gateway.errors import FileTooLarge
from gateway.workspace.files import AsyncWorkspace
from gateway.workspace.rules import Workspace

GiB = 2**30


def workspace(tmp_path) -> Workspace:
    return Workspace(str(tmp_path), os.getuid(), os.getgid())


def read_all(archive) -> bytes:
    with archive:
        return b"".join(iter(archive.read, b""))


def tree(tmp_path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_bytes(b"alpha")
    (tmp_path / "d" / "sub" / "b.bin").write_bytes(os.urandom(700_000))
    (tmp_path / "d" / "empty").write_bytes(b"")


def contents(data: bytes, fmt: str) -> dict[str, bytes]:
    if fmt == "tar":
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar}
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        return {name: zf.read(name) for name in zf.namelist()}


@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_an_archive_holds_the_directory_and_says_its_size_before_a_byte(tmp_path, fmt):
    tree(tmp_path)
    archive = workspace(tmp_path).archive("d", fmt)
    assert (archive.size, archive.files) == (5 + 700_000, 3)
    got = contents(read_all(archive), fmt)
    assert got == {
        "a.txt": b"alpha",
        "sub/b.bin": (tmp_path / "d" / "sub" / "b.bin").read_bytes(),
        "empty": b"",
    }


@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_files_that_change_after_the_listing_keep_their_listed_size(tmp_path, fmt):
    (tmp_path / "grows").write_bytes(b"x" * 10)
    (tmp_path / "shrinks").write_bytes(b"y" * 10)
    archive = workspace(tmp_path).archive("", fmt)
    (tmp_path / "grows").write_bytes(b"x" * 10_000_000)  # the sandbox writes on meanwhile
    (tmp_path / "shrinks").write_bytes(b"y" * 3)
    got = contents(read_all(archive), fmt)
    assert got == {"grows": b"x" * 10, "shrinks": b"yyy" + bytes(7)}, (
        "a file that grew after the listing made the archive bigger than the size checked"
    )


@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_a_huge_sparse_file_streams_lazily_without_a_spool(tmp_path, fmt):
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "sparse.bin", "wb") as f:
        f.truncate(100 * GiB)
    held = set(deleted_files_held(os.getpid()))  # pytest's own capture files
    started = time.monotonic()
    archive = workspace(tmp_path).archive("big", fmt)
    with archive:
        assert archive.size == 100 * GiB
        first = archive.read()
        for _ in range(20):
            archive.read()
        took = time.monotonic() - started
        assert first and took < 10, f"the first pieces of the archive took {took:.1f} s"
        spooled = set(deleted_files_held(os.getpid())) - held
        assert not spooled, f"the archive was spooled to {spooled}"


def test_a_zip_takes_any_name_and_time_the_sandbox_chose(tmp_path):
    odd = os.fsencode(tmp_path) + b"/caf\xe9"  # not UTF-8
    with open(odd, "wb") as f:
        f.write(b"old")
    os.utime(odd, (0, 0))
    (tmp_path / "future").write_bytes(b"new")
    os.utime(tmp_path / "future", (2**40, 2**40))
    got = contents(read_all(workspace(tmp_path).archive("", "zip")), "zip")
    assert sorted(got.values()) == [b"new", b"old"]


class _Watched(Workspace):
    """Notes the threads its files are opened on."""

    threads: set[str]

    def open_read(self, path: str):
        self.threads.add(threading.current_thread().name)
        return super().open_read(path)


def test_async_archives_use_their_own_threads_and_refuse_past_the_limit(tmp_path):
    tree(tmp_path)
    sync = _Watched(str(tmp_path), os.getuid(), os.getgid())
    sync.threads = set()
    files = AsyncWorkspace(sync)
    fds = len(os.listdir("/proc/self/fd"))

    async def scenario() -> bytes:
        with pytest.raises(FileTooLarge, match=r"683\.6 KiB in 3 files.*limit of 512 KiB"):
            await files.archive("d", "tar", 512 * 2**10)
        async with await files.archive("d", "tar", 2**20) as reader:
            return b"".join([chunk async for chunk in _chunks(reader)])

    data = asyncio.run(scenario())
    assert contents(data, "tar")["a.txt"] == b"alpha"
    assert sync.threads and all(t.startswith("sbx-archive") for t in sync.threads), sync.threads
    assert len(os.listdir("/proc/self/fd")) <= fds, "a refused archive left files open"


async def _chunks(reader):
    while chunk := await reader.read():
        yield chunk
