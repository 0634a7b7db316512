"""npm installs through a cache: verdaccio beside the gateway, reached from no network.

``NpmCache`` runs verdaccio (pinned in ``verdaccio/package-lock.json``,
installed with the host's npm on first use, or by ``scripts/setup``) as a
process of its own, with one uplink: the registry npm is configured with on
this host (``npm config get registry``, with its CA file and proxy). A
package is fetched from upstream once and served from the cache after.

A JavaScript sandbox keeps ``--network none``, as a Python one does: the
gateway serves a Unix socket in its run directory (``/run/sbx/npm.sock``
inside), and a small relay process the kernel starts listens on the
sandbox's own loopback for npm (``npm_config_registry``). The same
``PackageGate`` answers there, with the tenant's allow and deny lists
applied to npm names (``name`` or ``name@version``) on each tarball.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx

from .package_requests import Refused, encode
from .packages import Cache, Target, _free_port

log = logging.getLogger(__name__)

PINNED = Path(__file__).resolve().parent / "verdaccio"  # package.json and its lock
RELAY_PORT = 4873  # where npm finds the registry on a sandbox's own loopback
SOCKET_NAME = "npm.sock"  # in the session's run directory

# Set in the kernel's environment: npm asks the relay, and nothing else.
NPM_ENV = {
    "npm_config_registry": f"http://127.0.0.1:{RELAY_PORT}/",
    "npm_config_fetch_timeout": "120000",  # the cache's first fetch waits for upstream
    "npm_config_audit": "false",  # a POST: the gate passes GET and HEAD only
    "npm_config_maxsockets": "4",  # the gate takes 8 connections a session at once
    "npm_config_fund": "false",
    "npm_config_update_notifier": "false",
}

# Run in a JavaScript kernel (silently) once it starts: a process of its own,
# so the kernel's synchronous child_process calls (execSync "npm install")
# do not stall it. A second one finds the port taken and exits.
RELAY = (
    "(() => {\n"
    "  const relay = `const net = require('net');\n"
    "    const server = net.createServer((c) => {\n"
    f"      const u = net.connect('/run/sbx/{SOCKET_NAME}');\n"
    "      c.pipe(u); u.pipe(c);\n"
    "      c.on('error', () => u.destroy()); u.on('error', () => c.destroy());\n"
    "    });\n"
    "    server.on('error', () => process.exit(0));\n"
    f"    server.listen({RELAY_PORT}, '127.0.0.1');`;\n"
    "  require('child_process')\n"
    "    .spawn(process.execPath, ['-e', relay], {detached: true, stdio: 'ignore'})\n"
    "    .unref();\n"
    "})();\n"
)

# /name/-/file.tgz, /@scope/name/-/file.tgz; a packument is /name or /@scope/name
_TARBALL = re.compile(r"^/(?P<name>(?:@[^/]+/)?[^/@][^/]*)/-/(?P<file>[^/]+\.tgz)$")
_PACKUMENT = re.compile(r"^/(?P<name>(?:@[^/]+/)?[^/@-][^/]*)$")


def project_of(path: str) -> tuple[str | None, str | None, str | None]:
    """(name, version, filename) that a registry URL asks for; None where it names none."""
    match = _TARBALL.match(path)
    if match:
        name, filename = match["name"], match["file"]
        base = name.rpartition("/")[2]
        stem = filename.removesuffix(".tgz")
        version = stem[len(base) + 1 :] if stem.startswith(f"{base}-") else None
        return name, version or None, filename
    match = _PACKUMENT.match(path)
    if match:
        return match["name"], None, None
    return None, None, None


def _npm_config(key: str) -> str | None:
    """A setting of the host's npm (its environment and npmrc files); None when unset."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("the npm cache needs npm on the gateway's host (apt install npm)")
    done = subprocess.run(
        [npm, "config", "get", key], capture_output=True, text=True, timeout=60, check=False
    )
    value = done.stdout.strip()
    return None if done.returncode or value in ("", "null", "undefined") else value


def tools_dir() -> Path:
    """Where the pinned verdaccio is installed: per lock file, shared by this user's gateways."""
    lock = (PINNED / "package-lock.json").read_bytes()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sandbox-gateway" / f"verdaccio-{hashlib.sha256(lock).hexdigest()[:12]}"


def ensure_verdaccio() -> Path:
    """Install the pinned verdaccio with the host's npm unless done; its launcher."""
    target = tools_dir()
    launcher = target / "node_modules" / ".bin" / "verdaccio"
    done = target / ".installed"
    if done.exists():
        return launcher
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # gateways starting together install once
        if not done.exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copy(PINNED / name, target / name)
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError("the npm cache needs npm on the gateway's host")
            proc = subprocess.run(
                [npm, "ci", "--omit=dev", "--no-audit", "--no-fund"],
                cwd=target, capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            if proc.returncode:
                raise RuntimeError(f"installing verdaccio failed: {proc.stderr[-2000:]}")
            done.touch()
    return launcher


class NpmCache(Cache):
    """verdaccio, run and configured by the gateway; a caching proxy of npm's registry."""

    language = "javascript"
    installer = "npm"
    socket_name = SOCKET_NAME
    npm = True
    env = NPM_ENV
    relay = RELAY
    program = "verdaccio"
    ready_path = "/-/ping"

    def __init__(self, state_dir: Path, start_timeout: float = 120.0) -> None:
        super().__init__(state_dir, start_timeout)
        self.storage = state_dir / "storage"

    def has(self, url_path: str) -> bool:
        """Whether verdaccio's storage holds the tarball ``url_path`` names."""
        name, _, filename = project_of(url_path)
        return bool(name and filename) and (self.storage / name / filename).is_file()

    def target(self, segments: tuple[str, ...]) -> Target:
        """A packument (scoped: ``@scope%2fname``, as npm asks), a tarball, or a ping."""
        path = "/" + "/".join(segments)
        if segments == ("-", "ping"):
            return Target(path, path)
        name, version, filename = project_of(path)
        if name is None:
            raise Refused(404, "npm reads a package's /<name> and /<name>/-/<name>-<version>.tgz")
        if filename is not None and version is None:
            raise Refused(403, f"{filename} is not a tarball of {name}")
        sent = encode(segments, "/" if filename else "%2f")
        return Target(path, sent, name, version, filename)

    async def start(self) -> None:
        """Install verdaccio if needed, write its config (uplink: npm's registry), start it."""
        launcher = await asyncio.to_thread(ensure_verdaccio)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        config, env = await asyncio.to_thread(self._configure)
        self.port = _free_port()
        await self._launch(
            str(launcher), "--config", str(config), "--listen", f"127.0.0.1:{self.port}", env=env
        )
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            await self._wait_ready(client)
        log.info("npm cache (verdaccio) on %s", self.url)

    def _configure(self) -> tuple[Path, dict[str, str]]:
        """verdaccio's config (JSON is YAML) and environment, from the host's npm settings."""
        registry = _npm_config("registry")  # npm always has one: its default, if not set
        if registry is None:
            raise RuntimeError("npm on this host names no registry (npm config get registry)")
        uplink: dict[str, object] = {"url": registry, "timeout": "120s", "maxage": "10m"}
        for key, field in (("https-proxy", "https_proxy"), ("proxy", "http_proxy")):
            value = _npm_config(key)
            if value:
                uplink[field] = value
        everyone = {"access": "$all", "publish": "sbx-nobody", "proxy": "upstream"}
        config = {
            "storage": str(self.storage),
            "uplinks": {"upstream": uplink},
            "packages": {"@*/*": everyone, "**": everyone},
            "web": {"enable": False},
            # No accounts: nobody registers (max_users -1), nobody is in sbx-nobody.
            "auth": {"htpasswd": {"file": str(self.state_dir / "htpasswd"), "max_users": -1}},
            "publish": {"allow_offline": False},
            "log": {"type": "stdout", "format": "pretty", "level": "warn"},
        }
        path = self.state_dir / "config.yaml"
        path.write_text(json.dumps(config, indent=2))
        env = dict(os.environ)
        cafile = _npm_config("cafile")
        if cafile and "NODE_EXTRA_CA_CERTS" not in env:
            env["NODE_EXTRA_CA_CERTS"] = cafile
        return path, env


if __name__ == "__main__":  # scripts/setup: install it ahead of the first start
    print(ensure_verdaccio())
