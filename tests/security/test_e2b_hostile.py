"""Hostile input at the E2B edge gets a clear error, and a canary session keeps answering."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from connectrpc.codec import proto_binary_codec
from e2b.envd.process import process_pb as proc
from e2b_code_interpreter import Sandbox
from helpers import Canary, GatewayProcess, canary_session
from protobuf import Oneof

pytestmark = pytest.mark.docker

PROTO = {"Content-Type": "application/proto"}
STREAM = {"Content-Type": "application/connect+proto"}


@pytest.fixture
def envd(gateway: GatewayProcess, e2b_sandbox: Sandbox):
    headers = {
        "E2b-Sandbox-Id": e2b_sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": e2b_sandbox._envd_access_token,
    }
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture
def watched(gateway: GatewayProcess):
    with canary_session(gateway) as sid, Canary(gateway, sid) as watch:
        yield watch


def said(r: httpx.Response) -> str:
    """The message of an E2B error body, or of a Connect end-of-stream / unary error."""
    body = r.content
    if r.headers.get("content-type", "").startswith("application/connect+"):
        body = body[5:]  # the end-of-stream envelope's header
    doc = json.loads(body)
    return (doc.get("error") or doc)["message"]


def envelope(message: object) -> bytes:
    data = proto_binary_codec().encode(message)
    return b"\x00" + len(data).to_bytes(4, "big") + data


def stdin_piece(data: bytes) -> bytes:
    piece = proc.StreamInputRequest.DataEvent(input=proc.ProcessInput(input=Oneof("stdin", data)))
    return envelope(proc.StreamInputRequest(event=Oneof("data", piece)))


def stdin_start(pid: int) -> bytes:
    selector = proc.ProcessSelector(selector=Oneof("pid", pid))
    start = proc.StreamInputRequest.StartEvent(process=selector)
    return envelope(proc.StreamInputRequest(event=Oneof("start", start)))


INPUT = "/process.Process/StreamInput"
CASES = [
    # (name, path, headers, body, status, words in the message)
    ("input garbage", INPUT, STREAM, b"\x00\x00\x00\x00\x03\xff\xff\xff", 200, "not a valid proto"),
    ("input before start", INPUT, STREAM, stdin_piece(b"x"), 200, "start event"),
    ("input to nobody", INPUT, STREAM, stdin_start(99999) + stdin_piece(b"x"), 200, "no running"),
    ("input type", INPUT, {"Content-Type": "text/plain"}, b"x", 415, "application/proto"),
    ("bad proto", "/filesystem.Filesystem/Stat", PROTO, b"\xff\xff\xff", 400, "not a valid proto"),
    ("bad json", "/filesystem.Filesystem/Stat", {"Content-Type": "application/json"}, b"{bad",
     400, "not a valid json"),
    ("short envelope", "/filesystem.Filesystem/WatchDir", STREAM, b"\x00\x00\x00\x00\x10abc",
     200, "zero messages"),
    ("tiny frames", "/filesystem.Filesystem/WatchDir", STREAM, b"\x00" * 5 * 150_000,
     200, "multiple messages"),
    ("frame flood", "/filesystem.Filesystem/WatchDir", STREAM, b"\x00" * 5 * 300_000,
     413, "limit of 1 MiB"),
    ("wrong type", "/filesystem.Filesystem/Stat", {"Content-Type": "text/plain"}, b"x",
     415, "application/proto"),
    ("grpc", "/filesystem.Filesystem/Stat", {"Content-Type": "application/grpc"}, b"x",
     415, "application/proto"),
    ("unknown method", "/filesystem.Filesystem/Format", PROTO, b"", 404, "no method Format"),
    ("unknown service", "/kernel.Kernel/Panic", PROTO, b"", 404, "no such service"),
    ("bad multipart", "/files?path=x", {"Content-Type": "multipart/form-data; boundary=zz"},
     b"--zz\r\ngarbage", 400, "not valid multipart"),
    ("upload type", "/files?path=x", {"Content-Type": "text/plain"}, b"x", 415, "octet-stream"),
    ("bad execute", "/execute", {"E2b-Sandbox-Port": "49999"}, b"{bad", 400, "not valid JSON"),
    ("code too big", "/execute", {"E2b-Sandbox-Port": "49999"},
     json.dumps({"code": "x" * (3 * 2**20)}).encode(), 413, "limit"),
    ("unknown route", "/teleport", {}, b"", 404, "no such endpoint"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_requests_get_clear_errors(envd: httpx.Client, watched: Canary, case) -> None:
    _, path, headers, body, status, words = case
    r = envd.post(path, content=body, headers=headers)
    assert r.status_code == status, r.text
    assert words.lower() in said(r).lower(), r.text


def test_hostile_control_api_bodies(gateway: GatewayProcess, watched: Canary) -> None:
    with httpx.Client(base_url=gateway.url, headers={"X-API-Key": gateway.token}) as api:
        for body, words in [
            (b"[1]", "JSON object"),
            (b'{"templateID": 5}', "templateID"),
            (b'{"templateID": "base", "timeout": "soon"}', "timeout"),
            (b'{"templateID": "base", "envVars": {"A": 1}}', "env"),
            (b'{"templateID": "base", "autoPause": "yes"}', "autoPause"),
            (b'{"templateID": "base", "mcp": {"x": {}}}', "mcp.x: E2B's catalogue servers"),
            (b'{"templateID": "no-such-template"}', "no kernel"),
        ]:
            r = api.post("/v2/sandboxes", content=body)
            assert 400 <= r.status_code < 502 and words in r.json()["message"], r.text
        assert api.get("/v2/sandboxes?limit=lots").status_code == 400
        assert api.get("/snapshots?limit=0").status_code == 400
        assert api.delete("/templates/no-such-snapshot").status_code == 404
        assert api.get("/sandboxes/nope").status_code == 404


def test_a_body_from_an_unknown_caller_is_refused_unread(gateway: GatewayProcess) -> None:
    """Neither an API key nor a sandbox token: the edge answers before reading the body."""
    headers = {"E2b-Sandbox-Id": "x", "E2b-Sandbox-Port": "49983", "X-Access-Token": "guess"}
    r = httpx.post(f"{gateway.url}/files?path=x", content=os.urandom(2 * 2**20), headers={
        **headers, "Content-Type": "application/octet-stream"})  # fmt: skip
    assert r.status_code == 401


def test_a_flood_of_tiny_input_frames(
    envd: httpx.Client, e2b_sandbox: Sandbox, watched: Canary
) -> None:
    """A stdin stream has no overall size cap; 4 MiB of empty frames cost time, not memory."""
    reader = e2b_sandbox.commands.run("wc -c", background=True, stdin=True)
    body = stdin_start(reader.pid) + b"\x00" * 5 * 800_000 + stdin_piece(b"12345")
    r = envd.post(INPUT, content=body, headers=STREAM)
    assert r.status_code == 200 and r.content.endswith(b"{}"), r.content[-200:]
    e2b_sandbox.commands.close_stdin(reader.pid)
    assert reader.wait().stdout.strip() == "5"
