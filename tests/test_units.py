"""Domain logic that needs no engine: limits, settings, output capping, the store."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import tarfile
import threading

import pytest

from gateway.config import ConfigError, Settings
from gateway.errors import BadRequest, LimitExceeded
from gateway.execution.outputs import OutputCollector
from gateway.limits import Limits, format_size, parse_size
from gateway.relays.agent_stream import ReplayBuffer
from gateway.sandbox.files import AsyncWorkspace
from gateway.sandbox.workspace import SMALL_WORKSPACE, Workspace


def msg(kind: str, **content) -> dict:
    return {"header": {"msg_type": kind}, "parent_header": {}, "metadata": {}, "content": content}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512m", 512 * 2**20), ("1g", 2**30), ("1GiB", 2**30), ("64 MB", 64 * 2**20), (100, 100)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_format_size():
    assert format_size(256 * 2**20) == "256 MiB" and format_size(1536 * 2**20) == "1.5 GiB"


DEFAULTS = Limits(memory=2**29, cpus=1, pids=256, disk=2**30, timeout=60, output_bytes=2**20)
MAXIMUM = Limits(memory=2**32, cpus=4, pids=4096, disk=2**34, timeout=3600, output_bytes=2**26)


def test_limits_resolve_against_defaults_and_maximum():
    defaults, maximum = DEFAULTS, MAXIMUM
    got = defaults.resolve({"memory": "1g", "pids": 32}, maximum)
    assert got.memory == 2**30 and got.pids == 32 and got.cpus == 1
    with pytest.raises(LimitExceeded, match="memory = 8 GiB is above the server maximum 4 GiB"):
        defaults.resolve({"memory": "8g"}, maximum)
    with pytest.raises(LimitExceeded, match="not a size"):
        defaults.resolve({"disk": "lots"}, maximum)
    with pytest.raises(BadRequest, match="unknown limit"):
        defaults.resolve({"gpu": 1}, maximum)
    with pytest.raises(LimitExceeded, match="positive"):
        defaults.resolve({"cpus": 0}, maximum)


@pytest.mark.parametrize(
    ("requested", "message"),
    [
        ({"memory": "32m"}, "memory = 32 MiB is below the 64 MiB a kernel needs"),
        ({"disk": "64k"}, "disk = 64 KiB is below the 1 MiB"),
        ({"pids": 8}, "pids = 8 is below the 16"),
        ({"cpus": 0.001}, "cpus = 0.001 is below the 0.01"),
        ({"pids": "nan"}, "must be a number"),
        ({"pids": 1e400}, "must be a number"),
        ({"cpus": "inf"}, "must be a number"),
        ({"memory": float("inf")}, "must be a size"),
    ],
)
def test_limits_no_kernel_could_start_under_are_refused(requested, message):
    """Each was a 500 or 503 (mkfs failing, the engine refusing, NaN reaching docker)."""
    with pytest.raises(LimitExceeded, match=message):
        DEFAULTS.resolve(requested, MAXIMUM)


def test_settings_layers_env_over_file_and_flags_over_env(tmp_path):
    config = tmp_path / "sbx.toml"
    config.write_text('port = 9000\nmax-sessions = 5\ndefault_memory = "256m"\n')
    env = {"SBX_CONFIG": str(config), "SBX_MAX_SESSIONS": "7"}
    settings = Settings.load(None, env)
    assert settings.port == 9000 and settings.max_sessions == 7
    assert settings.default_limits.memory == 256 * 2**20
    with pytest.raises(ConfigError, match="max_sessions"):
        Settings.load(None, {"SBX_MAX_SESSIONS": "many"})
    with pytest.raises(LimitExceeded):
        Settings.load(None, {"SBX_DEFAULT_MEMORY": "64g"})


def test_collector_merges_streams_and_keeps_rich_outputs():
    c = OutputCollector(cap_bytes=10_000)
    c.add_message(msg("execute_input", code="x", execution_count=3))
    c.add_message(msg("stream", name="stdout", text="a"))
    c.add_message(msg("stream", name="stdout", text="b"))
    c.add_message(msg("display_data", data={"text/plain": "fig"}, metadata={}))
    c.add_message(msg("execute_result", data={"text/plain": "1"}, metadata={}, execution_count=3))
    outputs = c.finish()
    assert outputs[0] == {"output_type": "stream", "name": "stdout", "text": "ab"}
    assert [o["output_type"] for o in outputs] == ["stream", "display_data", "execute_result"]
    assert c.execution_count == 3 and not c.truncated


def test_collector_cuts_at_the_cap_with_a_marker_but_keeps_errors():
    c = OutputCollector(cap_bytes=100)
    for _ in range(50):
        c.add_message(msg("stream", name="stdout", text="x" * 10))
    c.add_message(msg("display_data", data={"text/plain": "y" * 500}, metadata={}))
    c.add_message(msg("error", ename="ValueError", evalue="bad", traceback=["tb"]))
    outputs = c.finish()
    assert outputs[0]["text"] == "x" * 100
    assert outputs[1]["output_type"] == "error" and c.error["ename"] == "ValueError"
    assert "output truncated" in outputs[-1]["text"] and c.truncated


def test_collector_honours_clear_output_and_display_updates():
    c = OutputCollector(cap_bytes=10_000)
    c.add_message(msg("stream", name="stdout", text="old"))
    c.add_message(msg("clear_output", wait=True))
    c.add_message(
        msg("display_data", data={"text/plain": "1"}, metadata={}, transient={"display_id": "d"})
    )
    c.add_message(
        msg(
            "update_display_data",
            data={"text/plain": "2"},
            metadata={},
            transient={"display_id": "d"},
        )
    )
    outputs = c.finish()
    assert len(outputs) == 1 and outputs[0]["data"] == {"text/plain": "2"}


def test_collector_charges_every_payload_even_what_it_does_not_keep():
    """Clears, display updates, comm messages and input requests once cost nothing."""
    c = OutputCollector(cap_bytes=1000)
    for _ in range(5):  # a clear gives no bytes back
        c.add_message(msg("stream", name="stdout", text="x" * 150))
        c.add_message(msg("clear_output", wait=False))
    assert c.used == 750 and not c.truncated
    shown = {"data": {"text/plain": "1"}, "metadata": {}, "transient": {"display_id": "d"}}
    c.add_message(msg("display_data", **shown))
    c.add_message(msg("update_display_data", **{**shown, "data": {"text/plain": "2" * 500}}))
    c.add_message(msg("comm_msg", comm_id="c", data={"blob": "z" * 500}))
    c.add_message(msg("input_request", prompt="p" * 500, password=False))
    outputs = c.finish()
    assert outputs[0]["data"] == {"text/plain": "1"}, "an update past the cap is dropped"
    assert c.dropped > 1500 and "output truncated" in outputs[-1]["text"]


def test_collector_cuts_a_huge_error_to_its_budget():
    c = OutputCollector(cap_bytes=100)
    c.add_message(msg("error", ename="E", evalue="v" * 10**7, traceback=["t" * 10**6] * 50))
    outputs = c.finish()
    assert len(json.dumps(outputs)) < 64 * 1024 and c.truncated
    assert c.error["evalue"].endswith(" cut]") and len(c.error["traceback"]) == 20


def test_collector_keeps_outputs_nbformat_refuses_instead_of_failing():
    """A kernel's non-text MIME value once made the execute a 500 and left the session busy."""
    c = OutputCollector(cap_bytes=10_000)
    c.add_message(msg("display_data", data={"x": 1, "application/json": {"a": 1}}, metadata={}))
    c.add_message(msg("execute_result", data={"text/plain": "1"}, metadata=7, execution_count=1))
    c.add_message(msg("stream", name="stdout", text=["not", "a", "string"]))
    c.add_message(msg("display_data", data=[], metadata={}))
    outputs = c.finish()
    assert outputs[0]["data"] == {"x": "1", "application/json": {"a": 1}}
    assert outputs[1]["metadata"] == {} and outputs[1]["data"] == {"text/plain": "1"}
    assert all(o["output_type"] == "stream" for o in outputs[2:])
    assert "cannot hold" in outputs[-1]["text"]


def test_collector_drops_messages_of_the_wrong_shape_without_raising():
    """A kernel signs with its own key: each of these raised in the gateway, failing the execute."""
    c = OutputCollector(cap_bytes=10_000)
    shown = {"display_id": "d"}
    kept = msg("display_data", data={"text/plain": "kept"}, metadata={}, transient=shown)
    c.add_message(kept)
    hostile = [
        msg("error", ename=5, evalue="x", traceback=[]),
        msg("error"),
        msg("stream", text="no name"),
        msg("display_data", data={"text/plain": "x"}, metadata={}, transient=[1]),
        msg("update_display_data", data=[1], metadata={}, transient={"display_id": "d"}),
        msg("update_display_data", data={}, metadata={}, transient="d"),
        msg("update_display_data", data={"text/plain": "new"}, metadata=[1], transient=shown),
        msg("execute_result", data={"text/plain": "x"}, metadata={}),
        msg("execute_input", execution_count="7; DROP TABLE"),
        msg("execute_input", execution_count=True),
    ]
    for message in hostile:
        c.add_message(message)
    outputs = c.finish()
    assert outputs[0]["data"] == {"text/plain": "new"}, outputs
    assert outputs[0]["metadata"] == {"sbx_display_id": "d"}
    assert c.execution_count is None and c.error is None
    assert all(o["output_type"] != "error" for o in outputs)


def test_a_flood_of_clears_with_nothing_to_clear_costs_no_writes():
    """Each clear the listener hears is a row written; a clear carries no payload to charge."""
    heard: list = []
    c = OutputCollector(cap_bytes=10_000, listener=heard.append)
    for _ in range(1000):
        c.add_message(msg("clear_output", wait=False))
    c.add_message(msg("stream", name="stdout", text="x"))
    for _ in range(1000):
        c.add_message(msg("clear_output", wait=False))
    assert heard == [{"output_type": "stream", "name": "stdout", "text": "x"}, None]
    assert c.finish() == []


def test_empty_streams_cost_no_writes():
    """An empty stream is charged nothing, so each one stored was a free row in the store."""
    heard: list = []
    c = OutputCollector(cap_bytes=10_000, listener=heard.append)
    for _ in range(1000):
        c.add_message(msg("stream", name="stdout", text=""))
    c.add_message(msg("stream", name="stdout", text="x"))
    assert heard == [{"output_type": "stream", "name": "stdout", "text": "x"}]
    assert c.finish() == heard


def test_display_updates_do_not_scan_every_output():
    """Updates for ids never shown cost little each, and each one scanned every output kept."""
    import time

    c = OutputCollector(cap_bytes=4 * 1024 * 1024)
    for _ in range(10_000):
        c.add_message(msg("display_data", data={"text/plain": "x"}, metadata={}))
    shown = {"display_id": "d"}
    c.add_message(msg("display_data", data={"text/plain": "old"}, transient=shown))
    started = time.process_time()
    for n in range(20_000):
        c.add_message(msg("update_display_data", data={}, transient={"display_id": str(n)}))
    took = time.process_time() - started
    c.add_message(msg("update_display_data", data={"text/plain": "new"}, transient=shown))
    assert c.outputs[-1]["data"] == {"text/plain": "new"} and not c.truncated
    assert took < 2.0, f"20,000 updates of unknown displays took {took:.1f} s of CPU"


def png(color: tuple[int, int, int], size=(20, 10)) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_compare_normalises_volatile_text():
    from gateway.notebooks.compare import diff_outputs, normalize_text

    assert normalize_text("<object at 0x7f3a1b2c3d4e>") == "<object at 0x…>"
    assert normalize_text("Cell In[12], line 1") == "Cell In[N], line 1"
    assert normalize_text("\x1b[31mError\x1b[0m") == "Error"
    a = [{"output_type": "stream", "name": "stdout", "text": "at 0x7fffaaaa1111\n"}]
    b = [{"output_type": "stream", "name": "stdout", "text": "at 0x7fffbbbb2222\n"}]
    assert diff_outputs(a, b) == ""
    c = [{"output_type": "stream", "name": "stderr", "text": "at 0x7fffbbbb2222\n"}]
    assert "[stderr]" in diff_outputs(a, c)


def test_compare_images_exactly_or_within_tolerance():
    from gateway.notebooks.compare import diff_outputs

    out = lambda data: [{"output_type": "display_data", "data": {"image/png": data}}]  # noqa: E731
    grey, near, far = png((100, 100, 100)), png((102, 100, 100)), png((250, 0, 0))
    assert diff_outputs(out(grey), out(grey)) == ""
    assert "sha256" in diff_outputs(out(grey), out(near)), "exact mode must see any change"
    assert diff_outputs(out(grey), out(near), image_tolerance=0.01) == ""
    assert diff_outputs(out(grey), out(far), image_tolerance=0.01) != ""
    assert diff_outputs(out(grey), out(png((100, 100, 100), (21, 10))), image_tolerance=1) != ""


def test_plain_outputs_match_nbformat_and_odd_ones_still_validate():
    import nbformat
    from nbformat.v4 import output_from_msg

    from gateway.execution.outputs import _output

    messages = [
        msg("stream", name="stdout", text="hi\n"),
        msg("display_data", data={"image/png": "iVBOR", "text/plain": "<fig>"}, metadata={}),
        msg("display_data", data={"application/json": {"a": [1, 2]}}, metadata={"x": 1}),
        msg("execute_result", data={"text/plain": "42"}, metadata={}, execution_count=7),
        msg("error", ename="ValueError", evalue="bad", traceback=["tb 1", "tb 2"]),
    ]
    for message in messages:
        assert _output(message) == output_from_msg(message), message["header"]["msg_type"]
    odd = msg("display_data", data={"text/plain": {"not": "text"}}, metadata=[])
    nbformat.validate(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[_output(odd)])])
    )


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


def test_replay_buffer_drops_the_oldest_past_either_bound(tmp_path):
    buffer = ReplayBuffer(
        Settings(data_dir=str(tmp_path), replay_buffer_events=3, replay_buffer_size="10")
    )
    for text in ("a", "b", "c", "d"):
        buffer.append(text)
    assert list(buffer.texts) == ["b", "c", "d"] and buffer.dropped == 1
    buffer.append("12345678")  # 4 events: "b" goes, leaving 10 bytes
    assert list(buffer.texts) == ["c", "d", "12345678"] and buffer.dropped == 2
    buffer.append("xy")  # "c" goes for the count, then "d" for the bytes
    assert list(buffer.texts) == ["12345678", "xy"] and (buffer.size, buffer.dropped) == (10, 4)
    assert buffer.drain() == ["12345678", "xy"] and (buffer.size, buffer.dropped) == (0, 6)


@pytest.mark.parametrize(
    ("sent", "kept"), [(7, 7), (2**31 - 1, 2**31 - 1), (2**31, None), (2**63, None), (-1, None),
                       (True, None), (1.0, None), ("7", None)],
)  # fmt: skip
def test_an_execution_count_is_kept_only_if_a_store_column_holds_it(sent, kept):
    """A kernel chooses the number: 2**63 once cost its execution the record."""
    from gateway.execution.outputs import execution_count

    assert execution_count({"execution_count": sent}) == kept
