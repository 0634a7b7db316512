"""The workspace walker and remover on real temporary trees shaped as a hostile kernel would."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile
import threading
from pathlib import Path

import pytest

from gateway.errors import Conflict
from gateway.sandbox import volume
from gateway.workspace.files import AsyncWorkspace
from gateway.workspace.rules import SMALL_WORKSPACE, Bounds, Workspace, remove_tree


def chain(top: Path, depth: int) -> None:
    """``top/d/d/.../d`` ``depth`` levels deep, made from descriptors (paths would be too long)."""
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(os.open("bottom.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)


def workspace(root: Path) -> Workspace:
    return Workspace(str(root), os.getuid(), os.getgid())


def test_a_walk_stops_descending_at_its_depth_bound_and_goes_on_beside(tmp_path):
    chain(tmp_path / "chain", 200)
    (tmp_path / "zz.txt").write_text("beside")
    walk = workspace(tmp_path).walk([], Bounds(depth=8))
    assert walk.truncated == "deeper than 8 levels"
    assert max(rel.count("/") for rel, _ in walk.entries) == 7
    assert [rel for rel, _ in walk.files] == ["zz.txt"]


def test_a_walk_stops_at_its_entry_and_time_bounds(tmp_path):
    for i in range(500):
        (tmp_path / f"f{i}").touch()
    walk = workspace(tmp_path).walk([], Bounds(entries=100))
    assert (len(walk.entries), walk.truncated) == (100, "more than 100 entries")
    assert workspace(tmp_path).walk([], Bounds(seconds=0)).truncated == "more than 0 s"
    assert workspace(tmp_path).walk([]).truncated is None


def test_a_walk_never_follows_a_link_and_lists_what_it_is(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "up").symlink_to(outside)
    os.mkfifo(root / "fifo")
    ws = workspace(root)
    assert [rel for rel, _ in ws.walk([]).entries] in (["up", "fifo"], ["fifo", "up"])
    assert ws.walk([]).files == []
    listing = ws.list("")
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [
        ("fifo", "other"),
        ("up", "symlink"),
    ]
    assert listing["truncated"] is False


def test_a_listing_past_its_bound_is_marked_truncated(tmp_path):
    for i in range(50):
        (tmp_path / f"f{i:02}").touch()
    listing = workspace(tmp_path).list("", Bounds(entries=20))
    assert len(listing["entries"]) == 20 and listing["truncated"] is True


def test_an_archive_counts_a_sparse_file_whole_before_any_work(tmp_path):
    st = os.statvfs(tmp_path)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(st.f_blocks * st.f_frsize + 1)
    with workspace(tmp_path).archive("", "tar") as archive:  # its caller refuses it by size
        assert archive.size == st.f_blocks * st.f_frsize + 1


def test_an_archive_past_the_walk_bounds_is_refused(tmp_path):
    chain(tmp_path / "chain", 100)
    with pytest.raises(Conflict, match="deeper than 64 levels"):
        workspace(tmp_path).archive("chain", "zip")


def test_a_deep_chain_is_removed_without_following_links(tmp_path):
    """Correctness only: the time bound is the next test's (a loaded machine is slow)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host")
    chain(tmp_path / "ws" / "chain", 10_000)
    (tmp_path / "ws" / "chain" / "d" / "up").symlink_to(outside)
    workspace(tmp_path / "ws").remove("chain", seconds=300)
    assert os.listdir(tmp_path / "ws") == [] and (outside / "keep.txt").exists()


def test_a_removal_past_its_time_bound_can_be_resumed(tmp_path):
    (tmp_path / "wide").mkdir()
    for i in range(200):
        (tmp_path / "wide" / f"f{i}").touch()
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(TimeoutError):
            remove_tree(fd, "wide", seconds=0)
        remove_tree(fd, "wide")
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []
    with pytest.raises(Conflict, match="send the DELETE again"):
        (tmp_path / "again").mkdir()
        (tmp_path / "again" / "f").touch()
        workspace(tmp_path).remove("again", seconds=0)


def test_destroying_a_plain_session_directory_never_follows_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host")
    session = tmp_path / "sessions" / "s1"
    chain(session / "workspace", 3000)
    (session / "run").mkdir()
    (session / "run" / "link").symlink_to(outside)
    os.mkfifo(session / "run" / "fifo")
    volume.destroy(session)
    assert not session.exists() and (outside / "keep.txt").exists()
    volume.destroy(session)  # twice is fine
    volume.destroy(tmp_path / "never-made" / "s2")  # a gateway that never had a session here


def test_the_inline_artifact_walk_hands_over_to_a_thread_when_the_tree_grew(tmp_path):
    """A workspace small at the last walk may be huge now: the walk on the loop stays tiny."""
    ws = AsyncWorkspace(workspace(tmp_path))

    async def scenario():
        await ws.baseline()
        assert ws.sync.small
        for i in range(2000):
            (tmp_path / f"f{i}").touch()
        return await ws.changes()

    artifacts, truncated = asyncio.run(scenario())
    assert len(artifacts) == 2000 and truncated is False


def test_copy_tree_copies_a_workspace_as_it_is_and_never_follows_a_link(tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    (source / "sub" / "deeper").mkdir(parents=True)
    target.mkdir()
    (source / "sub" / "deeper" / "f.txt").write_text("kept")
    os.chmod(source / "sub" / "deeper" / "f.txt", 0o640)
    os.utime(source / "sub" / "deeper" / "f.txt", (1_000_000, 1_000_000))
    (source / "ln").symlink_to("/etc/passwd")
    os.mkfifo(source / "pipe")
    volume.copy_tree(source, target)
    copied = target / "sub" / "deeper" / "f.txt"
    assert copied.read_text() == "kept"
    assert oct(copied.stat().st_mode & 0o777) == "0o640" and copied.stat().st_mtime == 1_000_000
    assert os.readlink(target / "ln") == "/etc/passwd", "a link is copied as a link"
    assert not (target / "pipe").exists(), "a FIFO is left out"


def test_copy_tree_refuses_a_tree_too_deep_to_copy(tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    deep = source.joinpath(*["d"] * (volume.COPY_DEPTH + 1))
    deep.mkdir(parents=True)
    target.mkdir()
    with pytest.raises(ValueError, match="deeper than"):
        volume.copy_tree(source, target)


def test_archiving_a_subdirectory_leaves_the_workspace_count_alone(tmp_path):
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "one.txt").write_text("1")
    for n in range(SMALL_WORKSPACE * 2):
        (tmp_path / f"f{n}.txt").write_text("x")
    workspace = Workspace(str(tmp_path), os.getuid(), os.getgid())
    workspace.baseline()
    walked = workspace.walked
    assert walked > SMALL_WORKSPACE and not workspace.small
    workspace.archive("small", "tar").close()
    assert workspace.walked == walked and not workspace.small, (
        "downloading a small directory made a big workspace pass for small: the next execute "
        "would walk it on the event loop, stalling every session"
    )


class _Watched(Workspace):
    """A real workspace that notes the threads its directories are opened on."""

    threads: set[int]

    def _open_dir(self, parts: list[str], create: bool = False) -> int:
        self.threads.add(threading.get_ident())
        return super()._open_dir(parts, create)


def test_the_async_workspace_does_its_file_work_off_the_event_loop(tmp_path):
    sync = _Watched(str(tmp_path), os.getuid(), os.getgid())
    sync.threads = set()
    workspace = AsyncWorkspace(sync)

    async def scenario():
        loop_thread = threading.get_ident()
        await workspace.baseline()
        assert (await workspace.save("d/a.txt", b"hello")).size == 5
        upload = await workspace.open_write("d/b.bin")
        await upload.write(b"x" * 1000)
        await upload.finish(True)
        await upload.finish(True)  # a second finish must not close a descriptor again
        listing = [e["path"] for e in (await workspace.list("d"))["entries"]]
        async with (await workspace.open_read("d/a.txt"))[0] as reader:
            text = await reader.read()
        async with await workspace.archive("d", "tar", 2**20) as reader:
            archive = b"".join([chunk async for chunk in _chunks(reader)])
        await workspace.remove("d/b.bin")
        assert await workspace.free_bytes() > 0
        return loop_thread, listing, text, archive

    loop_thread, listing, text, archive = asyncio.run(scenario())
    assert (listing, text) == (["d/a.txt", "d/b.bin"], b"hello")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert sorted(tar.getnames()) == ["a.txt", "b.bin"]
    assert loop_thread not in sync.threads, "a workspace call blocked the event loop"


async def _chunks(reader):
    while chunk := await reader.read():
        yield chunk


def test_artifacts_of_a_small_workspace_are_found_on_the_loop(tmp_path):
    """Quick enough to skip the worker thread, which would slow every execute."""
    sync = _Watched(str(tmp_path), os.getuid(), os.getgid())
    sync.threads = set()
    workspace = AsyncWorkspace(sync)

    async def scenario():
        await workspace.baseline()
        (tmp_path / "plot.png").write_bytes(b"png")
        first, _ = await workspace.changes()  # the baseline walked in a thread: not known small
        sync.threads.clear()
        await workspace.baseline()  # the last changes() still hold: no walk at all
        (tmp_path / "plot.png").write_bytes(b"png2")
        return first, (await workspace.changes())[0], threading.get_ident()

    first, second, loop_thread = asyncio.run(scenario())
    assert [(a["path"], a["change"], a["mime_type"]) for a in first] == [
        ("plot.png", "created", "image/png")
    ]
    assert [(a["path"], a["change"], a["size"]) for a in second] == [("plot.png", "modified", 4)]
    assert loop_thread in sync.threads, "the small workspace was not walked on the loop"
    # Hashing what changed reads files: that alone goes to a worker thread.
    assert second[0]["sha256"] == hashlib.sha256(b"png2").hexdigest()


def test_an_upload_discarded_mid_write_leaves_nothing(tmp_path):
    """As when a client hangs up while a chunk is still being written in a thread."""
    workspace = AsyncWorkspace(Workspace(str(tmp_path), os.getuid(), os.getgid()))

    async def scenario():
        upload = await workspace.open_write("big.bin")
        writing = asyncio.ensure_future(upload.write(os.urandom(8 * 2**20)))
        await asyncio.sleep(0)
        upload.discard()  # from a synchronous callback: must neither block nor race the write
        await writing
        await upload.finish(False)  # waits for the discard; then does nothing
        return await workspace.list("")

    assert asyncio.run(scenario())["entries"] == [] and os.listdir(tmp_path) == []
