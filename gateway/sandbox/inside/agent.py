"""The sandbox agent: runs inside a cluster kernel's container, next to the kernel.

A gateway on another host can neither signal a container there nor read its
files, so each cluster sandbox runs this small process as its main program
(under the container's init). It starts, signals and restarts the kernel
process, tells the gateway when and why the kernel died (the cgroup's OOM
count says whether it was out of memory), and serves the workspace with the
gateway's own ``Workspace`` class, so the same path rules apply as on one host.

It answers on one more port of the kernel overlay, behind CurveZMQ with the
kernel's keys, and checks the session's HMAC signature on every request.
Only the gateway gets through: the agent and the kernel listen on Unix
sockets inside the sandbox, and the agent's doorman forwards the overlay's
TCP ports to them for connections from the gateway's addresses (the name
the secret gives; a restarted gateway has a new one) and resets any other.
The kernel's death does not end the container: a dead session's files stay
readable, and a restart is a new kernel process in the same container.
Only the standard library, pyzmq (every ipykernel image has it) and
``gateway.workspace.rules`` (with the ``errors`` and ``timestamps`` modules
it imports), shipped beside this file as Swarm configs.

Run as ``python agent.py SECRET_FILE`` (the session's Swarm secret, JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import os
import signal
import socket
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from gateway.errors import GatewayError
from gateway.workspace.rules import CHUNK, Workspace

WORKSPACE = "/workspace"
RESOLVE_EVERY = 1.0  # seconds between lookups of the gateway's addresses
PACKAGES_FILE = "/opt/sbx/packages.txt"
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")


def sign(key: bytes, frames: list[bytes]) -> bytes:
    """The HMAC of a request's frames, as the gateway computes it."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for frame in frames:
        mac.update(frame)
    return mac.hexdigest().encode()


def oom_kills() -> int:
    """Processes the kernel's OOM killer took in this container's cgroup, so far."""
    for path in OOM_FILES:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    return 0


class KernelProcess:
    """The kernel: started, signalled, restarted; each start is a new generation."""

    def __init__(self, connection: dict[str, Any], cwd: str, sockets: str) -> None:
        # Unix sockets only the doorman (and the sandbox itself) can reach.
        self.connection = {**connection, "transport": "ipc", "ip": f"{sockets}/k"}
        self.cwd = cwd
        self.sockets = sockets
        self.proc: asyncio.subprocess.Process | None = None
        self.generation = 0
        self.exits: dict[int, dict[str, Any]] = {}
        self._oom_before = 0
        self._reaper: asyncio.Task | None = None

    async def start(self, argv: list[str], env: dict[str, str]) -> int:
        await self.stop()
        path = f"{self.sockets}/kernel.json"  # the kernel rewrites it: in the writable /tmp
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.connection, f)
        argv = [arg.replace("{connection_file}", path) for arg in argv]
        self._oom_before = oom_kills()
        self.generation += 1
        self.proc = await asyncio.create_subprocess_exec(
            *argv, env={**os.environ, **env}, cwd=self.cwd
        )
        self._reaper = asyncio.create_task(self._reap(self.proc, self.generation))
        return self.generation

    async def _reap(self, proc: asyncio.subprocess.Process, generation: int) -> None:
        code = await proc.wait()
        exit_code = 128 - code if code < 0 else code  # a signal as the shell reports it
        self.exits[generation] = {
            "generation": generation,
            "exit_code": exit_code,
            "oom": oom_kills() > self._oom_before,
        }

    async def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            await asyncio.sleep(0)  # let the reaper record it

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    async def wait(self, generation: int) -> dict[str, Any]:
        """The exit of ``generation``, once it has exited."""
        while generation not in self.exits:  # noqa: ASYNC110 (a reaper task sets it)
            await asyncio.sleep(0.05)
        return self.exits[generation]

    def status(self) -> dict[str, Any]:
        running = self.proc is not None and self.proc.returncode is None
        return {"generation": self.generation, "running": running}


class Agent:
    """Answers the gateway's requests; file work runs in threads, so an interrupt never waits."""

    def __init__(self, secret: dict[str, Any]) -> None:
        connection = secret["connection"]
        self.key = connection["key"].encode()
        self.root = secret.get("workspace", WORKSPACE)  # tests run it on a directory here
        self.sockets = tempfile.mkdtemp(prefix=".sbx-")
        self.kernel = KernelProcess(connection, self.root, self.sockets)
        self.doorman = Doorman(secret["gateway"])
        ports = [secret["agent_port"], *(connection[f"{c}_port"] for c in CHANNELS)]
        self.routes = {port: f"{self.sockets}/k-{port}" for port in ports}
        self.workspace = Workspace(self.root, os.getuid(), os.getgid())
        self.disk = int(secret.get("disk", 0))
        self.streams: dict[str, Any] = {}
        self.uploads: dict[str, Any] = {}
        self._ids = (str(i) for i in itertools.count(1))
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.curve_secretkey = connection["curve_secretkey"].encode()
        self.socket.curve_publickey = connection["curve_publickey"].encode()
        self.socket.curve_server = True
        self.socket.bind(f"ipc://{self.routes[secret['agent_port']]}")
        self._tasks: set[asyncio.Task] = set()

    async def serve(self) -> None:
        await self.doorman.open(self.routes)
        while True:
            frames = await self.socket.recv_multipart()
            if len(frames) < 3:
                continue
            identity, signature, *message = frames
            if not hmac.compare_digest(signature, sign(self.key, message)):
                continue  # not from the gateway: no answer at all
            task = asyncio.create_task(self._answer(identity, message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, identity: bytes, message: list[bytes]) -> None:
        request = json.loads(message[0])
        data = message[1] if len(message) > 1 else b""
        reply: dict[str, Any] = {"id": request.get("id")}
        payload = b""
        try:
            result = await self.handle(request["op"], request.get("args", {}), data)
            if isinstance(result, tuple):
                result, payload = result
            reply["result"] = result
        except GatewayError as e:
            reply["error"] = {"type": type(e).__name__, "message": e.message}
        except OSError as e:
            reply["error"] = {"type": "OSError", "message": f"{e.strerror or e}"}
        except Exception as e:
            reply["error"] = {"type": "Error", "message": f"{type(e).__name__}: {e}"}
        await self.socket.send_multipart([identity, json.dumps(reply).encode(), payload])

    async def handle(self, op: str, args: dict[str, Any], data: bytes) -> Any:
        kernel, ws = self.kernel, self.workspace
        if op == "start":
            return {"generation": await kernel.start(args["argv"], args.get("env", {}))}
        if op == "stop":
            await kernel.stop()
            return kernel.status()
        if op == "signal":
            kernel.signal(int(args["signum"]))
            return None
        if op == "status":
            return kernel.status()
        if op == "wait":
            return await kernel.wait(int(args["generation"]))
        if op == "facts":
            return await asyncio.to_thread(_packages)
        if op == "fs.list":
            return await asyncio.to_thread(ws.list, args["path"])
        if op == "fs.remove":
            return await asyncio.to_thread(ws.remove, args["path"])
        if op == "fs.tree":
            return await asyncio.to_thread(ws.tree, args["path"], int(args["depth"]))
        if op == "fs.stat":
            return await asyncio.to_thread(ws.stat, args["path"])
        if op == "fs.make_dir":
            return await asyncio.to_thread(ws.make_dir, args["path"])
        if op == "fs.move":
            return await asyncio.to_thread(ws.move, args["source"], args["destination"])
        if op == "fs.free":
            return await asyncio.to_thread(self._free_bytes)
        if op == "fs.walk":
            walk = await asyncio.to_thread(ws.walk, args["parts"])
            entries = [[rel, st.st_size, st.st_mtime_ns, st.st_mode] for rel, st in walk.entries]
            return {"entries": entries, "truncated": walk.truncated}
        return await self._streams(op, args, data)

    async def _streams(self, op: str, args: dict[str, Any], data: bytes) -> Any:
        """Downloads, archives and uploads, each a stream the gateway pulls or pushes by id."""
        ws = self.workspace
        if op == "fs.read_open":
            file, st = await asyncio.to_thread(ws.open_read, args["path"])
            return {"stream": self._keep(self.streams, file), "size": st.st_size,
                    "mtime": st.st_mtime, "mode": st.st_mode}  # fmt: skip
        if op == "fs.archive_open":  # made as the gateway pulls it, which refuses it if too big
            archive = await asyncio.to_thread(ws.archive, args["path"], args["fmt"])
            return {"stream": self._keep(self.streams, archive), "size": archive.size,
                    "files": archive.files}  # fmt: skip
        if op == "fs.pull":
            stream = self.streams[args["stream"]]
            chunk = await asyncio.to_thread(stream.read, CHUNK)
            if not chunk:
                self.streams.pop(args["stream"]).close()
            return None, chunk
        if op == "fs.close":  # a download or upload the gateway gave up on
            if (stream := self.streams.pop(args["stream"], None)) is not None:
                await asyncio.to_thread(stream.close)
            if (upload := self.uploads.pop(args["stream"], None)) is not None:
                await asyncio.to_thread(upload.finish, False)
            return None
        if op == "fs.write_open":
            upload = await asyncio.to_thread(ws.open_write, args["path"])
            return {"upload": self._keep(self.uploads, upload)}
        if op == "fs.write":
            await asyncio.to_thread(self.uploads[args["upload"]].write, data)
            return None
        if op == "fs.write_finish":
            upload = self.uploads.pop(args["upload"])
            await asyncio.to_thread(upload.finish, bool(args["ok"]))
            return {"size": upload.size}
        raise GatewayError(f"unknown request {op!r}")

    def _keep(self, table: dict[str, Any], value: Any) -> str:
        key = next(self._ids)
        table[key] = value
        return key

    def _free_bytes(self) -> int:
        """Free space, within the session's disk limit when one is set."""
        free = self.workspace.free_bytes()
        if not self.disk:
            return free
        used = self.workspace.usage()
        return max(0, min(free, self.disk - used))


CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
_LINGER_RESET = struct.pack("ii", 1, 0)  # close with a reset: a stranger gets no bytes at all


class Doorman:
    """The overlay's TCP ports, forwarded to the Unix sockets for the gateway's addresses only.

    A Swarm overlay filters nothing between its containers, and an unprivileged
    socket filter is refused on some kernels, so a stranger's connection is
    accepted by the network stack, then reset before a byte is read or sent.
    """

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway  # a name (tasks.<gateway service>) or an address
        self.admitted: set[str] = set()
        self._resolved_at = -RESOLVE_EVERY
        self._tasks: set[asyncio.Task] = set()

    async def open(self, routes: dict[int, str]) -> None:
        """Listen on every port of ``routes``."""
        await self._resolve()
        for port, path in routes.items():
            await asyncio.start_server(
                lambda r, w, p=path: self._forward(r, w, p), "0.0.0.0", port, reuse_address=True
            )

    async def _resolve(self) -> None:
        """Look the gateway's addresses up again, at most once a second: a restarted gateway's
        task has a new one, and a stranger's connects must not turn into a flood of lookups."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._resolved_at < RESOLVE_EVERY:
            return
        self._resolved_at = loop.time()
        with contextlib.suppress(OSError):  # keep the last answer: the resolver may blip
            found = await loop.getaddrinfo(
                self.gateway, None, family=socket.AF_INET, type=socket.SOCK_STREAM
            )
            self.admitted = {info[4][0] for info in found}

    async def _forward(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
    ) -> None:
        peer = writer.get_extra_info("peername")[0]
        if peer not in self.admitted:
            await self._resolve()
        if peer not in self.admitted:
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET
            )
            writer.close()
            return
        try:
            inner_reader, inner_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()  # nothing listens yet (the kernel is starting): the client retries
            return
        self._keep(_pipe(reader, inner_writer))
        self._keep(_pipe(inner_reader, writer))

    def _keep(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction of a connection until it ends; then end the other side's writes."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


def _packages() -> list[str]:
    try:
        return Path(PACKAGES_FILE).read_text().split()
    except OSError:
        return []


async def main(secret: dict[str, Any]) -> None:
    agent = Agent(secret)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    server = asyncio.create_task(agent.serve())
    await stopping.wait()
    server.cancel()
    await agent.kernel.stop()


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
