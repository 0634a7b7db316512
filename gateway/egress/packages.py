"""Package installs through a cache: devpi-server beside the gateway, reached from no network.

``PackageCache`` runs devpi-server as a process of its own, with one mirror
index of the index pip is configured with on this host (pip's own
configuration and environment, else pip's default), so a package is fetched
from upstream once and served from the cache to every session after.

A sandbox keeps ``--network none``: the gateway serves each session a Unix
socket in its run directory (``/run/sbx/pkg.sock`` inside), and a small relay
thread in the Python kernel listens on the sandbox's own loopback for pip
(``PIP_INDEX_URL``). ``PackageGate`` answers on those sockets: it applies the
session's tenant's allow and deny lists (names, or ``name==version``), refuses
a package file with a 403 whose reason pip prints (project pages pass, so
pip names the version it was refused), forwards the rest to the cache, and
reports every package file served (name, version, size, SHA-256, whether the
cache had it) as an ``Install``. It reads each request strictly
(``package_requests``) and bounds each session's connections, so one sandbox
cannot tie up the cache every session shares.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import secrets
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx

from ..nofollow import SessionSockets
from .package_requests import MAX_HEAD, Refused, Request, encode, parse

log = logging.getLogger(__name__)
_T = TypeVar("_T")

INDEX = "root/sbx"  # the cache's mirror index
RELAY_PORT = 3141  # where pip finds the index on a sandbox's own loopback
SOCKET_NAME = "pkg.sock"  # in the session's run directory
CHUNK = 64 * 1024
UPSTREAM_TIMEOUT = 60  # seconds devpi waits on the index it mirrors (its default: 5)

# Set in the kernel's environment: pip asks the relay, and nothing else.
PIP_ENV = {
    "PIP_INDEX_URL": f"http://127.0.0.1:{RELAY_PORT}/{INDEX}/+simple/",
    "PIP_TRUSTED_HOST": f"127.0.0.1:{RELAY_PORT}",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
    "PIP_NO_INPUT": "1",
    "PIP_DEFAULT_TIMEOUT": "120",  # the cache's first fetch of a page waits for upstream
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}

# Run in a Python kernel (silently) once it starts: loopback TCP -> the session's socket.
RELAY = f"""
def _sbx_package_relay():
    import socket, threading
    def pipe(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    def serve(listener):
        while True:
            client, _ = listener.accept()
            upstream = socket.socket(socket.AF_UNIX)
            try:
                upstream.connect("/run/sbx/{SOCKET_NAME}")
            except OSError:
                client.close()
                continue
            for ends in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=ends, daemon=True).start()
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", {RELAY_PORT}))
    except OSError:
        return  # relaying already
    listener.listen(64)
    threading.Thread(target=serve, args=(listener,), daemon=True, name="sbx-packages").start()
_sbx_package_relay()
del _sbx_package_relay
"""

_FILE = re.compile(r"/\w+/\w+/\+f/[0-9a-f]{3}/[0-9a-f]+/(?P<file>[^/?#]+)$")
_SIMPLE = re.compile(r"/\w+/\w+/\+simple/(?P<name>[^/?#]+)/?$")
# name-version[-build]-tags.whl, or name-version.tar.gz / .zip (sdists)
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-.+\.whl$")
_SDIST = re.compile(r"^(?P<name>.+)-(?P<version>[^-]+)\.(tar\.gz|zip|tar\.bz2)$")


def normalize(name: str) -> str:
    """A project name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def configured_index() -> str:
    """The index pip uses on this host: its environment and config files, else its default."""
    from pip._internal.configuration import Configuration, ConfigurationError
    from pip._internal.models.index import PyPI

    config = Configuration(isolated=False)
    config.load()
    for key in (":env:.index-url", "install.index-url", "global.index-url"):
        with contextlib.suppress(ConfigurationError):
            return str(config.get_value(key))
    return PyPI.simple_url


@dataclasses.dataclass(frozen=True)
class PackagePolicy:
    """A tenant's packages: ``allow`` (empty: any) and ``deny`` entries.

    An entry is a name, ``name==version``, or (npm's way) ``name@version``;
    pip and npm packages share the lists.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def refusal(self, name: str, version: str | None = None, npm: bool = False) -> str | None:
        """Why the policy refuses ``name`` (at ``version``), or None.

        ``npm``: names compare lower-cased (npm's rule), not as PEP 503 folds them.
        """
        fold = str.lower if npm else normalize
        project = fold(name)
        pin = f"{project}=={version}" if version else None
        shown = f"{project}@{version}" if npm else pin
        deny = {_entry(e, fold) for e in self.deny}
        if project in deny or pin in deny:
            return f"{shown if pin in deny else project} is on the deny list"
        allow = {_entry(e, fold) for e in self.allow}
        if not allow or project in allow:
            return None
        pinned = {a for a in allow if a.startswith(f"{project}==")}
        if not pinned:
            return f"{project} is not on the allow list"
        if pin is not None and pin not in pinned:
            return f"{project} {version} is not an allowed version"
        return None


def _entry(text: str, fold: Callable[[str], str] = normalize) -> str:
    """``name`` or ``name==version``, folded; ``name@version`` (not a scope's @) as ``==``."""
    text = text.strip()
    name, _, version = text.partition("==")
    if not version and text.rfind("@") > 0:
        name, _, version = text.rpartition("@")
    return fold(name.strip()) + (f"=={version.strip()}" if version else "")


@dataclasses.dataclass(frozen=True)
class Install:
    """One package file a session asked for: served (with its facts) or refused."""

    session_id: str
    name: str
    version: str | None
    filename: str | None
    refused: str | None = None  # the policy's reason
    size: int = 0
    sha256: str | None = None
    cached: bool = False  # the cache had it before: no upstream fetch
    installer: str = "pip"  # or "npm"
    at: float = dataclasses.field(default_factory=time.time)


InstallHook = Callable[[Install], None]


@dataclasses.dataclass(frozen=True)
class Target:
    """Where an accepted request goes in the cache, and the package file it names, if any."""

    path: str  # decoded: what the policy and ``Cache.has`` read
    sent: str  # the same path as the cache is sent it
    name: str | None = None
    version: str | None = None
    filename: str | None = None  # a package file: decided by the policy, reported


class Cache(abc.ABC):
    """A caching package server run beside the gateway, on a loopback port of its own.

    What a ``PackageGate`` serves to sessions: ``PackageCache`` (pip),
    ``NpmCache`` (npm). This base runs, awaits and stops the server's process.
    """

    language: str  # of the kernels it serves
    installer: str
    socket_name: str  # in a session's run directory
    npm: bool  # names compare as npm's (lower-cased), not PEP 503's
    env: dict[str, str]  # the kernel's
    relay: str  # code run in the kernel: its loopback port -> the socket
    program: str  # the server's, in its log's name and errors
    ready_path: str  # answers 200 once the server serves

    def __init__(self, state_dir: Path, start_timeout: float) -> None:
        self.state_dir = state_dir
        self.start_timeout = start_timeout
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / f"{self.program}.log"

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the server (installed and configured first, if need be) and wait until ready."""

    @abc.abstractmethod
    def has(self, url_path: str) -> bool:
        """Whether the cache holds the package file ``url_path`` names (no upstream fetch)."""

    @abc.abstractmethod
    def target(self, segments: tuple[str, ...]) -> Target:
        """What a decoded path asks for; ``Refused`` unless its installer asks such paths."""

    async def _launch(self, *argv: str, env: dict[str, str] | None = None) -> None:
        """Run the server (``argv`` listens on ``self.port``), its output in its log."""
        log_file = await asyncio.to_thread(open, self.log_path, "ab")
        with log_file:  # the process keeps its own descriptor
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdout=log_file, stderr=asyncio.subprocess.STDOUT, env=env
            )

    async def _wait_ready(self, client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.returncode is not None:
                raise RuntimeError(f"{self.program} exited; see {self.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(self.ready_path)).status_code == 200:
                    return
            await asyncio.sleep(0.3)
        raise RuntimeError(f"{self.program} did not answer within {self.start_timeout:g} s")

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                async with asyncio.timeout(20):
                    await self._proc.wait()
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()


class PackageCache(Cache):
    """devpi-server, run and configured by the gateway; a mirror of pip's configured index."""

    language = "python"
    installer = "pip"
    socket_name = SOCKET_NAME
    npm = False
    env = PIP_ENV
    relay = RELAY
    program = "devpi-server"
    ready_path = "/+api"

    def __init__(self, state_dir: Path, start_timeout: float = 180.0) -> None:
        super().__init__(state_dir, start_timeout)
        self.server_dir = state_dir / "server"

    @property
    def simple_url(self) -> str:
        """The mirror index's pip address, on the host (template builds fetch wheels there)."""
        return f"{self.url}/{INDEX}/+simple/"

    def file_path(self, url_path: str) -> Path:
        """Where the cache keeps the file a ``+f`` URL names, once it has it."""
        return self.server_dir / "+files" / url_path.lstrip("/")

    def has(self, url_path: str) -> bool:
        return self.file_path(url_path).exists()

    def target(self, segments: tuple[str, ...]) -> Target:
        """Project pages and files of the mirror index only (devpi's others are not pip's)."""
        path = "/" + "/".join(segments)
        name, version, filename = project_of(path)
        if tuple(segments[:2]) != tuple(INDEX.split("/")) or not (name or filename):
            raise Refused(404, f"pip reads /{INDEX}/+simple/<project>/ and the files it links")
        if name is None:
            raise Refused(403, f"{filename} names no package version pip installs")
        return Target(path, encode(segments), name, version, filename)

    async def start(self) -> None:
        """Start devpi-server (made on first use) and point its mirror at pip's index."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        password = await asyncio.to_thread(self._password)
        if not (self.server_dir / ".nodeinfo").exists():
            # One argument: a password may begin with '-' (token_urlsafe), an option to argparse.
            await self._run("devpi-init", "--serverdir", str(self.server_dir),
                            f"--root-passwd={password}")  # fmt: skip
        self.port = _free_port()
        # A mirror answer slower than devpi's 5 s left pip "no versions" on a loaded host.
        await self._launch(_tool("devpi-server"), "--serverdir", str(self.server_dir),
                           "--host", "127.0.0.1", "--port", str(self.port),
                           "--request-timeout", str(UPSTREAM_TIMEOUT))  # fmt: skip
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            await self._wait_ready(client)
            await self._configure(client, password, configured_index())
        log.info("package cache (devpi-server) on %s", self.url)

    def _password(self) -> str:
        path = self.state_dir / "root-password"
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(24))
        return path.read_text().strip()

    async def _run(self, tool: str, *args: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            _tool(tool), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{tool} failed: {out.decode(errors='replace')[-2000:]}")

    async def _configure(self, client: httpx.AsyncClient, password: str, index: str) -> None:
        """Make (or repoint) the mirror index at ``index``."""
        login = await client.post(
            "/+login", json={"user": "root", "password": password}, headers=_JSON
        )
        login.raise_for_status()
        token = login.json()["result"]["password"]
        auth = {**_JSON, "X-Devpi-Auth": base64.b64encode(f"root:{token}".encode()).decode()}
        made = await client.put(f"/{INDEX}", json={"type": "mirror", "mirror_url": index},
                                headers=auth)  # fmt: skip
        if made.status_code == 409:  # made by an earlier start
            made = await client.patch(f"/{INDEX}", json=[f"mirror_url={index}"], headers=auth)
        made.raise_for_status()


_JSON = {"Accept": "application/json", "Content-Type": "application/json"}


def _tool(name: str) -> str:
    """A console script of this Python's environment (where devpi-server is installed)."""
    return str(Path(sys.executable).parent / name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PackageGate:
    """The sessions' Unix sockets in front of the cache: policy, forwarding, records.

    Each connection carries one request; a session holds at most
    ``max_connections`` at once (429 past that), each head must arrive within
    ``head_timeout`` (408), and an answer that moves no byte for
    ``idle_timeout`` is cut off.
    """

    def __init__(
        self,
        cache: Cache,
        policy_of: Callable[[str], PackagePolicy | None],
        head_timeout: float = 10.0,
        idle_timeout: float = 180.0,  # pip and npm wait 120 s for a cache's first fetch
        max_connections: int = 8,
    ) -> None:
        """``policy_of(session_id)``: its tenant's policy, None for no live session."""
        self.cache = cache
        self.policy_of = policy_of
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.on_install: InstallHook | None = None
        self._sockets = SessionSockets(cache.socket_name, self._serve, MAX_HEAD)
        self._open: Counter[str] = Counter()  # connections per session, across reopenings

    async def open(self, session_id: str, run_dir: Path) -> None:
        """Serve the session's socket in its run directory (again, after a gateway restart).

        The run directory is the sandbox's: the socket is made ready out of its
        reach and put in whole (``nofollow.bind_socket``), the sandbox user
        may connect; only its own sandbox sees the directory.
        """
        await self._sockets.open(session_id, run_dir)

    def close(self, session_id: str) -> None:
        self._sockets.close(session_id)

    def stop(self) -> None:
        self._sockets.stop()

    async def _serve(
        self, session_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._open[session_id] >= self.max_connections:
            bound = self.max_connections
            reason = f"too many connections to the package cache from this session ({bound})"
            await _refuse(writer, f"{reason}; retry once some end", 429)
            writer.close()
            return
        self._open[session_id] += 1
        try:
            request, target = await self._read(reader)
            policy = self.policy_of(session_id)
            name, version, filename = target.name, target.version, target.filename
            # Decided on the file, not the project page: pip shows a download's
            # refusal as an error with its reason, a page's only with --verbose;
            # npm prints the 403's reason either way, with the version it chose.
            refused = (
                "the session has ended"
                if policy is None
                else (policy.refusal(name, version, self.cache.npm) if name and filename else None)
            )
            if refused is not None:
                shown = name or target.path
                await _refuse(writer, f"package policy refused {shown}: {refused}")
                installer = self.cache.installer
                self._report(Install(session_id, shown, version, filename, refused,
                                     installer=installer))  # fmt: skip
                return
            cached = filename is not None and await asyncio.to_thread(self.cache.has, target.path)
            size, digest = await self._forward(request.head(target.sent), writer)
            if filename is not None and name:
                facts = (size, digest, cached, self.cache.installer)
                self._report(Install(session_id, name, version, filename, None, *facts))
        except Refused as e:
            log.debug("package gate of %s refused a request: %s", session_id, e.reason)
            await _refuse(writer, e.reason, e.status)
        except (ConnectionError, OSError):
            pass  # the client or the cache went away, or moved nothing for idle_timeout
        finally:
            self._open[session_id] -= 1
            if not self._open[session_id]:
                del self._open[session_id]
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> tuple[Request, Target]:
        """The request's head, parsed, and its target decided; or ``Refused``."""
        try:
            async with asyncio.timeout(self.head_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            raise Refused(
                408, f"the request head did not arrive within {self.head_timeout:g} s"
            ) from None
        except asyncio.LimitOverrunError:
            raise Refused(431, f"request head over {MAX_HEAD} bytes") from None
        except asyncio.IncompleteReadError:
            raise ConnectionError("the client left before its request ended") from None
        request = parse(head)
        return request, self.cache.target(request.segments)

    async def _forward(self, head: bytes, writer: asyncio.StreamWriter) -> tuple[int, str]:
        """Send the request to the cache and its answer back, each step within idle_timeout.

        Returns the response body's size and SHA-256.
        """
        opening = asyncio.open_connection("127.0.0.1", self.cache.port)
        up_reader, up_writer = await self._idle_bound(opening)
        up_writer.write(head)
        digest, size, body = hashlib.sha256(), 0, False
        try:
            buffered = b""
            while data := await self._idle_bound(up_reader.read(CHUNK)):
                writer.write(data)
                await self._idle_bound(writer.drain())
                if body:
                    digest.update(data)
                    size += len(data)
                    continue
                buffered += data
                if b"\r\n\r\n" in buffered:
                    body = True
                    rest = buffered.split(b"\r\n\r\n", 1)[1]
                    digest.update(rest)
                    size += len(rest)
                    buffered = b""
        finally:
            up_writer.close()
        return size, digest.hexdigest()

    async def _idle_bound(self, step: Awaitable[_T]) -> _T:
        async with asyncio.timeout(self.idle_timeout):
            return await step

    def _report(self, install: Install) -> None:
        if self.on_install is not None:
            try:
                self.on_install(install)
            except Exception:
                log.exception("the package install hook failed")


def project_of(path: str) -> tuple[str | None, str | None, str | None]:
    """(name, version, filename) that a cache URL asks for; None where it names none."""
    match = _SIMPLE.match(path)
    if match:
        return match["name"], None, None
    match = _FILE.match(path)
    if match:
        filename = match["file"]
        parts = _WHEEL.match(filename) or _SDIST.match(filename)
        if parts:
            return parts["name"], parts["version"], filename
        return None, None, filename
    return None, None, None


async def _refuse(writer: asyncio.StreamWriter, reason: str, status: int = 403) -> None:
    """Answer with ``reason`` as the status line's phrase: pip and npm print it."""
    phrase = reason.replace("\r", " ").replace("\n", " ")[:300]
    body = f"sbx: {phrase}\n".encode()
    extra = {405: "Allow: GET, HEAD\r\n", 429: "Retry-After: 1\r\n"}.get(status, "")
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(
            f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"{extra}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
