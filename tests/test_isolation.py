"""Runtimes and network policies against the real engine: gVisor, and egress allowlists.

The allowlist tests reach a local HTTP server (a tiny package index) through
the gateway's egress proxy, on a gateway whose operator setting permits the
loopback range, so they depend on no outside host.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import io
import json
import socket
import threading
import zipfile
from pathlib import Path

import pytest
from helpers import Canary, canary_session, e2b_env, origin_authority, run, text_of

from gateway.config import Settings
from gateway.errors import RuntimeUnavailable
from gateway.sandbox.isolation import runtimes
from gateway.sandbox.isolation.runtimes import EngineRuntimes, Runtimes
from gateway.wiring import isolation_options

pytestmark = pytest.mark.docker

# Proxy use without the NO_PROXY entries that keep "localhost" inside the sandbox:
# the test server lives on the host's loopback, which only the proxy can reach.
FETCH = """
import os, urllib.request, urllib.error
for name in ("NO_PROXY", "no_proxy"):
    os.environ.pop(name, None)
def fetch(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode().strip()
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.read().decode().strip()}"
    except OSError as e:
        return f"ERR {e}"
"""


def wheel(name: str, version: str, source: str) -> tuple[str, bytes]:
    """A minimal pure-Python wheel, so pip has something real to install."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sbx-test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


@pytest.fixture(scope="module")
def local_index(tmp_path_factory) -> str:
    """An HTTP server on the host's loopback: a file and a PEP 503 package index."""
    root = tmp_path_factory.mktemp("index")
    (root / "hello.txt").write_text("hello from the host\n")
    filename, data = wheel("sbxdemo", "1.0", "ANSWER = 42\n")
    (root / "files").mkdir()
    (root / "files" / filename).write_bytes(data)
    (root / "simple" / "sbxdemo").mkdir(parents=True)
    (root / "simple" / "sbxdemo" / "index.html").write_text(
        f'<a href="../../files/{filename}">{filename}</a>\n'
    )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> tuple[Path, int, list[dict]]:
    """An HTTPS server on the host's loopback with its own authority (the CA file, the port,
    the headers of each request it got), answering each request with its headers."""
    ca_file, context = origin_authority(tmp_path_factory.mktemp("origin"))
    received: list[dict] = []

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            received.append(dict(self.headers))
            body = json.dumps({**dict(self.headers), "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 128

    server = Server(("127.0.0.1", 0), Echo)
    # The handshake in each request's thread: accept() must not wait on one client's hello.
    server.socket = context.wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield ca_file, server.server_address[1], received
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def egress_gateway(start_gateway, origin):
    ca_file = origin[0]
    return start_gateway("--egress-allow-ranges", "127.0.0.0/8", "--egress-ca-file", str(ca_file))


@pytest.fixture
def egress_session(egress_gateway):
    """Factory for allowlist sessions on the egress gateway, deleted after the test."""
    api = egress_gateway.client
    made: list[str] = []

    def create(allow: list[str], runtime: str = "runc") -> str:
        body = {"network": {"allow": allow}, "runtime": runtime}
        r = api.post("/v1/sessions", json=body)
        assert r.status_code == 201, f"creating an allowlist session failed: {r.text}"
        made.append(r.json()["id"])
        return made[-1]

    yield create
    for sid in made:
        api.delete(f"/v1/sessions/{sid}")


# -- runtimes ----------------------------------------------------------------------------


@pytest.mark.parametrize(("runtime", "engine_name"), [("runc", "runc"), ("gvisor", "runsc")])
def test_a_session_runs_under_the_runtime_it_asks_for(
    api, new_session, engine, runtime, engine_name
):
    session = new_session(runtime=runtime)
    assert session["runtime"] == runtime
    host = engine.api.inspect_container(f"sbx-{session['id']}")["HostConfig"]
    assert host["Runtime"] == engine_name and host["NetworkMode"] == "none"
    kernel = text_of(run(api, session["id"], "import platform; print(platform.release())"))
    # gVisor reports its own kernel version, never the host's.
    assert (kernel.strip() == "4.4.0") == (runtime == "gvisor"), kernel


def test_runc_is_the_default_runtime(session):
    assert session["runtime"] == "runc" and session["network"] == "none"


def test_an_unknown_runtime_is_a_400(api):
    r = api.post("/v1/sessions", json={"runtime": "kata"})
    assert r.status_code == 400, r.text
    assert "runtime must be one of runc, gvisor" in r.json()["error"]["message"]


def test_a_runtime_the_server_does_not_allow_is_a_403(start_gateway):
    gw = start_gateway("--runtimes", "runc")
    r = gw.client.post("/v1/sessions", json={"runtime": "gvisor"})
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "not_allowed" and "allowed: runc" in error["message"]
    r = gw.client.post("/v1/sessions", json={"network": {"allow": ["a.example"]}})
    assert r.status_code == 201, "allowlists stay available when only the runtime is limited"
    gw.client.delete(f"/v1/sessions/{r.json()['id']}")


def test_gvisor_refuses_a_pids_limit_it_cannot_start_under(api):
    r = api.post("/v1/sessions", json={"runtime": "gvisor", "limits": {"pids": 64}})
    assert r.status_code == 422, r.text
    assert "ask for at least 128" in r.json()["error"]["message"]


def test_an_operator_seccomp_profile_refuses_ptrace_under_runc(start_gateway, tmp_path, engine):
    """An operator's own profile file reaches the engine and is the one enforced."""
    profile = tmp_path / "no-ptrace.json"
    rules = [
        {"names": ["ptrace", "process_vm_readv", "process_vm_writev"], "action": "SCMP_ACT_ERRNO"}
    ]
    profile.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}))
    gw = start_gateway("--seccomp-profile", str(profile))
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    code = (
        "import ctypes, errno, subprocess\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "attached = libc.ptrace(16, child.pid, 0, 0) == 0\n"
        "print('attached' if attached else errno.errorcode[ctypes.get_errno()])\n"
        "child.kill()"
    )
    try:
        assert text_of(run(gw.client, sid, code)) == "EPERM\n"
        options = engine.api.inspect_container(f"sbx-{sid}")["HostConfig"]["SecurityOpt"]
        assert "no-new-privileges" in options and any(o.startswith("seccomp=") for o in options)
    finally:
        gw.client.delete(f"/v1/sessions/{sid}")


def test_an_allowed_runtime_the_engine_lacks_is_a_clear_error(engine, monkeypatch, tmp_path):
    monkeypatch.setitem(runtimes.RUNTIMES, "gvisor", EngineRuntimes("sbx-absent", "sbx-absent"))
    options = isolation_options(Settings.from_mapping({"data_dir": str(tmp_path)}))
    catalog = Runtimes(options.runtimes, options.default_runtime, engine)
    with pytest.raises(RuntimeUnavailable, match="scripts/setup-gvisor") as caught:
        asyncio.run(catalog.engine_name("gvisor", networked=False))
    assert caught.value.status == 503 and caught.value.code == "runtime_unavailable"
    assert asyncio.run(catalog.engine_name("runc", networked=True)) == "runc"


def test_a_network_policy_the_server_does_not_offer_is_a_403(start_gateway):
    gw = start_gateway("--network-policies", "none")
    r = gw.client.post("/v1/sessions", json={"network": {"allow": ["a.example"]}})
    assert r.status_code == 403 and "network policy 'allowlist'" in r.text, r.text


def test_a_malformed_network_policy_is_a_400(api):
    r = api.post("/v1/sessions", json={"network": {"allow": ["no spaces.example"]}})
    assert r.status_code == 400 and "is not a host name" in r.text, r.text


# -- egress allowlists -------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
def test_an_allowlisted_host_is_reached_through_the_proxy(
    egress_gateway, egress_session, local_index, engine, runtime
):
    sid = egress_session(["127.0.0.1"], runtime=runtime)
    info = engine.api.inspect_container(f"sbx-{sid}")
    assert info["HostConfig"]["NetworkMode"] == "sbx-egress"
    assert egress_gateway.client.get(f"/v1/sessions/{sid}").json()["network"] == {
        "allow": ["127.0.0.1"]
    }
    code = FETCH + f"print(fetch('http://{local_index}/hello.txt'))"
    assert text_of(run(egress_gateway.client, sid, code)) == "hello from the host\n"


def test_an_allowlisted_name_is_resolved_by_the_proxy(egress_gateway, egress_session, local_index):
    """Names are looked up by the proxy, on resolver threads of its own (test_egress_proxy.py)."""
    sid = egress_session(["localhost", "no-such-host.invalid"])
    port = local_index.rsplit(":", 1)[1]
    code = FETCH + (
        f"print(fetch('http://localhost:{port}/hello.txt'))\n"
        "print(fetch('http://no-such-host.invalid/x'))"
    )
    reached, unresolved = text_of(run(egress_gateway.client, sid, code)).splitlines()
    assert reached == "hello from the host"
    assert unresolved.startswith("HTTP 502") and "cannot resolve no-such-host.invalid" in unresolved


def test_pip_installs_from_an_allowlisted_index(egress_gateway, egress_session, local_index):
    sid = egress_session(["127.0.0.1"])
    code = (
        FETCH + "import subprocess, sys\n"
        "done = subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet', "
        "'--no-cache-dir', '--disable-pip-version-check', '--target', '/tmp/pkgs', "
        f"'--index-url', 'http://{local_index}/simple', 'sbxdemo'], capture_output=True, "
        "text=True)\n"
        "print(done.returncode, done.stderr[-500:])\n"
        "sys.path.insert(0, '/tmp/pkgs')\n"
        "import sbxdemo; print(sbxdemo.ANSWER)"
    )
    out = text_of(run(egress_gateway.client, sid, code, timeout=120))
    assert out.splitlines()[-1] == "42", f"pip install through the proxy failed: {out}"


def test_hosts_off_the_list_are_refused_and_logged(egress_gateway, egress_session, local_index):
    sid = egress_session(["allowed.example"])
    code = FETCH + (
        f"print(fetch('http://{local_index}/hello.txt'))\nprint(fetch('http://unlisted.example/'))"
    )
    out = text_of(run(egress_gateway.client, sid, code)).splitlines()
    assert out[0].startswith("HTTP 403") and "not on this session's allowlist" in out[0], out
    assert out[1].startswith("HTTP 403"), out
    log = egress_gateway.tail(400)
    assert f"egress denied: session={sid} method=GET target=http://unlisted.example/" in log


def test_private_loopback_and_metadata_addresses_need_the_operators_permission(
    api, new_session, local_index
):
    """On a gateway without egress_allow_ranges a session's list cannot open them."""
    port = local_index.split(":")[1]
    sid = new_session(network={"allow": ["localhost", "127.0.0.1", "169.254.169.254"]})["id"]
    code = FETCH + (
        f"print(fetch('http://localhost:{port}/hello.txt'))\n"
        f"print(fetch('http://127.0.0.1:{port}/hello.txt'))\n"
        "print(fetch('http://169.254.169.254/latest/meta-data/'))"
    )
    out = text_of(run(api, sid, code)).splitlines()
    assert "127.0.0.1 is loopback, which sandboxes may not reach" in out[0], out
    assert "127.0.0.1 is loopback" in out[1], out
    assert "169.254.169.254 is link-local" in out[2], out


def test_the_gateways_own_port_is_never_reachable(egress_gateway, egress_session):
    sid = egress_session(["127.0.0.1"])
    port = egress_gateway.url.rsplit(":", 1)[1]
    out = text_of(
        run(egress_gateway.client, sid, FETCH + f"print(fetch('http://127.0.0.1:{port}/healthz'))")
    )
    assert out.startswith("HTTP 403") and "is the gateway itself" in out, out


def test_the_host_is_fenced_off_but_for_the_proxy(egress_gateway, egress_session):
    """Host services listening on all addresses stay out of reach; DNS fails at once."""
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    sid = egress_session(["127.0.0.1"])
    code = (
        "import os, socket, time\n"
        "proxy_host = os.environ['HTTP_PROXY'].rsplit('@', 1)[1].split(':')[0]\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n"
        f"    s.connect((proxy_host, {port})); print('reached the host')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__)\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    socket.getaddrinfo('anything.example', 443)\n"
        "    print('resolved')\n"
        "except OSError:\n"
        "    print('no dns', round(time.monotonic() - started) < 2)\n"
        "print(open('/proc/net/if_inet6').read() == '')"
    )
    try:
        out = text_of(run(egress_gateway.client, sid, code)).splitlines()
    finally:
        listener.close()
    assert out[0].startswith("blocked"), f"a host port was reachable from the sandbox: {out}"
    assert out[1] == "no dns True", out
    assert out[2] == "True", "the sandbox has IPv6 addresses"


def test_allowlist_sessions_cannot_reach_each_other(egress_gateway, egress_session, engine):
    listener_sid, other_sid = egress_session(["127.0.0.1"]), egress_session(["127.0.0.1"])
    run(
        egress_gateway.client,
        listener_sid,
        "import socket; srv = socket.create_server(('0.0.0.0', 8000)); srv.listen()",
    )
    address = engine.api.inspect_container(f"sbx-{listener_sid}")["NetworkSettings"]["Networks"][
        "sbx-egress"
    ]["IPAddress"]
    code = (
        FETCH + "import socket\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n"
        f"    s.connect(('{address}', 8000)); print('reached')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__)\n"
        f"print(fetch('http://{address}:8000/'))"
    )
    out = text_of(run(egress_gateway.client, other_sid, code)).splitlines()
    assert out[0].startswith("blocked"), f"one sandbox reached another: {out}"
    assert out[1].startswith("HTTP 403"), out


def test_the_proxy_credentials_are_the_sessions_own(egress_gateway, egress_session):
    sid = egress_session(["127.0.0.1"])
    env = json.loads(
        text_of(
            run(egress_gateway.client, sid, "import os, json; print(json.dumps(dict(os.environ)))")
        )
    )
    assert (
        env["HTTPS_PROXY"].startswith(f"http://{sid}:") and env["HTTP_PROXY"] == env["HTTPS_PROXY"]
    )
    assert "localhost" in env["NO_PROXY"]


def test_key_file_is_private(egress_gateway, egress_session):
    egress_session(["127.0.0.1"])
    key = Path(egress_gateway.data_dir) / "egress" / "key"
    assert key.stat().st_mode & 0o777 == 0o600


def test_none_sessions_keep_no_network_on_an_egress_gateway(egress_gateway, engine):
    r = egress_gateway.client.post("/v1/sessions", json={})
    sid = r.json()["id"]
    try:
        assert engine.api.inspect_container(f"sbx-{sid}")["HostConfig"]["NetworkMode"] == "none"
    finally:
        egress_gateway.client.delete(f"/v1/sessions/{sid}")


def test_every_connection_is_recorded_per_session_and_execution(
    egress_gateway, egress_session, local_index
):
    api = egress_gateway.client
    sid = egress_session(["127.0.0.1"])
    code = FETCH + (
        f"print(fetch('http://{local_index}/hello.txt'))\nprint(fetch('http://unlisted.example/'))"
    )
    run(api, sid, code)
    (execution,) = api.get(f"/v1/sessions/{sid}/history").json()["executions"]
    page = api.get(f"/v1/sessions/{sid}/network")
    assert page.status_code == 200 and page.json()["next"] is None
    allowed, denied = page.json()["connections"]
    assert allowed["host"] == "127.0.0.1" and allowed["port"] == int(local_index.split(":")[1])
    assert (allowed["method"], allowed["decision"], allowed["rule"]) == (
        "GET",
        "allowed",
        "127.0.0.1",
    )
    assert allowed["bytes_down"] > len("hello from the host") and allowed["duration_ms"] > 0
    assert allowed["bytes_up"] > len("GET /hello.txt HTTP/1.1"), "a plain request's head counts"
    assert (denied["host"], denied["decision"], denied["rule"]) == (
        "unlisted.example",
        "denied",
        None,
    )
    assert {allowed["execution_id"], denied["execution_id"]} == {execution["id"]}
    summary = execution["network"]
    assert summary == {
        "connections": 2,
        "refused": 1,
        "bytes_up": allowed["bytes_up"] + denied["bytes_up"],
        "bytes_down": allowed["bytes_down"] + denied["bytes_down"],
        "hosts": [local_index, "unlisted.example:80"],
    }, "the summary names host and port and counts bytes both ways"
    cell = api.get(f"/v1/sessions/{sid}/notebook").json()["cells"][0]
    assert cell["metadata"]["sbx"]["network"] == summary
    assert api.get(f"/v1/sessions/{sid}/network", params={"limit": 1}).json()["next"]
    assert api.get(f"/v1/sessions/{sid}/network", params={"limit": 0}).status_code == 400
    assert api.get("/v1/sessions/no-such/network").status_code == 404


# -- rules changed on a live session -----------------------------------------------------

HOLD = """
import base64, os, socket, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
held = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
creds = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
auth = f"Proxy-Authorization: Basic {creds}\\r\\n"
held.sendall(f"CONNECT {TARGET} HTTP/1.1\\r\\n{auth}\\r\\n".encode())
print(held.recv(100).split(b"\\r\\n")[0].decode())
"""


def test_rules_changed_on_a_live_session_hold_for_the_next_connection(
    egress_gateway, egress_session, local_index
):
    api = egress_gateway.client
    sid = egress_session(["127.0.0.1"])
    hello = FETCH + f"print(fetch('http://{local_index}/hello.txt'))"
    assert text_of(run(api, sid, hello)) == "hello from the host\n"
    opened = text_of(run(api, sid, HOLD.replace("{TARGET}", local_index)))
    assert opened == "HTTP/1.1 200 Connection established\n"

    r = api.patch(f"/v1/sessions/{sid}/network", json={"allow": ["allowed.example"]})
    assert r.status_code == 200 and r.json()["network"] == {"allow": ["allowed.example"]}, r.text
    # in force when the PATCH answers: the next connection is refused, the open one was cut
    refused = text_of(run(api, sid, hello))
    assert refused.startswith("HTTP 403") and "not on this session's allowlist" in refused
    assert text_of(run(api, sid, "held.settimeout(5); print(held.recv(10))")) == "b''\n"
    assert api.get(f"/v1/sessions/{sid}").json()["network"] == {"allow": ["allowed.example"]}
    audit = egress_gateway.tail(200)
    assert (
        '"action": "session.network"' in audit
        and '"after": {"allow": ["allowed.example"]}' in audit
    )

    r = api.patch(f"/v1/sessions/{sid}/network", json={"allow": ["public"], "deny": ["10.0.0.0/8"]})
    assert r.status_code == 200, r.text
    assert text_of(run(api, sid, hello)) == "hello from the host\n"


def test_bad_network_changes_get_clear_errors(egress_gateway, egress_session, new_session):
    api = egress_gateway.client
    sid = egress_session([])
    for body, status, says in [
        ({"allow": "x.example"}, 400, "network.allow must be a list"),
        ({"allow": ["bad host"]}, 400, "network.allow entry 'bad host'"),
        ({}, 400, 'network must be "none" or'),
    ]:
        r = api.patch(f"/v1/sessions/{sid}/network", json=body)
        assert r.status_code == status and says in r.json()["error"]["message"], r.text
    r = api.patch("/v1/sessions/no-such-session/network", json={"allow": []})
    assert r.status_code == 404, r.text
    none = api.post("/v1/sessions", json={}).json()["id"]
    try:
        r = api.patch(f"/v1/sessions/{none}/network", json={"allow": ["a.example"]})
        assert r.status_code == 409 and "created with network" in r.text, r.text
    finally:
        api.delete(f"/v1/sessions/{none}")


def test_the_stock_e2b_sdk_chooses_and_changes_a_sandboxs_network(
    egress_gateway, local_index, monkeypatch
):
    from e2b import ALL_TRAFFIC, Sandbox

    for name, value in e2b_env(egress_gateway, egress_gateway.token).items():
        monkeypatch.setenv(name, value)
    sandbox = Sandbox.create(network={"allow_out": ["127.0.0.1"], "deny_out": [ALL_TRAFFIC]})
    try:
        view = egress_gateway.client.get(f"/v1/sessions/{sandbox.sandbox_id}").json()
        assert view["network"] == {"allow": ["127.0.0.1"]}
        sandbox.files.write("fetch.py", FETCH + f"print(fetch('http://{local_index}/hello.txt'))")
        fetch = "/opt/venv/bin/python fetch.py"
        assert sandbox.commands.run(fetch).stdout == "hello from the host\n"
        sandbox.update_network({"deny_out": [ALL_TRAFFIC]})
        assert sandbox.commands.run(fetch).stdout.startswith("HTTP 403")
        sandbox.update_network({"allow_out": ["127.0.0.1"], "deny_out": [ALL_TRAFFIC]})
        assert sandbox.commands.run(fetch).stdout == "hello from the host\n"
    finally:
        sandbox.kill()


# -- credentials brokered at egress --------------------------------------------------------

BROKERED = """
import json, os, ssl, urllib.request
for name in ("NO_PROXY", "no_proxy"):  # the origin is on the host's loopback: by the proxy
    os.environ.pop(name, None)
url = "https://localhost:{port}/repos"
seen = {{}}
seen["env"] = os.environ["GH_TOKEN"]
request = urllib.request.Request(url, headers={{"X-Token": os.environ["GH_TOKEN"]}})
seen["urllib"] = json.load(urllib.request.urlopen(request, timeout=10))
try:
    import requests
    seen["requests"] = requests.get(url, timeout=10).json()
except ImportError:
    pass
print(json.dumps(seen))
"""


def test_a_brokered_credential_reaches_its_host_and_never_the_sandbox(egress_gateway, origin):
    api, (_, port, received) = egress_gateway.client, origin
    value = "ghp_brokered0123456789abcdef"
    assert api.put("/v1/secrets/GH_TOKEN", json={"value": value}).status_code in (200, 201)
    body = {
        "network": {"allow": ["localhost"]},
        "credentials": [{"secret": "GH_TOKEN", "hosts": ["localhost"], "format": "Bearer {value}"}],
    }
    made = api.post("/v1/sessions", json=body)
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    try:
        assert made.json()["credentials"] == [
            {"secret": "GH_TOKEN", "hosts": ["localhost"], "header": "Authorization",
             "format": "Bearer {value}"}
        ]  # fmt: skip
        ran = run(api, sid, BROKERED.format(port=port))
        assert ran["status"] == "ok", ran["outputs"][-1].get("evalue")[-1].get("evalue")
        out = json.loads(text_of(ran))
        assert out["env"].startswith("sbx-placeholder-GH_TOKEN-") and value not in out["env"]
        # the origin got the value; echoed back into the sandbox, outputs show it masked
        assert received[0]["Authorization"] == f"Bearer {value}"
        assert received[0]["X-Token"] == value  # the placeholder, swapped on the way
        for client in ("urllib", "requests"):
            if client in out:
                assert out[client]["Authorization"] == "Bearer ***GH_TOKEN***", out[client]
        records = api.get(f"/v1/sessions/{sid}/network").json()["connections"]
        assert records[0]["intercepted"] and records[0]["injected"] == ["GH_TOKEN"]
        # the sandbox cannot read the value anywhere it can reach
        env = text_of(run(api, sid, "import os; print(sorted(os.environ.items()))"))
        assert value not in env
    finally:
        api.delete(f"/v1/sessions/{sid}")


def test_a_credential_for_a_host_off_the_allow_list_is_a_400(egress_gateway):
    body = {
        "network": {"allow": ["localhost"]},
        "credentials": [{"secret": "GH_TOKEN", "hosts": ["api.example.com"]}],
    }
    r = egress_gateway.client.post("/v1/sessions", json=body)
    assert r.status_code == 400 and "allow list does not name" in r.text, r.text


E2B_FETCH = """
import json, os, urllib.request
for name in ("NO_PROXY", "no_proxy"):
    os.environ.pop(name, None)
print(urllib.request.urlopen("https://localhost:{port}/e2b", timeout=10).status)
"""


def test_the_stock_e2b_sdk_brokers_a_secret_into_a_header(egress_gateway, origin, monkeypatch):
    from e2b import ALL_TRAFFIC, Sandbox, Secret

    _, port, received = origin
    for name, value in e2b_env(egress_gateway, egress_gateway.token).items():
        monkeypatch.setenv(name, value)
    value = "e2b-brokered-5f0c1d9a7b"
    info = Secret.create("E2B_KEY", value)
    assert (info.name, info.secret_id) == ("E2B_KEY", "E2B_KEY")
    assert Secret.exists("E2B_KEY") and Secret.get_info("E2B_KEY").name == "E2B_KEY"
    rules = {
        "localhost": [
            {"transform": {"headers": {"Authorization": "Bearer " + Secret.fill("E2B_KEY")}}}
        ]
    }
    network = {"allow_out": ["localhost"], "deny_out": [ALL_TRAFFIC], "rules": rules}
    sandbox = Sandbox.create(network=network)
    try:
        sandbox.files.write("fetch.py", E2B_FETCH.format(port=port))
        assert sandbox.commands.run("/opt/venv/bin/python fetch.py").stdout == "200\n"
        assert received[-1]["Authorization"] == f"Bearer {value}"
        sandbox.update_network(network)  # the same rules again: accepted
    finally:
        sandbox.kill()
        Secret.destroy("E2B_KEY")
    assert not Secret.exists("E2B_KEY")


HOSTILE = """
import base64, json, os, socket, ssl, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
creds = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
def tunnel(target):
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
    auth = f"Proxy-Authorization: Basic {creds}\\r\\n"
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\n{auth}\\r\\n".encode())
    return s, s.recv(200)
context = ssl.create_default_context()  # SSL_CERT_FILE: the session's authority too
bound = "localhost:ORIGIN_PORT"
seen = {}
heads = {
    "other_host": b"GET / HTTP/1.1\\r\\nHost: evil.example\\r\\n\\r\\n",
    "smuggled": b"POST / HTTP/1.1\\r\\nHost: " + bound.encode() + b"\\r\\nContent-Length: 3\\r\\n"
        b"Transfer-Encoding: chunked\\r\\n\\r\\n",
    "oversized": b"GET / HTTP/1.1\\r\\nX: " + b"a" * 100_000 + b"\\r\\n\\r\\n",
}
for name, head in heads.items():
    s, _ = tunnel(bound)
    t = context.wrap_socket(s, server_hostname="localhost")
    try:
        t.sendall(head)
        seen[name] = t.recv(100).split(b"\\r\\n")[0].decode()
    except OSError as e:
        seen[name] = repr(e)
    t.close()
# a client hello naming the bound host, on a tunnel to another address: not intercepted
s, _ = tunnel("127.0.0.1:ORIGIN_PORT")
try:
    context.wrap_socket(s, server_hostname="localhost")
    seen["sni"] = "handshake with the session's authority"
except ssl.SSLError as e:
    seen["sni"] = "origin's certificate: " + e.reason
held = []
for _ in range(300):  # thousands of connections: the proxy serves 64 per sandbox
    s, reply = tunnel(bound)
    if not reply:
        break
    held.append(s)
seen["held"] = len(held)
print(json.dumps(seen))
"""


def test_hostile_tunnels_get_errors_and_a_canary_keeps_answering(egress_gateway, origin):
    api, (_, port, received) = egress_gateway.client, origin
    assert api.put("/v1/secrets/GH_TOKEN", json={"value": "ghp_hostile_0123"}).status_code < 300
    body = {
        "network": {"allow": ["localhost", "127.0.0.1"]},
        "credentials": [{"secret": "GH_TOKEN", "hosts": ["localhost"]}],
    }
    sid = api.post("/v1/sessions", json=body).json()["id"]
    before = len(received)
    try:
        with canary_session(egress_gateway) as canary, Canary(egress_gateway, canary):
            ran = run(api, sid, HOSTILE.replace("ORIGIN_PORT", str(port)), timeout=60)
        assert ran["status"] == "ok", ran["outputs"][-1].get("evalue")
        seen = json.loads(text_of(ran))
        assert seen["other_host"].startswith("HTTP/1.1 421"), seen
        assert seen["smuggled"].startswith("HTTP/1.1 400"), seen
        assert seen["oversized"].startswith("HTTP/1.1 400") or "Error" in seen["oversized"]
        assert seen["sni"].startswith("origin's certificate"), seen
        assert seen["held"] <= 64, seen
        assert len(received) == before, "a refused request reached the origin"
    finally:
        api.delete(f"/v1/sessions/{sid}")


def test_a_fork_keeps_a_brokered_secret_out_of_its_sandbox(egress_gateway):
    """A fork asks for what its source had: the credentials and the network, never the value."""
    api = egress_gateway.client
    value = "ghp_fork_0123456789abcdef"
    assert api.put("/v1/secrets/FORK_TOKEN", json={"value": value}).status_code < 300
    body = {
        "network": {"allow": ["localhost"]},
        "credentials": [{"secret": "FORK_TOKEN", "hosts": ["localhost"]}],
    }
    source = api.post("/v1/sessions", json=body).json()["id"]
    made = []
    try:
        snapshot = api.post(f"/v1/sessions/{source}/snapshots", json={}).json()
        fork = api.post("/v1/sessions", json={"from_snapshot": snapshot["id"]})
        assert fork.status_code == 201, fork.text
        made.append(fork.json()["id"])
        assert fork.json()["credentials"] == [
            {"secret": "FORK_TOKEN", "hosts": ["localhost"], "header": "Authorization",
             "format": "{value}"}
        ]  # fmt: skip
        assert fork.json()["network"] == {"allow": ["localhost"]}
        # hex of what the variable holds: the masker would hide the value, not its hex
        held = text_of(
            run(api, made[0], "import os; print(os.environ['FORK_TOKEN'].encode().hex())")
        )
        assert bytes.fromhex(held.strip()).decode().startswith("sbx-placeholder-FORK_TOKEN-")
    finally:
        for sid in [source, *made]:
            api.delete(f"/v1/sessions/{sid}")
