"""``files.watch_dir`` of the stock E2B SDK against a real gateway: sync (CreateWatcher,
GetWatcherEvents, RemoveWatcher) and async (the WatchDir stream), and a flood of files."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import SandboxException
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType as Kind
from e2b_code_interpreter import AsyncSandbox, Sandbox
from helpers import Canary, GatewayProcess, canary_session, e2b_env

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def pointed(gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in e2b_env(gateway, gateway.token).items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def sandbox():
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def wait_for(handle, wanted: set[tuple[str, Kind]], seconds: float = 15) -> list:
    """Collect events until every one of ``wanted`` has been seen."""
    seen: list = []
    deadline = time.monotonic() + seconds
    while not wanted <= {(e.name, e.type) for e in seen}:
        assert time.monotonic() < deadline, f"waited for {wanted}, saw {seen}"
        seen += handle.get_new_events()
        time.sleep(0.2)
    return seen


def test_watch_dir_reports_creates_writes_renames_and_removes(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("watched/sub")
    handle = sandbox.files.watch_dir("watched")
    sandbox.files.write("watched/a.txt", "one")
    wait_for(handle, {("a.txt", Kind.CREATE)})
    time.sleep(0.05)
    sandbox.run_code("open('watched/a.txt', 'a').write('two')")  # from inside the sandbox
    wait_for(handle, {("a.txt", Kind.WRITE)})
    sandbox.files.rename("watched/a.txt", "watched/b.txt")
    wait_for(handle, {("a.txt", Kind.RENAME), ("b.txt", Kind.CREATE)})
    sandbox.commands.run("rm watched/b.txt && touch watched/sub/deep.txt")
    seen = wait_for(handle, {("b.txt", Kind.REMOVE)})
    time.sleep(1.5)
    seen += handle.get_new_events()
    assert not [e for e in seen if "deep" in e.name], "not recursive, yet a subdirectory's file"
    handle.stop()
    with pytest.raises(SandboxException, match="stopped"):
        handle.get_new_events()


def test_recursive_watch_and_the_bound_on_watchers(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("tree/sub")
    handle = sandbox.files.watch_dir("tree", recursive=True)
    sandbox.files.write("tree/sub/deep.txt", "x")
    wait_for(handle, {("sub/deep.txt", Kind.CREATE)})
    with pytest.raises(SandboxException, match="not a directory"):
        sandbox.files.watch_dir("tree/sub/deep.txt")
    with pytest.raises(SandboxException, match="does not exist"):
        sandbox.files.watch_dir("nowhere")
    more = [sandbox.files.watch_dir("tree") for _ in range(3)]
    with pytest.raises(SandboxException, match="watchers"):
        sandbox.files.watch_dir("tree")
    more[0].stop()
    more.append(sandbox.files.watch_dir("tree"))  # a stopped one frees its place
    for h in [handle, *more[1:]]:
        h.stop()


def test_async_watch_dir_streams_events() -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create()
        try:
            await sbx.files.make_dir("w")
            events: list = []
            ended: list = []
            handle = await sbx.files.watch_dir(
                "w", on_event=events.append, on_exit=ended.append, timeout=0
            )
            await sbx.files.write("w/new.txt", "hello")
            deadline = time.monotonic() + 15
            while ("new.txt", Kind.CREATE) not in {(e.name, e.type) for e in events}:
                assert time.monotonic() < deadline, events
                await asyncio.sleep(0.2)
            await sbx.files.remove("w/new.txt")
            while ("new.txt", Kind.REMOVE) not in {(e.name, e.type) for e in events}:
                assert time.monotonic() < deadline, events
                await asyncio.sleep(0.2)
            await handle.stop()
            assert ended == [None]
            for _ in range(3):  # a stream the client closed frees its watcher's place
                handles = [await sbx.files.watch_dir("w", on_event=print) for _ in range(4)]
                for h in handles:
                    await h.stop()
                await asyncio.sleep(0.5)
        finally:
            await sbx.kill()

    asyncio.run(main())


def test_a_flood_of_files_is_an_overflow_not_a_heap(
    sandbox: Sandbox, gateway: GatewayProcess
) -> None:
    """60k files made at once: the watcher says it overflowed; the gateway stays small.

    (60k, not 100k: the default workspace holds about 65k inodes, and says so to the sandbox.)
    """
    sandbox.files.make_dir("flood")
    handle = sandbox.files.watch_dir("flood", recursive=True)
    with canary_session(gateway) as sid, Canary(gateway, sid, max_rss_growth=64 * 2**20):
        made = sandbox.run_code(
            "import os\nfor d in range(60):\n    os.makedirs(f'flood/{d}')\n"
            "    for i in range(1000):\n        open(f'flood/{d}/{i}', 'w').close()",
            timeout=600,
        )
        assert made.error is None, made.error
        with pytest.raises(SandboxException, match="overflow"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                handle.get_new_events()
                time.sleep(0.5)
    assert sandbox.run_code("len(os.listdir('flood'))").text == "60"
    assert sandbox.files.watch_dir("flood/0").get_new_events() == [], "a small one still works"
