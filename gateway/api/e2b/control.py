"""E2B's control API (``/sandboxes``, ``/v2/sandboxes``) over the session manager.

A sandbox is a session: create starts one (a warm one when the pool has
it), kill deletes it, a sandbox's timeout is the session's ttl counted from
now. Pause is the gateway's own pause (the kernel's state saved, its memory
released) and connect resumes; snapshots and forks answer 501 until they are
mapped onto the gateway's: ``NOT_YET`` lists what is not offered, and why.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from typing import Any

from ...access.sandbox_tokens import SandboxTokens
from ...errors import BadRequest, Conflict, NotSupported
from ...sandbox.workspace import iso
from ...sessions.model import Session
from ...sessions.requests import CreateSession, PauseSession, UpdateSession, seconds_of
from ...validation import env_vars, metadata_dict
from .base import E2BHandler
from .templates import ENVD_VERSION, kernel_for_template

_ID = r"(?P<sandbox_id>[^/]+)"
CLIENT_ID = "sandbox-gateway"
DEFAULT_TIMEOUT = 300  # seconds: E2B's own default, when create names none
LIST_PAGE = 100

# Calls the SDK makes that this gateway does not offer yet, and why.
NOT_YET = {
    "auto_pause": "pausing a sandbox on its timeout is not supported: pause it yourself",
    "snapshots": "snapshots are not supported by this gateway yet",
    "fork": "forking a sandbox is not supported by this gateway yet",
    "network": "changing a running sandbox's network is not supported; choose it at create",
    "logs": "sandbox logs are not offered; the gateway's audit log records what was run",
}


class ControlHandler(E2BHandler):
    @property
    def tokens(self) -> SandboxTokens:
        return self.settings["sbx_e2b_tokens"]

    def sandbox(self, session: Session) -> dict[str, Any]:
        """The ``Sandbox`` answer of create and connect."""
        token = self.tokens.issue(session.id)
        return {
            "templateID": session.kernel_name,
            "sandboxID": session.id,
            "alias": session.kernel_name,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": token,
            "trafficAccessToken": token,
            "domain": None,
        }

    async def set_timeout(self, session: Session, timeout: Any, only_longer: bool = False) -> None:
        """Make the session end ``timeout`` seconds from now, idle or not, as E2B's do.

        The ttl counts from the session's creation; the idle timeout from its
        last activity, which this call is.
        """
        seconds = seconds_of(timeout, "timeout")
        if seconds is None:
            return
        ttl = time.time() - session.created_at + seconds
        if only_longer and ttl <= session.ttl:
            return
        update = UpdateSession(ttl=ttl, idle_timeout=seconds)
        await self.manager.update(session.id, self.principal, update)


def listed(session: Session) -> dict[str, Any]:
    """A sandbox as list and get_info show it."""
    return {
        "templateID": session.kernel_name,
        "alias": session.kernel_name,
        "sandboxID": session.id,
        "clientID": CLIENT_ID,
        "startedAt": iso(session.created_at),
        "endAt": iso(session.expires_at),
        "cpuCount": max(1, math.ceil(session.limits.cpus)),
        "memoryMB": session.limits.memory // 2**20,
        "diskSizeMB": session.limits.disk // 2**20,
        "state": "paused" if session.state == "paused" else "running",
        "envdVersion": ENVD_VERSION,
        "metadata": {k: str(v) for k, v in session.metadata.items()},
    }


def create_request(body: dict[str, Any]) -> CreateSession:
    """E2B's ``NewSandbox`` as the gateway's create request."""
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise BadRequest("templateID must name a template, such as 'code-interpreter-v1'")
    if body.get("autoPause") or body.get("autoResume"):
        raise NotSupported(NOT_YET["auto_pause"])
    if body.get("volumeMounts") or body.get("mcp"):
        raise NotSupported("volume mounts and MCP servers in a sandbox are not supported")
    timeout = seconds_of(body.get("timeout", DEFAULT_TIMEOUT), "timeout")
    return CreateSession(
        kernel=kernel_for_template(template),
        ttl=timeout,
        idle_timeout=timeout,  # an E2B sandbox lives to its timeout, idle or not
        env=env_vars(body.get("envVars")),
        metadata=metadata_dict(body.get("metadata")),
    )


class SandboxesHandler(ControlHandler):
    """``POST`` creates a sandbox; ``GET`` lists them (``/v2``: paginated)."""

    actions = {"POST": "session.create"}

    async def post(self) -> None:
        session = await self.manager.create(create_request(self.json_body()), self.principal)
        self.audit_session = session.id
        self.send(self.sandbox(session), status=201)

    async def get(self) -> None:
        metadata = dict(urllib.parse.parse_qsl(self.get_argument("metadata", "")))
        states = set(self.get_argument("state", "running,paused").split(","))
        found = [
            s
            for s in self.manager.list(self.principal, metadata=metadata)
            if ("paused" if s.state == "paused" else "running") in states
        ]
        if not self.request.path.startswith("/v2/"):
            self.send([listed(s) for s in found])
            return
        limit = self.int_argument("limit", LIST_PAGE)
        start = self.int_argument("nextToken", 0) if self.get_argument("nextToken", "") else 0
        if not 1 <= limit <= LIST_PAGE or start < 0:
            raise BadRequest(f"limit must be 1 to {LIST_PAGE}, nextToken one a page answered with")
        page = found[start : start + limit]
        if start + limit < len(found):
            self.set_header("X-Next-Token", str(start + limit))
        self.send([listed(s) for s in page])


class SandboxInfoHandler(ControlHandler):
    """``GET`` is get_info; ``DELETE`` kills the sandbox."""

    actions = {"DELETE": "session.delete"}

    async def get(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        self.send({**listed(session), "envdAccessToken": self.tokens.issue(session.id)})

    async def delete(self, sandbox_id: str) -> None:
        await self.manager.delete(sandbox_id, self.principal)
        self.set_status(204)
        self.finish()


class TimeoutHandler(ControlHandler):
    actions = {"POST": "session.update"}

    async def post(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        await self.set_timeout(session, self.json_body().get("timeout"))
        self.set_status(204)
        self.finish()


class RefreshHandler(ControlHandler):
    """Keep-alive: at least ``duration`` seconds more."""

    actions = {"POST": "session.update"}

    async def post(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        await self.set_timeout(session, self.json_body().get("duration"), only_longer=True)
        self.set_status(204)
        self.finish()


class ConnectHandler(ControlHandler):
    """Connect to a sandbox, resuming it if paused; its timeout only grows."""

    actions = {"POST": "session.connect"}

    async def post(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        if session.state == "paused":  # E2B's connect resumes a paused sandbox
            await self.manager.wake(sandbox_id, self.principal)
        await self.set_timeout(session, self.json_body().get("timeout"), only_longer=True)
        self.send(self.sandbox(session))


class PauseHandler(ControlHandler):
    """Pause onto the gateway's own pause: the kernel's state saved, its memory released."""

    actions = {"POST": "session.pause"}

    async def post(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        if session.state == "paused":
            raise Conflict(f"sandbox {sandbox_id} is already paused")
        await self.manager.pause(sandbox_id, self.principal, PauseSession())
        self.set_status(204)
        self.finish()


class ResumeHandler(ControlHandler):
    """The older resume call; connect resumes a paused sandbox too."""

    actions = {"POST": "session.resume"}

    async def post(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        if session.state != "paused":
            raise Conflict(f"sandbox {sandbox_id} is not paused")
        session, _ = await self.manager.resume(sandbox_id, self.principal)
        await self.set_timeout(session, self.json_body().get("timeout"), only_longer=True)
        self.send(self.sandbox(session), status=201)


class MetricsHandler(ControlHandler):
    """One sample now: the sandbox's limits, and its workspace's use."""

    async def get(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        free = await self.manager.files(sandbox_id, self.principal).free_bytes()
        now = time.time()
        limits = session.limits
        self.send(
            [
                {
                    "timestamp": iso(now),
                    "timestampUnix": int(now),
                    "cpuCount": max(1, math.ceil(limits.cpus)),
                    "cpuUsedPct": 0.0,
                    "memUsed": 0,
                    "memTotal": limits.memory,
                    "memCache": 0,
                    "diskUsed": max(0, limits.disk - free),
                    "diskTotal": limits.disk,
                }
            ]
        )


class NotYetHandler(ControlHandler):
    """Pause, resume, snapshots, forks, network changes, logs: 501 with the reason."""

    def initialize(self, feature: str) -> None:
        self.feature = feature

    async def get(self, sandbox_id: str | None = None) -> None:
        if sandbox_id is not None:
            self.manager.get(sandbox_id, self.principal)  # another tenant's: 404 first
        raise NotSupported(NOT_YET[self.feature])

    post = put = get


routes = [
    (r"/sandboxes", SandboxesHandler),
    (r"/v2/sandboxes", SandboxesHandler),
    (rf"/sandboxes/{_ID}", SandboxInfoHandler),
    (rf"/sandboxes/{_ID}/timeout", TimeoutHandler),
    (rf"/sandboxes/{_ID}/refreshes", RefreshHandler),
    (rf"/sandboxes/{_ID}/connect", ConnectHandler),
    (rf"/v2/sandboxes/{_ID}/connect", ConnectHandler),
    (rf"/sandboxes/{_ID}/metrics", MetricsHandler),
    (rf"/sandboxes/{_ID}/pause", PauseHandler),
    (rf"/sandboxes/{_ID}/resume", ResumeHandler),
    *(
        (rf"/sandboxes/{_ID}/{feature}", NotYetHandler, {"feature": feature})
        for feature in ("snapshots", "fork", "network", "logs")
    ),
    (rf"/v2/sandboxes/{_ID}/logs", NotYetHandler, {"feature": "logs"}),
    (r"/snapshots", NotYetHandler, {"feature": "snapshots"}),
]
