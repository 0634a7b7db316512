"""The Python SDK against the real gateway: both halves, streaming, files, errors, retries."""

from __future__ import annotations

import asyncio
import io
import re
import threading
import time
from datetime import datetime

import nbformat
import pytest
from helpers import wait_for
from tcp_proxy import TCPProxy

from gateway.client import (
    AsyncClient,
    AsyncSession,
    BadRequest,
    Client,
    Execution,
    FileNotFound,
    FileTooLarge,
    GatewayUnreachable,
    KernelNotFound,
    LimitExceeded,
    NotAFile,
    RecordedExecution,
    Retry,
    Session,
    SessionEnded,
    SessionNotFound,
    Unauthorized,
)

pytestmark = pytest.mark.docker

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
)


def _seconds_between(start: str | None, end: str | None) -> float:
    parse = lambda ts: datetime.fromisoformat(str(ts).replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def _finished(history: list[RecordedExecution]) -> str | None:
    """The status of the last execution once it has finished (it is recorded as it starts)."""
    status = history[-1].status if history else None
    return None if status == "running" else status


@pytest.fixture
def token(gateway) -> str:
    """The gateway's admin token, when it requires one."""
    return getattr(gateway, "token", "")


@pytest.fixture
def client(gateway, token):
    with Client(gateway.url, token) as c:
        yield c


@pytest.fixture
def sdk_session(client):
    with client.create_session(metadata={"test": "sdk"}) as s:
        yield s


# -- sessions -----------------------------------------------------------------------------


def test_create_runs_code_and_deletes_on_exit(gateway, api, token):
    with Session.create(gateway.url, token, memory="256m", ttl=120, env={"MODE": "x"}) as session:
        assert session.info.state == "idle"
        assert session.info.limits["memory"] == 256 * 1024 * 1024 and session.info.ttl == 120
        execution = session.run("import os\nprint(os.environ['MODE'])\n6 * 7")
        sid = session.id
    assert execution.ok and execution.stdout == "x\n" and execution.text == "42"
    assert execution.execution_count == 1 and execution.error is None
    state = api.get(f"/v1/sessions/{sid}").json()["state"]
    assert state == "deleted", "leaving the with block did not delete the session"
    assert session.client._http.is_closed, "the session's own client was left open"


def test_keep_and_connect(gateway, api, token):
    with Session.create(gateway.url, token, keep=True) as session:
        session.run("kept = 'yes'")
    try:
        with Session.connect(session.id, gateway.url, token) as again:
            assert again.run("kept").text == "'yes'", "state was lost between connections"
        assert api.get(f"/v1/sessions/{session.id}").json()["state"] == "idle", (
            "a connected session was deleted on exit; connect should keep it"
        )
    finally:
        api.delete(f"/v1/sessions/{session.id}")


def test_a_session_handle_sends_nothing_until_used(gateway, sdk_session, token):
    with TCPProxy(gateway.url) as proxy, Client(proxy.url, token) as client:
        handle = client.session(sdk_session.id)
        ghost = client.session("no-such-session")
        assert proxy.connections == 0, "making a handle sent a request"
        assert handle.id == sdk_session.id and handle.keep and handle.info.state == ""
        assert handle.refresh().state == "idle" and handle.info.kernel == "python3"
        assert handle.run("6 * 7").text == "42"
        for first_call in (ghost.files.list, lambda: ghost.run("1"), ghost.delete):
            with pytest.raises(SessionNotFound):
                first_call()


def test_isolation_options_reach_the_gateway(client):
    with client.create_session(runtime="runc", network={"allow": ["example.com"]}) as session:
        assert session.info.raw["runtime"] == "runc"
        assert session.info.raw["network"] == {"allow": ["example.com"]}


def test_list_filters_by_metadata_and_state(gateway, sdk_session, token):
    found = Session.list(gateway.url, token, metadata={"test": "sdk"})
    assert sdk_session.id in [s.id for s in found]
    assert Session.list(gateway.url, token, metadata={"test": "nobody"}) == []
    idle = Session.list(gateway.url, token, state="idle", metadata={"test": "sdk"})
    assert [s.id for s in idle] == [sdk_session.id]


def test_settings_supply_url_and_token(gateway, token, monkeypatch):
    monkeypatch.setenv("SBX_URL", gateway.url)
    monkeypatch.setenv("SBX_TOKEN", token or "from-env")
    with Client() as c:
        assert c.url == gateway.url and c.token == (token or "from-env")
        assert c.headers["Authorization"] == f"Bearer {c.token}"
        assert c.list_sessions(metadata={"test": "nobody"}) == []


def test_token_goes_on_http_and_websocket_requests(gateway, token):
    token = token or "s3cret"
    with TCPProxy(gateway.url) as proxy, Session.create(proxy.url, token) as session:
        session.run("1")
    sent = bytes(proxy.received)  # create, the stream's upgrade, delete
    header = re.compile(rb"(?i)^authorization: bearer " + re.escape(token.encode()) + rb"\r$", re.M)
    assert len(header.findall(sent)) >= 3, sent[:2000]
    assert b"GET /v1/sessions/" in sent and b"upgrade: websocket" in sent.lower()


def test_interrupt_restart_timeouts_history_export(sdk_session, tmp_path):
    s = sdk_session
    box: dict[str, Execution] = {}
    code = "open('began', 'w').close(); import time; time.sleep(60)"
    runner = threading.Thread(target=lambda: box.update(e=s.run(code)))
    runner.start()
    # Once the cell runs: an interrupt in ipykernel's own code before it says no KeyboardInterrupt.
    assert wait_for(lambda: s.files.exists("began"), 20), "the long cell never started"
    assert s.interrupt().id == s.id
    runner.join(30)
    assert box["e"].status == "interrupted" and box["e"].error.name == "KeyboardInterrupt"

    s.run("gone = 1")
    info = s.restart()
    assert info.state == "idle"
    assert s.run("gone").error.name == "NameError", "restart kept the old kernel's state"

    info = s.set_ttl(900, idle_timeout=300)
    assert (info.ttl, info.idle_timeout) == (900, 300) and s.info.ttl == 900
    with pytest.raises(TypeError):
        s.set_ttl()
    info = s.extend(120)
    left = _seconds_between(info.last_activity, info.expires_at)
    assert 119 < left <= 121, f"extend(120) left the session {left} s to live"

    assert [h.status for h in s.history()] == ["interrupted", "ok", "error"]
    notebook = s.export(tmp_path / "s.ipynb", descriptions=False)
    nbformat.validate(nbformat.from_dict(notebook))
    assert nbformat.read(tmp_path / "s.ipynb", as_version=4).cells[-1].source == "gone"


# -- executions and streaming --------------------------------------------------------------


def test_callbacks_stream_outputs_as_they_happen(sdk_session):
    seen: list[tuple[float, str, object]] = []
    code = (
        "import sys, time\nfor i in range(3):\n    print('tick', i, flush=True)\n"
        "    time.sleep(0.7)\nprint('warn', file=sys.stderr)\n"
        "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))\n1/0"
    )

    def note(kind: str):
        return lambda value: seen.append((time.monotonic(), kind, value))

    execution = sdk_session.run(
        code,
        on_stdout=note("out"),
        on_stderr=note("err"),
        on_result=note("result"),
        on_error=note("error"),
    )
    ended = time.monotonic()
    assert ended - seen[0][0] > 1.2, "stdout arrived only at the end, not as it was printed"
    assert "".join(v for _, k, v in seen if k == "out") == "tick 0\ntick 1\ntick 2\n"
    assert [v for _, k, v in seen if k == "err"] == ["warn\n"]
    (result,) = [v for _, k, v in seen if k == "result"]
    assert result.html == "<b>hi</b>" and not result.is_main
    (error,) = [v for _, k, v in seen if k == "error"]
    assert error.name == "ZeroDivisionError" and "1/0" in error.text
    assert execution.status == "error" and execution.error.value == "division by zero"
    assert "\x1b[" not in execution.error.text, "the plain traceback kept colour codes"


def test_results_expose_rich_formats_and_artifacts(sdk_session):
    code = (
        "from IPython.display import JSON, display\n"
        "display(JSON({'a': [1, 2]}))\n"
        f"{PLOT}\n"
        "open('out.txt', 'w').write('done')\n"
        "{'k': 1}"
    )
    execution = sdk_session.run(code)
    assert execution.ok, execution.error
    json_result, image, main = execution.results
    assert json_result.json == {"a": [1, 2]}
    assert image.png.startswith(b"\x89PNG") and "image/png" in image.images
    assert main.is_main and execution.result == main and execution.text == "{'k': 1}"
    assert [(a.path, a.change, a.size) for a in execution.artifacts] == [("out.txt", "created", 4)]


def test_timeout_and_description(sdk_session):
    execution = sdk_session.run("import time; time.sleep(10)", timeout=1, description="# slow")
    assert execution.status == "timeout" and execution.error.name == "ExecutionTimeout"
    assert sdk_session.history()[-1].description == "# slow"


def test_a_raising_callback_stops_the_run_and_interrupts_the_cell(sdk_session):
    def boom(text: str) -> None:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        sdk_session.run("import time\nprint('go', flush=True)\ntime.sleep(60)", on_stdout=boom)
    last = wait_for(lambda: _finished(sdk_session.history()), 6)  # under the reconnect grace
    assert last == "interrupted", "the abandoned cell kept running"


# -- files -------------------------------------------------------------------------------


def test_files_write_read_list_remove(sdk_session, tmp_path):
    files = sdk_session.files
    assert files.write("notes/a.txt", "héllo").size == len("héllo".encode())
    files.write("bin.dat", bytes(range(256)))
    files.write("stream.bin", io.BytesIO(b"x" * 300_000))
    assert files.read("notes/a.txt").decode() == "héllo"
    assert files.read("bin.dat") == bytes(range(256))
    assert files.read("bin.dat", max_bytes=256) == bytes(range(256))
    with pytest.raises(FileTooLarge, match=r"bin\.dat is 256 bytes, over the 255-byte limit"):
        files.read("bin.dat", max_bytes=255)
    listing = {e.path: e for e in files.list()}
    assert listing["notes"].type == "directory" and listing["stream.bin"].size == 300_000
    assert [e.name for e in files.list("notes")] == ["a.txt"]
    assert sdk_session.run("open('notes/a.txt').read()").text == "'héllo'"
    files.remove("notes")
    assert "notes" not in {e.path for e in files.list()}
    with pytest.raises(FileNotFound):
        files.read("notes/a.txt")


def test_commands_run_beside_the_kernel_in_both_halves(gateway, token, sdk_session):
    sdk_session.files.write("sub/data.txt", "from the workspace\n")
    ran = sdk_session.commands.run(
        'cat data.txt; echo "$WHO" >&2; pwd; exit 3', env={"WHO": "me"}, cwd="sub"
    )
    assert (ran.exit_code, ran.ok, ran.timed_out) == (3, False, False), ran
    assert ran.stdout.splitlines()[0] == "from the workspace" and ran.stdout.endswith("/sub\n")
    assert ran.stderr == "me\n" and ran.pid and ran.duration_ms is not None
    slow = sdk_session.commands.run("echo started; sleep 30", timeout=1)
    assert slow.timed_out and slow.exit_code is None and slow.stdout == "started\n", slow
    assert slow.duration_ms < 15_000

    async def from_asyncio():
        async with AsyncClient(gateway.url, token) as client:
            return await client.session(sdk_session.id).commands.run("echo $((6 * 7))")

    done = asyncio.run(from_asyncio())
    assert done.ok and done.stdout == "42\n"


def test_upload_and_download_stream_with_progress(sdk_session, tmp_path):
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    ups: list[tuple[int, int | None]] = []
    info = sdk_session.files.upload(
        source, "in/big.bin", on_progress=lambda d, t: ups.append((d, t))
    )
    assert info.path == "in/big.bin" and info.size == source.stat().st_size
    assert len(ups) > 1 and ups[-1] == (info.size, info.size), "upload progress was not reported"

    downs: list[tuple[int, int | None]] = []
    dest = sdk_session.files.download(
        "in/big.bin", tmp_path / "back.bin", on_progress=lambda d, t: downs.append((d, t))
    )
    assert dest.read_bytes() == source.read_bytes()
    assert downs[-1] == (info.size, info.size)
    with pytest.raises(FileNotFound):
        sdk_session.files.download("missing.bin", tmp_path / "missing.bin")
    assert not list(tmp_path.glob("*missing*")), "a failed download left a file behind"


# -- errors --------------------------------------------------------------------------------


def test_gateway_errors_raise_typed_exceptions(client, sdk_session):
    sdk_session.files.write("dir/file.txt", "x")
    cases = [
        (lambda: client.connect("no-such-session"), SessionNotFound, "session_not_found", 404),
        (lambda: client.create_session(memory="900g"), LimitExceeded, "limit_exceeded", 422),
        (lambda: client.create_session(env={"1BAD": "x"}), BadRequest, "bad_request", 400),
        (lambda: client.create_session(kernel="cobol"), KernelNotFound, "kernel_not_found", 404),
        (lambda: sdk_session.files.read("nope.txt"), FileNotFound, "file_not_found", 404),
        (lambda: sdk_session.files.read("dir"), NotAFile, "not_a_file", 409),
        (lambda: sdk_session.run("1", timeout=-1), LimitExceeded, "limit_exceeded", 422),
    ]
    for action, cls, code, status in cases:
        with pytest.raises(cls) as caught:
            action()
        error = caught.value
        assert (error.code, error.status) == (code, status), (error.code, error.message)
        assert error.message and "{" not in error.message[:1], error.message
    with pytest.raises(TypeError, match="unknown session option"):
        client.create_session(memroy="1g")
    with pytest.raises(TypeError, match="unknown callback"):
        sdk_session.run("1", on_stdot=print)


def test_deleted_session_raises_and_context_exit_tolerates_it(client):
    with client.create_session() as session:
        session.delete()
        with pytest.raises((SessionEnded, SessionNotFound)):
            session.run("1")
    with pytest.raises((SessionEnded, SessionNotFound)):
        session.delete()


def test_a_wrong_token_raises_unauthorized_on_http_and_streams(gateway, sdk_session):
    with Client(gateway.url, "not-the-token") as intruder:
        with pytest.raises(Unauthorized) as caught:
            intruder.list_sessions()
        assert caught.value.status == 401 and "token" in caught.value.message
        with pytest.raises(Unauthorized):
            Session(intruder, sdk_session.info).run("1")  # refused at the WebSocket upgrade


# -- retries -------------------------------------------------------------------------------


def test_idempotent_calls_are_retried_on_connection_errors(gateway, sdk_session, token):
    with TCPProxy(gateway.url, drop_first=2) as proxy:
        with Client(proxy.url, token, retry=Retry(retries=3, backoff=0.05)) as flaky:
            info = flaky.connect(sdk_session.id).info
            assert info.id == sdk_session.id
            assert proxy.connections == 3, "the GET was not retried after the hang-ups"
            assert flaky.connect(sdk_session.id).run("2 + 2").text == "4"


def test_non_idempotent_calls_are_not_retried(gateway, sdk_session, token):
    with TCPProxy(gateway.url, drop_first=1) as proxy:
        with Client(proxy.url, token, retry=Retry(retries=3, backoff=0.05)) as flaky:
            with pytest.raises(GatewayUnreachable, match="cannot reach the gateway"):
                flaky.call(sdk_session._action_call("restart"))
            assert proxy.connections == 1, "a POST was sent again after a connection error"


def test_streams_reconnect_when_opening_fails(gateway, sdk_session, token):
    with TCPProxy(gateway.url) as proxy:
        with Client(proxy.url, token, retry=Retry(retries=3, backoff=0.05)) as flaky:
            session = flaky.connect(sdk_session.id)
            proxy.drop = 2
            assert session.run("'again'").text == "'again'"


TICKS = "import time\nfor i in range(6):\n    print('tick', i, flush=True)\n    time.sleep(0.4)"
ALL_TICKS = "".join(f"tick {i}\n" for i in range(6))


def test_a_dropped_stream_resumes_without_losing_or_repeating_events(gateway, sdk_session, token):
    seen: list[str] = []
    with TCPProxy(gateway.url) as proxy:
        with Client(proxy.url, token, retry=Retry(backoff=0.2)) as flaky:
            session = flaky.connect(sdk_session.id)

            def on_stdout(text: str) -> None:
                seen.append(text)
                if len(seen) == 1:
                    proxy.cut(refuse_next=1)  # and the first reconnect fails too

            execution = session.run(TICKS, on_stdout=on_stdout)
    assert proxy.connections >= 4, "the connection was never cut"
    assert execution.ok and execution.stdout == ALL_TICKS
    assert "".join(seen) == ALL_TICKS, f"events were lost or repeated on resume: {seen}"


def test_async_stream_resumes_too(gateway, sdk_session, token):
    async def scenario(proxy: TCPProxy) -> tuple[Execution, list[str]]:
        seen: list[str] = []

        def on_stdout(text: str) -> None:
            seen.append(text)
            if len(seen) == 2:
                proxy.cut()

        async with AsyncClient(proxy.url, token, retry=Retry(backoff=0.2)) as flaky:
            session = await flaky.connect(sdk_session.id)
            return await session.run(TICKS, on_stdout=on_stdout), seen

    with TCPProxy(gateway.url) as proxy:
        execution, seen = asyncio.run(scenario(proxy))
    assert execution.ok and "".join(seen) == ALL_TICKS


def test_a_stream_that_lost_events_fails_instead_of_hanging(start_gateway):
    small = start_gateway("--replay-buffer-events", "3")
    small_token = getattr(small, "token", "")
    code = "import time\nfor i in range(30):\n    print(i, flush=True)\n    time.sleep(0.05)"
    with (
        TCPProxy(small.url) as proxy,
        Client(proxy.url, small_token, retry=Retry(5, backoff=0.3)) as c,
    ):
        with c.create_session() as session:
            cut = lambda _: proxy.drop or proxy.cut(refuse_next=3)  # noqa: E731
            with pytest.raises(GatewayUnreachable, match="lost events"):
                session.run(code, on_stdout=cut)
            assert session.history()[-1].code == code, "the run did not reach the gateway"


# -- the async half ------------------------------------------------------------------------


def test_async_session_mirrors_the_sync_one(gateway, api, tmp_path, token):
    async def scenario():
        streamed: list[str] = []

        async def on_stdout(text: str) -> None:
            await asyncio.sleep(0)
            streamed.append(text)

        async with AsyncSession.create(gateway.url, token, metadata={"test": "async"}) as s:
            first = await s.run("x = 20\nprint('a', flush=True)\nprint('b')", on_stdout=on_stdout)
            second = await s.run(f"{PLOT}\nx * 2")
            await s.files.write("d/in.txt", "data")
            listing = await s.files.list("d")
            source = tmp_path / "up.bin"
            source.write_bytes(b"z" * 100_000)
            await s.files.upload(source)
            back = await s.files.download("up.bin", tmp_path / "down.bin")
            with pytest.raises(FileNotFound):
                await s.files.read("missing")
            with pytest.raises(FileTooLarge):
                await s.files.read("d/in.txt", max_bytes=3)
            assert await s.client.session(s.id).files.read("d/in.txt", max_bytes=4) == b"data"
            await s.set_timeout(600)
            info = await s.extend(300)
            listed = await AsyncSession.list(gateway.url, token, metadata={"test": "async"})
            notebook = await s.export()
            await s.files.remove("d")
            return s, first, second, streamed, listing, back, info, listed, notebook

    s, first, second, streamed, listing, back, info, listed, notebook = asyncio.run(scenario())
    assert "".join(streamed) == "a\nb\n" and first.stdout == "a\nb\n"
    assert second.text == "40" and second.results[0].png.startswith(b"\x89PNG")
    assert [e.path for e in listing] == ["d/in.txt"]
    assert back.read_bytes() == b"z" * 100_000
    assert 299 < _seconds_between(info.last_activity, info.expires_at) <= 301
    assert [x.id for x in listed] == [s.id]
    assert len([c for c in notebook["cells"] if c["cell_type"] == "code"]) == 2
    assert api.get(f"/v1/sessions/{s.id}").json()["state"] == "deleted"


def test_async_client_errors_interrupt_and_retries(gateway, token):
    async def scenario():
        async with AsyncClient(gateway.url, token) as client:
            with pytest.raises(SessionNotFound):
                await client.connect("missing")
            with pytest.raises(SessionNotFound):
                await client.session("missing").files.list()
            session = await client.create_session()
            try:
                running = asyncio.create_task(session.run("import time; time.sleep(60)"))
                for _ in range(100):
                    if (await session.refresh()).state == "busy":
                        break
                    await asyncio.sleep(0.1)
                await session.interrupt()
                interrupted = await asyncio.wait_for(running, 30)
                restarted = await session.restart()
                history = await session.history()
            finally:
                await session.delete()
        with TCPProxy(gateway.url, drop_first=1) as proxy:
            async with AsyncClient(proxy.url, token, retry=Retry(backoff=0.05)) as flaky:
                health = await flaky.health()
        return interrupted, restarted, history, health, proxy.connections

    interrupted, restarted, history, health, connections = asyncio.run(scenario())
    assert interrupted.status == "interrupted"
    assert restarted.state == "idle" and history[-1].status == "interrupted"
    assert health["status"] == "ok" and connections == 2


def test_async_cancelling_a_run_interrupts_the_cell(gateway, token):
    async def scenario():
        async with AsyncSession.create(gateway.url, token) as s:
            started = asyncio.Event()
            task = asyncio.create_task(
                s.run(
                    "import time\nprint('go', flush=True)\ntime.sleep(60)",
                    on_stdout=lambda _: started.set(),
                )
            )
            await asyncio.wait_for(started.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(60):  # under the reconnect grace
                if last := _finished(await s.history()):
                    return last
                await asyncio.sleep(0.1)
        return None

    assert asyncio.run(scenario()) == "interrupted", "the cancelled cell kept running"
