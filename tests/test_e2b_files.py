"""The stock SDK's ``e2b_sandbox.files`` against the gateway: envd's /files and Filesystem RPCs."""

from __future__ import annotations

import io

import pytest
from e2b import FileType, InvalidArgumentException, NotFoundException, SandboxException
from e2b.sandbox.filesystem.filesystem import WriteEntry
from e2b_code_interpreter import Sandbox
from helpers import GatewayProcess, memory_kib

pytestmark = pytest.mark.docker


def test_text_bytes_and_streams_round_trip_and_the_kernel_sees_them(e2b_sandbox: Sandbox) -> None:
    binary = bytes(range(256)) * 64
    e2b_sandbox.files.write("/home/user/in/text.txt", "héllo\n")
    e2b_sandbox.files.write("in/data.bin", binary)
    e2b_sandbox.files.write("~/in/stream.bin", io.BytesIO(binary))  # octet-stream, streamed
    assert e2b_sandbox.files.read("in/text.txt") == "héllo\n"
    assert bytes(e2b_sandbox.files.read("/home/user/in/data.bin", format="bytes")) == binary
    assert b"".join(e2b_sandbox.files.read("in/stream.bin", format="stream")) == binary
    seen = e2b_sandbox.run_code("open('in/data.bin', 'rb').read() == bytes(range(256)) * 64")
    assert seen.text == "True", "the kernel does not start in the SDK's home directory"
    e2b_sandbox.run_code("open('made.txt', 'w').write('by the kernel')")
    assert e2b_sandbox.files.read("/home/user/made.txt") == "by the kernel"


def test_several_files_at_once(e2b_sandbox: Sandbox) -> None:
    written = e2b_sandbox.files.write_files(
        [WriteEntry(path=f"batch/f{n}.txt", data=f"file {n}") for n in range(3)]
    )
    assert [w.path for w in written] == [f"/home/user/batch/f{n}.txt" for n in range(3)]
    assert [e2b_sandbox.files.read(f"batch/f{n}.txt") for n in range(3)] == [
        "file 0",
        "file 1",
        "file 2",
    ]


def test_list_depth_stat_exists_rename_remove_make_dir(e2b_sandbox: Sandbox) -> None:
    assert e2b_sandbox.files.make_dir("tree/a/b") is True
    assert e2b_sandbox.files.make_dir("tree/a/b") is False
    e2b_sandbox.files.write("tree/a/b/deep.txt", "x")
    e2b_sandbox.files.write("tree/top.txt", "xyz")
    top = e2b_sandbox.files.list("tree")
    assert sorted(e.path for e in top) == ["/home/user/tree/a", "/home/user/tree/top.txt"]
    deep = e2b_sandbox.files.list("/home/user/tree", depth=3)
    assert "/home/user/tree/a/b/deep.txt" in {e.path for e in deep}
    info = e2b_sandbox.files.get_info("tree/top.txt")
    assert info.type == FileType.FILE and info.size == 3 and info.name == "top.txt"
    assert e2b_sandbox.files.get_info("tree/a").type == FileType.DIR
    assert e2b_sandbox.files.exists("tree/top.txt") and not e2b_sandbox.files.exists("tree/none")
    moved = e2b_sandbox.files.rename("tree/top.txt", "tree/moved/top.txt")
    assert moved.path == "/home/user/tree/moved/top.txt"
    assert e2b_sandbox.files.read("tree/moved/top.txt") == "xyz"
    e2b_sandbox.files.remove("tree")
    assert not e2b_sandbox.files.exists("tree")


def test_missing_files_and_paths_outside_the_workspace(e2b_sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        e2b_sandbox.files.read("does/not/exist.txt")
    with pytest.raises(NotFoundException):
        e2b_sandbox.files.get_info("nope")
    with pytest.raises(SandboxException, match="outside /home/user"):
        e2b_sandbox.files.read("/etc/passwd")
    with pytest.raises(SandboxException, match="outside /home/user"):
        e2b_sandbox.files.list("/")
    with pytest.raises((InvalidArgumentException, SandboxException)):
        e2b_sandbox.files.write("../escape.txt", "no")


def test_large_files_stream_both_ways_without_growing_the_gateway(
    e2b_sandbox: Sandbox, gateway: GatewayProcess
) -> None:
    size = 200 * 2**20
    chunk = bytes(range(256)) * 4096  # 1 MiB

    def chunks():
        for _ in range(size // len(chunk)):
            yield chunk

    before = memory_kib(gateway.pid)["VmRSS"]
    e2b_sandbox.files.write("big.bin", chunks())
    assert e2b_sandbox.files.get_info("big.bin").size == size
    total = 0
    for piece in e2b_sandbox.files.read("big.bin", format="stream"):
        total += len(piece)
    assert total == size
    grown = (memory_kib(gateway.pid)["VmRSS"] - before) / 1024
    assert grown < 64, f"the gateway grew {grown:.0f} MiB moving a 200 MiB file"
    e2b_sandbox.files.remove("big.bin")
