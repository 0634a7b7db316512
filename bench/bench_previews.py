"""Preview URLs: a server in a sandbox through the gateway's relay, against a direct connection.

The same Tornado app (a small answer, a large streamed one, a WebSocket echo)
runs twice: in a session's kernel, reached through the gateway (path form and
host form: the viewer's connection, the gateway, its Unix socket, the
forwarder's threads in the sandbox, the app on the sandbox's loopback), and as
a process on this machine's loopback, reached directly. Times a small GET on
a kept-alive client (the relay opens a connection into the sandbox for each
request), the rate of a 256 MiB download, and a WebSocket message's round
trip. Writes the table into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import httpx
import websockets.sync.client
from harness import Gateway, median, pct, timed, write_section

N = 300
BIG_MIB = 256
APP = """
import asyncio, tornado.web, tornado.websocket
CHUNK = b"x" * 65536
class Small(tornado.web.RequestHandler):
    def get(self):
        self.write("ok")
class Big(tornado.web.RequestHandler):
    async def get(self):
        for _ in range(int(self.get_argument("mib")) * 16):
            self.write(CHUNK)
            await self.flush()
class Echo(tornado.websocket.WebSocketHandler):
    def on_message(self, message):
        self.write_message(message)
async def _serve_bench_app(port):
    tornado.web.Application([("/small", Small), ("/big", Big), ("/ws", Echo)]).listen(
        port, "127.0.0.1")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(base: str, headers: dict[str, str], connect: Callable[[], object]) -> list[str]:
    """Cells of one row: small GET median and p95, download MiB/s, WebSocket round trip."""
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        small = timed(lambda: client.get("/small").raise_for_status(), N)
        t0 = time.perf_counter()
        with client.stream("GET", "/big", params={"mib": BIG_MIB}) as r:
            size = sum(len(chunk) for chunk in r.iter_raw(1 << 20))
        rate = size / 2**20 / (time.perf_counter() - t0)
    with connect() as ws:  # type: ignore[attr-defined]
        trips = timed(lambda: (ws.send("x" * 100), ws.recv(timeout=30)), N)
    return [f"{median(small):.2f} ms", f"{pct(small, 0.95):.2f} ms", f"{rate:.0f} MiB/s",
            f"{median(trips):.2f} ms"]  # fmt: skip


def main() -> None:
    port = free_port()
    run = f"loop = asyncio.new_event_loop()\nloop.run_until_complete(_serve_bench_app({port}))\n"
    direct = subprocess.Popen([sys.executable, "-c", APP + run + "loop.run_forever()\n"])
    for _ in range(100):  # until it listens
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    with (
        tempfile.TemporaryDirectory(prefix="sbx-") as data_dir,
        Gateway(data_dir, "--pool", "", "--preview-max-bytes", "64g") as gw,
    ):
        sid = gw.client.post("/v1/sessions", json={}).json()["id"]
        code = APP + "asyncio.get_event_loop().create_task(_serve_bench_app(8000))\n"
        gw.client.post(f"/v1/sessions/{sid}/execute", json={"code": code}).raise_for_status()
        gw_port = int(gw.url.rsplit(":", 1)[1])
        path = f"{gw.url}/v1/sessions/{sid}/ports/8000"
        host = f"8000-{sid}.localhost:{gw_port}"
        rows = {
            "direct (loopback, no gateway)": measure(
                f"http://127.0.0.1:{port}", {},
                lambda: websockets.sync.client.connect(f"ws://127.0.0.1:{port}/ws"),
            ),
            "preview, path form": measure(
                path, {},
                lambda: websockets.sync.client.connect(path.replace("http", "ws", 1) + "/ws"),
            ),
            "preview, host form": measure(
                gw.url, {"Host": host},
                lambda: websockets.sync.client.connect(
                    f"ws://{host}/ws", sock=socket.create_connection(("127.0.0.1", gw_port))
                ),
            ),
        }  # fmt: skip
        gw.client.delete(f"/v1/sessions/{sid}")
    direct.terminate()
    body = [
        "| way | small GET, median | p95 | 256 MiB download | WebSocket round trip |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {way} | " + " | ".join(cells) + " |" for way, cells in rows.items()),
    ]
    print("\n".join(body))
    write_section(
        "bench_previews",
        "Preview URLs: the relay against a direct connection",
        f"the same Tornado app in a session's sandbox (through the gateway, its Unix socket "
        f"and the forwarder in the sandbox) and on this machine's loopback (direct); {N} small "
        "GETs on a kept-alive client (the relay opens a connection into the sandbox for each "
        f"request), one {BIG_MIB} MiB streamed download, {N} 100-byte WebSocket echoes.",
        body,
    )


if __name__ == "__main__":
    main()
