"""Named volumes on a real engine and kernel: mounted at create, filled to ENOSPC, shared.

One gateway for the module, two tenants; each test makes its own volume.
The domain's rules (names, quotas, holders) are tested without an engine in
tests/unit/sessions/test_named_volumes.py and tests/unit/store/test_volume_records.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import e2b_env, run, text_of

TOKENS = {"acme": "acme-volumes-token-5d1e", "zeta": "zeta-volumes-token-9b3a"}
TENANTS = '[tenants.acme]\nmax_volumes = 3\nmax_disk = "8g"\n'
TENANT_FLAGS = ("--volume-size", "32m")  # what a create naming no size gets (E2B's)

MOUNT_INFO = """
for line in open('/proc/self/mountinfo'):
    fields = line.split()
    if fields[4] == '/workspace/' + PATH:
        print(fields[5])
"""


def _session(client, **body) -> dict:
    r = client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def test_a_volume_is_written_without_a_session_mounted_filled_to_enospc_and_outlives_it(tenants):
    _gw, clients = tenants
    acme, zeta = clients["acme"], clients["zeta"]
    r = acme.post("/v1/volumes", json={"name": "ds", "size": "16m"})
    assert r.status_code == 201, r.text
    volume = r.json()
    for bad in ("a..b", "a\x00b", "x" * 10_000, "a/b"):
        r = acme.post("/v1/volumes", json={"name": bad})
        assert r.status_code == 400 and "1 to 63 letters" in r.text, r.text
        assert len(r.content) < 1000
    for ref in ("ds", volume["id"]):
        assert zeta.get(f"/v1/volumes/{ref}").status_code == 404  # never a leak
        assert zeta.delete(f"/v1/volumes/{ref}").status_code == 404
        assert zeta.get(f"/v1/volumes/{ref}/files/in/data.csv").status_code == 404
    assert acme.put("/v1/volumes/ds/files/in/data.csv", content=b"a,b\n1,2\n").status_code == 201

    writer = _session(acme, volumes=[{"name": "ds", "path": "data"}])
    assert writer["volumes"] == [{"name": "ds", "path": "data", "read_only": False}]
    assert "where" not in str(writer) and "/volumes/" not in str(writer)
    canary = _session(zeta)
    run(zeta, canary["id"], "alive = 42")

    fill = """
import errno
try:
    with open('data/fill', 'wb') as f:
        for _ in range(64):
            f.write(b'x' * 2**20)
            f.flush()
except OSError as e:
    print('errno', e.errno, errno.errorcode[e.errno])
print(open('data/in/data.csv').read().splitlines()[1])
"""
    reply = run(acme, writer["id"], fill)
    assert reply["status"] == "ok", reply
    assert "errno 28 ENOSPC" in text_of(reply) and "1,2" in text_of(reply)
    assert run(zeta, canary["id"], "print(alive)")["outputs"][0]["text"] == "42\n"
    view = acme.get("/v1/volumes/ds").json()
    assert view["used_bytes"] > 8 * 2**20
    assert view["mounted_by"] == [{"session_id": writer["id"], "read_only": False}]
    r = acme.put("/v1/volumes/ds/files/more.bin", content=b"y" * 8 * 2**20)
    assert r.status_code == 413, r.text  # full: the upload is refused, nothing is left

    flags = text_of(run(acme, writer["id"], "PATH = 'data'" + MOUNT_INFO)).split(",")
    assert {"rw", "nosuid", "nodev"} <= set(flags), flags
    link = "import os\ntry:\n    os.link('/etc/hostname', 'data/h')\nexcept OSError as e:\n"
    reply = run(acme, writer["id"], link + "    print(e.strerror)")
    assert text_of(reply) == "Invalid cross-device link\n"  # a hard link never leaves it

    r = acme.post(
        "/v1/sessions", json={"volumes": [{"name": "ds", "path": "d", "read_only": True}]}
    )
    assert r.status_code == 409 and writer["id"] in r.text, r.text  # a writer is alone
    r = acme.delete("/v1/volumes/ds")
    assert r.status_code == 409 and "volume_in_use" in r.text and writer["id"] in r.text

    assert acme.delete(f"/v1/sessions/{writer['id']}").status_code == 204
    assert acme.get("/v1/volumes/ds/files/fill").status_code == 200  # it outlived the session
    assert acme.delete("/v1/volumes/ds/files/fill").status_code == 204
    readers = [
        _session(acme, volumes=[{"name": "ds", "path": "in", "read_only": True}]) for _ in (1, 2)
    ]
    reply = run(acme, readers[0]["id"], "open('in/in/data.csv', 'a').write('3,4')")
    assert reply["status"] == "error" and "Read-only file system" in reply["error"]["evalue"]
    flags = text_of(run(acme, readers[1]["id"], "PATH = 'in'" + MOUNT_INFO)).split(",")
    assert {"ro", "nosuid", "nodev"} <= set(flags), flags
    for s in (*readers, canary):
        (acme if s in readers else zeta).delete(f"/v1/sessions/{s['id']}")
    assert acme.delete("/v1/volumes/ds").status_code == 204
    assert acme.get("/v1/volumes/ds").status_code == 404


def test_a_paused_session_holds_its_volume_and_a_fork_mounts_it_read_only(tenants):
    _gw, clients = tenants
    acme = clients["acme"]
    assert acme.post("/v1/volumes", json={"name": "kept", "size": "16m"}).status_code == 201
    source = _session(acme, volumes=[{"name": "kept", "path": "v"}])["id"]
    run(acme, source, "open('v/a.txt', 'w').write('hello'); x = 1")
    snap = acme.post(f"/v1/sessions/{source}/snapshots", json={}).json()
    assert snap["volumes"] == [{"name": "kept", "path": "v", "read_only": False}]
    r = acme.post("/v1/sessions", json={"from_snapshot": snap["id"]})
    assert r.status_code == 409 and source in r.text, r.text  # the writer holds it
    bare = _session(acme, from_snapshot=snap["id"], volumes=[])["id"]
    reply = run(acme, bare, "import os; print(x, os.path.exists('v/a.txt'))")
    assert text_of(reply) == "1 False\n"  # a snapshot holds no volume's files

    r = acme.post(f"/v1/sessions/{source}/pause", json={"strategy": "namespace"})
    assert r.status_code == 200, r.text
    r = acme.post("/v1/sessions", json={"volumes": [{"name": "kept", "path": "w"}]})
    assert r.status_code == 409 and source in r.text  # a paused session keeps its mount
    assert acme.post(f"/v1/sessions/{source}/resume").status_code == 200
    assert text_of(run(acme, source, "print(open('v/a.txt').read(), x)")) == "hello 1\n"

    assert acme.delete(f"/v1/sessions/{source}").status_code == 204
    fork = _session(acme, from_snapshot=snap["id"])
    assert fork["volumes"] == [{"name": "kept", "path": "v", "read_only": True}]
    reply = run(acme, fork["id"], "print(open('v/a.txt').read(), x); open('v/b', 'w')")
    assert text_of(reply) == "hello 1\n" and "Read-only file system" in reply["error"]["evalue"]
    for sid in (bare, fork["id"]):
        acme.delete(f"/v1/sessions/{sid}")
    acme.delete(f"/v1/snapshots/{snap['id']}")
    assert acme.delete("/v1/volumes/kept").status_code == 204


def test_volumes_outlive_a_gateway_restart_and_a_host_reboot_unmounting_them(start_gateway):
    gw = start_gateway()
    data_dir = gw.data_dir
    assert gw.client.post("/v1/volumes", json={"name": "ds", "size": "16m"}).status_code == 201
    assert gw.client.put("/v1/volumes/ds/files/a.txt", content=b"kept").status_code == 201
    where = data_dir / "volumes" / gw.client.get("/v1/volumes/ds").json()["id"]
    gw.stop()
    subprocess.run(["umount", str(where / "workspace")], check=True)  # as a reboot would
    gw = start_gateway(data_dir=data_dir)
    assert gw.client.get("/v1/volumes/ds/files/a.txt").content == b"kept"
    sid = gw.client.post("/v1/sessions", json={"volumes": [{"name": "ds", "path": "d"}]})
    assert sid.status_code == 201, sid.text
    assert text_of(run(gw.client, sid.json()["id"], "print(open('d/a.txt').read())")) == "kept\n"
    gw.client.delete(f"/v1/sessions/{sid.json()['id']}")
    assert gw.client.delete("/v1/volumes/ds").status_code == 204
    assert not where.exists()


def test_two_gateways_on_one_host_and_store_share_a_tenants_volumes(start_gateway, postgres):
    """Either reaches what the other made: files without a session, mounts, and the rule of
    one writer alone or many readers, decided across them; a delete waits for both."""
    url = postgres.database()
    a, b = (start_gateway("--database-url", url) for _ in range(2))
    assert a.client.post("/v1/volumes", json={"name": "shared", "size": "16m"}).status_code == 201
    assert a.client.put("/v1/volumes/shared/files/in.txt", content=b"from a").status_code == 201
    assert b.client.get("/v1/volumes/shared/files/in.txt").content == b"from a"
    assert b.client.put("/v1/volumes/shared/files/out.txt", content=b"from b").status_code == 201

    writer = _session(a.client, volumes=[{"name": "shared", "path": "data"}])["id"]
    assert text_of(run(a.client, writer, "print(open('data/out.txt').read())")) == "from b\n"
    for read_only in (False, True):  # a writer mounts it alone, wherever the next one asks
        mount = {"name": "shared", "path": "data", "read_only": read_only}
        r = b.client.post("/v1/sessions", json={"volumes": [mount]})
        assert r.status_code == 409 and writer in r.text, r.text
    assert a.client.delete(f"/v1/sessions/{writer}").status_code == 204

    reader = _session(b.client, volumes=[{"name": "shared", "path": "data", "read_only": True}])
    assert text_of(run(b.client, reader["id"], "print(open('data/in.txt').read())")) == "from a\n"
    r = a.client.delete("/v1/volumes/shared")
    assert r.status_code == 409 and reader["id"] in r.text, r.text
    assert b.client.delete(f"/v1/sessions/{reader['id']}").status_code == 204
    assert a.client.delete("/v1/volumes/shared").status_code == 204
    assert b.client.get("/v1/volumes/shared").status_code == 404


def test_the_stock_e2b_sdk_creates_lists_mounts_and_destroys_volumes(tenants, monkeypatch):
    from e2b import Volume
    from e2b_code_interpreter import Sandbox

    gw, clients = tenants
    for name, value in e2b_env(gw, TOKENS["acme"]).items():
        monkeypatch.setenv(name, value)
    volume = Volume.create("e2b-data")
    assert volume.name == "e2b-data" and volume.volume_id
    assert "e2b-data" in [v.name for v in Volume.list()]
    assert Volume.get_info(volume.volume_id).name == "e2b-data"
    assert (
        clients["acme"].put("/v1/volumes/e2b-data/files/in.txt", content=b"v1").status_code == 201
    )
    sandbox = Sandbox.create(volume_mounts={"/home/user/data": volume})
    try:
        code = "print(open('data/in.txt').read()); open('data/out.txt', 'w').write('e2b')"
        assert sandbox.run_code(code).logs.stdout == ["v1\n"]
        with pytest.raises(Exception, match=sandbox.sandbox_id):  # a second writer
            Sandbox.create(volume_mounts={"/home/user/again": "e2b-data"})
        with pytest.raises(Exception, match="mounted by"):
            Volume.destroy(volume.volume_id)
        with pytest.raises(Exception, match="/home/user"):
            Sandbox.create(volume_mounts={"/etc": "e2b-data"})
    finally:
        sandbox.kill()
    assert clients["acme"].get("/v1/volumes/e2b-data/files/out.txt").content == b"e2b"
    assert Volume.destroy(volume.volume_id) is True
    assert Volume.destroy(volume.volume_id) is False


def test_the_stock_e2b_sdks_volume_file_methods_with_the_volumes_own_token(tenants, monkeypatch):
    """The content API (``/volumecontent/{id}/...``) under the per-volume token of create."""
    from e2b import AsyncVolume, Volume
    from e2b.exceptions import NotFoundException

    gw, clients = tenants
    for name, value in e2b_env(gw, TOKENS["acme"]).items():
        monkeypatch.setenv(name, value)
    volume, other = Volume.create("e2b-content"), Volume.create("e2b-other")
    assert volume.token and volume.token != other.token
    assert TOKENS["acme"] not in volume.token
    try:
        assert volume.make_dir("/in/deep", force=True).type.value == "directory"
        stat = volume.write_file("/in/deep/a.txt", "hello")
        assert (stat.path, stat.size, stat.type.value) == ("/in/deep/a.txt", 5, "file")
        assert volume.read_file("/in/deep/a.txt") == "hello"
        assert volume.read_file("/in/deep/a.txt", format="bytes") == b"hello"
        assert [e.path for e in volume.list("/in", depth=2)] == ["/in/deep", "/in/deep/a.txt"]
        assert volume.exists("/in/deep/a.txt") and not volume.exists("/nope")
        assert volume.get_info("/in/deep").type.value == "directory"
        assert clients["acme"].get("/v1/volumes/e2b-content/files/in/deep/a.txt").text == "hello"
        with pytest.raises(NotFoundException):
            volume.read_file("/missing.txt")
        with pytest.raises(NotFoundException):
            volume.make_dir("/no/parent")  # without force, its parent must be there
        assert volume.update_metadata("/in/deep/a.txt", mode=0o644).mode == 0o644
        with pytest.raises(Exception, match="sandbox user"):
            volume.update_metadata("/in/deep/a.txt", uid=0, mode=0o4755)
        with pytest.raises(Exception, match=r"\.\."):
            volume.write_file("/../escape.txt", "x")  # the workspace path rules
        with pytest.raises(Exception, match="do not fit"):  # past the volume's cap
            volume.write_file("/big.bin", b"x" * 33 * 2**20)
        assert not volume.exists("/big.bin")
        # The tenant's own API key works too, when the SDK is given it.
        assert Volume(volume.volume_id, volume.name, token=TOKENS["acme"]).exists("/in")
        as_zeta = Volume(volume.volume_id, volume.name, token=TOKENS["zeta"])
        with pytest.raises(NotFoundException):  # another tenant's key: as if there were none
            as_zeta.write_file("/z.txt", "z")

        async def from_async_sdk() -> str:
            connected = await AsyncVolume.connect(volume.volume_id)
            await connected.write_file("/async.txt", "async")
            return await connected.read_file("/async.txt")

        assert asyncio.run(from_async_sdk()) == "async"
        # One volume's token opens that volume only.
        stolen = Volume(other.volume_id, other.name, token=volume.token)
        with pytest.raises(Exception, match="not this volume"):
            stolen.list("/")
        as_volume = {"Authorization": f"Bearer {volume.token}", "X-API-Key": volume.token}
        for path in (
            "/v1/volumes",
            "/v1/volumes/e2b-content/files",
            f"/volumes/{volume.volume_id}",
        ):
            assert clients["acme"].get(path, headers=as_volume).status_code == 401, path
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # 10 GiB, unread
            sock.sendall(
                f"PUT /volumecontent/{other.volume_id}/file?path=x HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {volume.token}\r\nContent-Length: {10 * 2**30}\r\n\r\n"
                .encode()
            )  # fmt: skip
            assert sock.recv(4096).startswith(b"HTTP/1.1 401")
        # A volume named as this one's id is another volume: the token still opens this one.
        r = clients["acme"].post("/v1/volumes", json={"name": volume.volume_id, "size": "16m"})
        assert r.status_code == 201, r.text
        volume.write_file("/mine.txt", "id")
        assert (
            clients["acme"].get(f"/v1/volumes/{volume.volume_id}/files/mine.txt").status_code == 404
        )
        assert clients["acme"].delete(f"/v1/volumes/{volume.volume_id}").status_code == 204
        volume.remove("/in")
        assert not volume.exists("/in/deep/a.txt")
        secret = volume.token.rpartition(".")[2]
        assert not [line for line in gw.log if secret in line]  # never logged, at debug level
    finally:
        Volume.destroy(volume.volume_id)
        Volume.destroy(other.volume_id)


def test_sbx_volumes_and_a_session_mounting_one_read_only(tenants, tmp_path):
    gw, clients = tenants
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env.update(SBX_URL=gw.url, SBX_TOKEN=TOKENS["acme"])

    def sbx(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", *args],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    (tmp_path / "in.csv").write_text("a,b\n")
    assert sbx("volumes", "create", "cli-data", "--size", "16m").strip() == "cli-data"
    sbx("volumes", "put", "cli-data", "in.csv", "sub/in.csv")
    assert "cli-data" in sbx("volumes", "ls")
    assert "sub/in.csv" in sbx("volumes", "files", "cli-data", "sub")
    assert sbx("volumes", "get", "cli-data", "sub/in.csv", "-") == "a,b\n"
    view = json.loads(sbx("sessions", "new", "--volume", "cli-data:d:ro", "--json"))
    assert view["volumes"] == [{"name": "cli-data", "path": "d", "read_only": True}]
    assert view["id"] in sbx("volumes", "show", "cli-data")
    sbx("sessions", "rm", view["id"])
    sbx("volumes", "rm", "cli-data")
    assert clients["acme"].get("/v1/volumes/cli-data").status_code == 404


def test_an_mcp_agent_makes_a_volume_and_mounts_it(tenants):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    gw, clients = tenants
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    params = StdioServerParameters(
        command=str(Path(sys.executable).with_name("sbx")),
        args=["mcp", "--url", gw.url, "--token", TOKENS["acme"]],
        env=env,
    )

    async def scenario() -> list:
        async with Client(params) as client:
            made = await client.call_tool(
                "create_volume", {"name": "mcp-data", "size": "16m", "files": {"a.txt": "hi"}}
            )
            session = await client.call_tool(
                "create_session",
                {"volumes": [{"name": "mcp-data", "path": "v", "read_only": True}]},
            )
            sid = session.structured_content["session_id"]
            ran = await client.call_tool(
                "run_code", {"session_id": sid, "code": "print(open('v/a.txt').read())"}
            )
            listed = await client.call_tool("list_volumes", {})
            await client.call_tool("delete_session", {"session_id": sid})
            gone = await client.call_tool("delete_volume", {"name": "mcp-data"})
            return [made, session, ran, listed, gone]

    made, session, ran, listed, gone = asyncio.run(scenario())
    assert not made.is_error and made.structured_content["name"] == "mcp-data"
    assert not session.is_error
    assert ran.content[0].text == "[stdout]\nhi\n"
    assert [v["name"] for v in listed.structured_content["volumes"]] == ["mcp-data"]
    assert not gone.is_error
    assert clients["acme"].get("/v1/volumes/mcp-data").status_code == 404
