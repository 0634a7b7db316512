"""The stock E2B SDKs (e2b-code-interpreter, e2b), unmodified, against a real gateway.

They are pointed at the gateway by environment variables alone, as ``sbx e2b
env`` prints them; each test then uses the SDK as an E2B user would.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox as AsyncBaseSandbox
from e2b import (
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxQuery,
)
from e2b import TimeoutException as E2BTimeout
from e2b_code_interpreter import AsyncSandbox, Sandbox
from helpers import GatewayProcess, e2b_env

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def pointed(gateway: GatewayProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in e2b_env(gateway, gateway.token).items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def sandbox():
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def test_run_code_streams_outputs_results_and_errors(sandbox: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    execution = sandbox.run_code(
        "import sys, time\nprint('first')\nsys.stdout.flush()\ntime.sleep(1)\n"
        "print('oops', file=sys.stderr)\n6 * 7",
        on_stdout=lambda m: seen.append((time.monotonic(), m.line)),
    )
    finished = time.monotonic()
    assert execution.logs.stdout == ["first\n"] and execution.logs.stderr == ["oops\n"]
    assert execution.text == "42" and execution.execution_count and execution.error is None
    assert seen and seen[0][1] == "first\n"
    assert finished - seen[0][0] > 0.8, "stdout came only at the end, not as it happened"

    failed = sandbox.run_code("1 / 0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert (
        "division by zero" in failed.error.value and "ZeroDivisionError" in failed.error.traceback
    )
    assert failed.execution_count == execution.execution_count + 1


def test_every_mime_type_reaches_the_sdk(sandbox: Sandbox) -> None:
    execution = sandbox.run_code(
        "from IPython.display import display, HTML, SVG, JSON, Latex, Markdown\n"
        "import matplotlib.pyplot as plt\n"
        "display(HTML('<b>x</b>')); display(Markdown('*m*')); display(Latex(r'$x^2$'))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>')); display(JSON({'a': 1}))\n"
        "plt.plot([1, 2]); plt.show()\n"
        "display({'application/x-custom': 'c', 'text/plain': 'custom'}, raw=True)"
    )
    results = execution.results
    assert execution.error is None, execution.error
    assert results[0].html == "<b>x</b>" and results[1].markdown == "*m*"
    assert results[2].latex == "$x^2$" and "<svg" in results[3].svg
    assert results[4].json == {"a": 1}
    assert results[5].png and len(results[5].png) > 1000
    assert results[6].extra == {"application/x-custom": "c"} and results[6].text == "custom"
    assert not any(r.is_main_result for r in results)


def test_env_vars_at_create_and_for_one_run() -> None:
    sbx = Sandbox.create(envs={"AT_CREATE": "yes"}, metadata={"owner": "env-test"})
    try:
        assert sbx.run_code("import os; os.environ['AT_CREATE']").text == "'yes'"
        run = "import os; os.environ.get('PER_RUN')"
        assert sbx.run_code(run, envs={"PER_RUN": "1"}).text == "'1'"
        assert sbx.run_code(run).text is None, "a run's env var outlived its run"
    finally:
        sbx.kill()


def test_list_filters_by_metadata_and_pages() -> None:
    tag = f"list-{time.monotonic_ns()}"
    made = [Sandbox.create(metadata={"tag": tag, "n": str(n)}) for n in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        first = paginator.next_items()
        assert len(first) == 2 and paginator.has_next
        second = paginator.next_items()
        assert len(second) == 1 and not paginator.has_next
        found = {s.sandbox_id for s in first + second}
        assert found == {s.sandbox_id for s in made}
        assert all(s.metadata["tag"] == tag for s in first + second)
        only = Sandbox.list(query=SandboxQuery(metadata={"tag": tag, "n": "1"})).next_items()
        assert [s.sandbox_id for s in only] == [made[1].sandbox_id]
    finally:
        for sbx in made:
            sbx.kill()


def test_info_timeout_connect_and_kill(sandbox: Sandbox, gateway: GatewayProcess) -> None:
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id and info.template_id == "python3"
    assert 250 < (info.end_at - info.started_at).total_seconds() < 350  # E2B's 300 s default
    session = gateway.client.get(f"/v1/sessions/{sandbox.sandbox_id}").json()
    assert session["idle_timeout"] == 300, "an idle sandbox would end before its timeout"
    sandbox.set_timeout(1200)
    later = sandbox.get_info().end_at
    assert (later - info.end_at).total_seconds() > 800
    session = gateway.client.get(f"/v1/sessions/{sandbox.sandbox_id}").json()
    assert session["idle_timeout"] == 1200
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.run_code("x = 5; x").text == "5"
    assert sandbox.run_code("x").text == "5", "connect gave another sandbox"
    metrics = sandbox.get_metrics()
    assert metrics and metrics[0].mem_total > 0 and metrics[0].disk_total > 0
    assert sandbox.is_running()
    assert Sandbox.kill(sandbox.sandbox_id) is True
    assert not sandbox.is_running()
    assert Sandbox.kill(sandbox.sandbox_id) is False
    with pytest.raises(E2BTimeout, match=r"was not found|timeout"):
        sandbox.run_code("1")
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox.sandbox_id)


def test_pause_and_connect_keep_the_state(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = 41")
    assert sandbox.pause() is True
    (info,) = [s for s in Sandbox.list().next_items() if s.sandbox_id == sandbox.sandbox_id]
    assert info.state.value == "paused"
    assert sandbox.pause() is False, "a second pause is the SDK's already-paused answer"
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.run_code("kept + 1").text == "42", "the resumed sandbox lost its state"


def test_a_wrong_key_is_refused() -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-a-gateway-token")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-a-gateway-token").next_items()


def test_another_sandboxs_token_is_refused(sandbox: Sandbox, gateway: GatewayProcess) -> None:
    other = Sandbox.create()
    try:
        headers = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": "49999",
            "X-Access-Token": other._envd_access_token,
        }
        r = httpx.post(f"{gateway.url}/execute", json={"code": "1"}, headers=headers)
        assert r.status_code == 401, r.text
    finally:
        other.kill()


RUNNING = """
import os
def running(name):
    found = False
    for pid in os.listdir('/proc'):
        try:
            found |= name in open(f'/proc/{pid}/cmdline').read()
        except OSError:
            pass
    return found
"""


def test_code_contexts_are_kernels_of_their_own_in_one_sandbox(sandbox: Sandbox) -> None:
    sandbox.run_code("x = 'default'\nopen('shared.txt', 'w').write('from default')\n" + RUNNING)
    context = sandbox.create_code_context(language="python", cwd="/home/user/sub")
    assert context.language == "python" and context.cwd == "/home/user/sub"
    assert [c.id for c in sandbox.list_code_contexts()] == [sandbox.sandbox_id, context.id]
    assert sandbox.run_code("'x' in dir()", context=context).text == "False"
    here = "import os\n(os.getcwd(), open('../shared.txt').read())"
    assert sandbox.run_code(here, context=context).text == "('/workspace/sub', 'from default')"
    sandbox.run_code("x = 'context'", context=context)
    assert sandbox.run_code("x").text == "'default'"
    sandbox.restart_code_context(context)
    assert sandbox.run_code("'x' in dir()", context=context).text == "False"

    # Another kernel the image holds; a language it lacks is refused, naming what it has.
    xeus = sandbox.create_code_context(language="xpython")
    assert sandbox.run_code("x = 3\nx", context=xeus).text == "3"
    with pytest.raises(SandboxException, match=r"400.*holds no language 'r'.*python \(python3\)"):
        sandbox.create_code_context(language="r")
    with pytest.raises(SandboxException, match="holds no language 'javascript'"):
        sandbox.run_code("1", language="javascript")

    # Code in one context that kills another's kernel: that one starts empty next time.
    pid = sandbox.run_code("import os\nos.getpid()", context=context).text
    sandbox.run_code(f"import os, signal\nos.kill({pid}, signal.SIGKILL)")
    time.sleep(1)  # the gateway hears of it when the exec's stream ends
    assert sandbox.run_code("'x' in dir()", context=context).text == "False"

    # Removed: gone from the list and from the sandbox's processes.
    sandbox.remove_code_context(context)
    assert [c.id for c in sandbox.list_code_contexts()] == [sandbox.sandbox_id, xeus.id]
    with pytest.raises(NotFoundException, match="does not exist"):
        sandbox.run_code("1", context=context)
    assert sandbox.run_code(f"running({context.id!r})").text == "False"
    assert sandbox.run_code("x").text == "'default'"


def test_a_client_that_goes_away_interrupts_the_kernel(sandbox: Sandbox) -> None:
    sandbox.run_code("state = 'kept'")
    started = time.monotonic()
    with pytest.raises(E2BTimeout):
        sandbox.run_code("import time\nwhile True: time.sleep(0.05)", timeout=1.5)
    assert time.monotonic() - started < 10
    answered = time.monotonic()
    assert sandbox.run_code("state").text == "'kept'", "the session lost its state"
    assert time.monotonic() - answered < 5, "the kernel was left busy with the abandoned code"


def test_output_past_the_cap_is_cut_and_the_gateway_answers(sandbox: Sandbox) -> None:
    execution = sandbox.run_code("print('x' * 1000, end=''); print('y' * 3_000_000)")
    text = "".join(execution.logs.stdout + execution.logs.stderr)
    assert len(text) < 2_000_000 and "limit" in text
    assert sandbox.run_code("'alive'").text == "'alive'"


def test_two_sandboxes_at_once() -> None:
    first, second = Sandbox.create(), Sandbox.create()
    try:
        results: dict[str, str | None] = {}

        def use(sbx: Sandbox, value: int) -> None:
            sbx.run_code(f"import time; mine = {value}; time.sleep(1)")
            results[sbx.sandbox_id] = sbx.run_code("mine").text

        threads = [threading.Thread(target=use, args=(s, n)) for n, s in enumerate((first, second))]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {first.sandbox_id: "0", second.sandbox_id: "1"}
        assert time.monotonic() - started < 4, "the two sandboxes ran one after the other"
    finally:
        first.kill()
        second.kill()


def test_async_sdk() -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(metadata={"kind": "async"})
        try:
            lines: list[str] = []
            execution = await sbx.run_code(
                "print('a'); 2 ** 10", on_stdout=lambda m: lines.append(m.line)
            )
            assert execution.text == "1024" and lines == ["a\n"]
            await sbx.files.write("async.bin", bytes(range(256)))
            assert bytes(await sbx.files.read("async.bin", format="bytes")) == bytes(range(256))
            assert await sbx.is_running()
            base = await AsyncBaseSandbox.connect(sbx.sandbox_id)
            assert [e.name for e in await base.files.list("/home/user")] == ["async.bin"]
            said = await base.commands.run("wc -c < async.bin")
            assert said.stdout.strip() == "256"
            with pytest.raises(CommandExitException):
                await base.commands.run("exit 2")
        finally:
            await sbx.kill()
        assert not await sbx.is_running()

    asyncio.run(main())


def test_sandboxes_are_addressed_by_host_too(sandbox: Sandbox, gateway: GatewayProcess) -> None:
    """``PORT-SANDBOXID.DOMAIN``, as a TLS proxy in front of the gateway passes it on."""
    token = {"X-Access-Token": sandbox._envd_access_token}
    envd = {"Host": f"49983-{sandbox.sandbox_id}.sandbox.example.org", **token}
    jupyter = {"Host": f"49999-{sandbox.sandbox_id}.sandbox.example.org", **token}
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        assert client.get("/health", headers=envd).status_code == 204
        r = client.post("/files?path=host.txt", content=b"via host", headers={
            **envd, "Content-Type": "application/octet-stream"})  # fmt: skip
        assert r.status_code == 200, r.text
        r = client.post("/execute", json={"code": "open('host.txt').read()"}, headers=jupyter)
        assert '"text": "\'via host\'"' in r.text, r.text
        assert (
            client.get("/health", headers={**envd, "Host": "49983-nope.x.org"}).status_code == 401
        )
        assert client.post("/execute", json={"code": "1"}, headers=envd).status_code == 404


TOKENS = {"acme": "acme-e2b-key", "rival": "rival-e2b-key"}  # the E2B API keys
TENANTS = "[tenants.rival]\nmax_sessions = 1\n"


def test_another_tenants_sandbox_does_not_exist(tenants, monkeypatch) -> None:
    for name, value in e2b_env(tenants[0], "acme-e2b-key").items():
        monkeypatch.setenv(name, value)
    mine = Sandbox.create(metadata={"who": "acme"})
    try:
        rival = {"api_key": "rival-e2b-key"}
        with pytest.raises(NotFoundException):
            Sandbox.connect(mine.sandbox_id, **rival)
        with pytest.raises(NotFoundException):
            Sandbox.get_info(mine.sandbox_id, **rival)
        assert Sandbox.kill(mine.sandbox_id, **rival) is False
        assert Sandbox.list(**rival).next_items() == []
        assert mine.run_code("'still mine'").text == "'still mine'"
    finally:
        mine.kill()


def test_sbx_e2b_env_is_the_whole_setup(gateway: GatewayProcess) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBX_", "E2B_"))}
    env.update(SBX_URL=gateway.url, SBX_TOKEN=gateway.token, PYTHONPATH=str(ROOT))
    script = (
        "from e2b_code_interpreter import Sandbox\n"
        "s = Sandbox.create()\nprint(s.run_code('6 * 7').text)\ns.kill()"
    )
    done = subprocess.run(
        ["bash", "-c", f'eval "$({sys.executable} -m gateway.cli e2b env)" && '
         f'{sys.executable} -c "$SCRIPT"'],
        env={**env, "SCRIPT": script}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr


def test_a_tenants_quota_holds(tenants, monkeypatch) -> None:
    for name, value in e2b_env(tenants[0], "rival-e2b-key").items():
        monkeypatch.setenv(name, value)
    first = Sandbox.create()
    try:
        with pytest.raises(RateLimitException):
            Sandbox.create()
    finally:
        first.kill()


def test_signed_file_urls_work_by_host(sandbox: Sandbox, gateway: GatewayProcess) -> None:
    """``download_url`` / ``upload_url`` carry a signature instead of the token header."""
    host = {"Host": f"49983-{sandbox.sandbox_id}.sandbox.example.org"}
    upload = httpx.URL(sandbox.upload_url("signed.txt", use_signature_expiration=60))
    download = httpx.URL(sandbox.download_url("signed.txt", use_signature_expiration=60))
    with httpx.Client(base_url=gateway.url, headers=host, timeout=30) as client:
        r = client.post(upload.raw_path.decode(), files={"file": ("signed.txt", b"signed!")})
        assert r.status_code == 200, r.text
        assert client.get(download.raw_path.decode()).content == b"signed!"
        forged = download.raw_path.decode().replace("signature=v1_", "signature=v1_x")
        assert client.get(forged).status_code == 401
        as_write = download.raw_path.decode()  # a read signature does not allow a write
        r = client.post(as_write, files={"file": ("signed.txt", b"overwritten")})
        assert r.status_code == 401
    assert sandbox.files.read("signed.txt") == "signed!"
