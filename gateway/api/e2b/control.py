"""E2B's control API (``/sandboxes``, ``/v2/sandboxes``) over the session manager.

A sandbox is a session: create starts one (a warm one when the pool has
it), kill deletes it, a sandbox's timeout is the session's ttl counted from
now. Pause is the gateway's own pause (the kernel's state saved, its memory
released) and connect resumes. An E2B snapshot is a gateway snapshot (its id
is the ``snapshotID``, and creating a sandbox with it as the template is a
fork); ``fork`` is one snapshot forked ``count`` times, then deleted.
Auto-pause is ``idle_action: pause``. ``NOT_YET`` lists what is not offered,
and why.
"""

from __future__ import annotations

import dataclasses
import math
import time
import urllib.parse
from typing import Any, TypeVar

from ...access.sandbox_tokens import SandboxTokens
from ...errors import BadRequest, Conflict, NotSupported, PathForbidden, SnapshotNotFound
from ...sessions.cpu import CpuShares
from ...sessions.forks import Forks
from ...sessions.listing import PAGE_MAX
from ...sessions.model import Session
from ...sessions.requests import (
    CreateSession,
    MountVolume,
    PauseSession,
    TakeSnapshot,
    UpdateSession,
    seconds_of,
)
from ...sessions.templates import TemplateNotFound, template_name
from ...timestamps import iso
from ...validation import env_vars, metadata_dict
from ..snapshots import delete_snapshot
from .base import E2BHandler
from .envd import workspace_path
from .mcp import tools_of
from .network import credentials_of, internet_access, network_of
from .templates import ENVD_VERSION, HOME, TEMPLATES, kernel_for_template

_ID = r"(?P<sandbox_id>[^/]+)"
CLIENT_ID = "sandbox-gateway"
DEFAULT_TIMEOUT = 300  # seconds: E2B's own default, when create names none
LIST_PAGE = 100
T = TypeVar("T")

# Calls the SDK makes that this gateway does not offer yet, and why.
NOT_YET = {
    "logs": "sandbox logs are not offered; the gateway's audit log records what was run",
}


class ControlHandler(E2BHandler):
    @property
    def tokens(self) -> SandboxTokens:
        return self.settings["sbx_e2b_tokens"]

    def sandbox(self, session: Session) -> dict[str, Any]:
        """The ``Sandbox`` answer of create and connect."""
        token = self.tokens.issue(session.id, self.principal.token_id)
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
        if session.idle_action == "pause":  # auto-pause: the timeout pauses; the ttl only grows
            ttl = max(ttl, session.ttl)
        if only_longer and ttl <= session.ttl:
            return
        update = UpdateSession(ttl=ttl, idle_timeout=seconds)
        await self.manager.update(session.id, self.principal, update)

    def page(self, found: list[T]) -> list[T]:
        """The page of ``found`` that ``limit`` and ``nextToken`` ask for; the next's token in
        ``X-Next-Token`` when there is one."""
        limit = self.int_argument("limit", LIST_PAGE)
        start = self.int_argument("nextToken", 0) if self.get_argument("nextToken", "") else 0
        if not 1 <= limit <= LIST_PAGE or start < 0:
            raise BadRequest(f"limit must be 1 to {LIST_PAGE}, nextToken one a page answered with")
        if start + limit < len(found):
            self.set_header("X-Next-Token", str(start + limit))
        return found[start : start + limit]


def listed(view: dict[str, Any]) -> dict[str, Any]:
    """A sandbox (a session's view) as list and get_info show it."""
    limits = view["limits"]
    return {
        "templateID": view["kernel"],
        "alias": view["kernel"],
        "sandboxID": view["id"],
        "clientID": CLIENT_ID,
        "startedAt": view["created_at"],
        "endAt": view["expires_at"],
        "cpuCount": max(1, math.ceil(limits["cpus"])),
        "memoryMB": limits["memory"] // 2**20,
        "diskSizeMB": limits["disk"] // 2**20,
        "state": "paused" if view["state"] == "paused" else "running",
        "envdVersion": ENVD_VERSION,
        "metadata": {k: str(v) for k, v in view["metadata"].items()},
    }


def create_request(body: dict[str, Any], longest: float) -> CreateSession:
    """E2B's ``NewSandbox`` as the gateway's create request.

    Auto-pause (``lifecycle={"on_timeout": "pause"}``) is ``idle_action:
    pause`` with the timeout as the idle timeout: E2B pauses at the timeout,
    busy or not; the gateway pauses a sandbox idle that long (a running cell
    is never cut), and a paused one still ends at the ttl, here the server's
    longest (``longest``: the server's ``max_ttl``).
    Auto-resume is what the gateway does anyway: traffic resumes a paused one.
    """
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise BadRequest("templateID must name a template, such as 'code-interpreter-v1'")
    auto_pause = body.get("autoPause")
    if not isinstance(auto_pause, bool | None):
        raise BadRequest("autoPause must be true or false")
    timeout = seconds_of(body.get("timeout", DEFAULT_TIMEOUT), "timeout")
    network = network_of(body.get("network"), internet_access(body))
    return CreateSession(
        kernel=kernel_for_template(template),
        ttl=longest if auto_pause else timeout,
        idle_timeout=timeout,  # an E2B sandbox lives to its timeout, idle or not
        idle_action="pause" if auto_pause else None,  # None: the server's choice
        env=env_vars(body.get("envVars")),
        metadata=metadata_dict(body.get("metadata")),
        **({"network": network} if network is not None else {}),
        credentials=credentials_of(body.get("network")),
        volumes=volume_mounts(body.get("volumeMounts")),
        tools=None if body.get("mcp") is None else tools_of(body["mcp"]),
    )


def volume_mounts(value: Any) -> tuple[MountVolume, ...] | None:
    """E2B's ``volumeMounts`` ([{name, path}], path in the sandbox) as read-write mounts."""
    if not value:
        return None
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise BadRequest('volumeMounts must be a list of {"name": ..., "path": ...}')
    mounts = []
    for m in value:
        path = m.get("path")
        try:
            relative = workspace_path(path) if isinstance(path, str) else path
        except PathForbidden as e:
            raise BadRequest(f"a volume mounts under {HOME}: {e.message}") from None
        mounts.append({"name": m.get("name"), "path": relative})
    return MountVolume.parse_all(mounts)


async def from_snapshot(handler: ControlHandler, request: CreateSession) -> CreateSession:
    """A create whose template is one of the caller's snapshots: a fork of it."""
    if request.kernel in TEMPLATES.values():
        return request
    try:
        doc = await handler.snapshots.get(request.kernel, handler.principal)
    except SnapshotNotFound:
        return await from_template(handler, request)
    return dataclasses.replace(request, kernel="", from_snapshot=doc["id"])


async def from_template(handler: ControlHandler, request: CreateSession) -> CreateSession:
    """A create whose template is one of the caller's templates (``Template.build``)."""
    try:
        name = request.kernel.partition(":")[0]  # "name:tag" and "name:3" too
        await handler.templates.versions(handler.principal.tenant, name)
    except (TemplateNotFound, BadRequest):
        return request  # a kernel's name; an unknown one is refused as on /v1
    return dataclasses.replace(request, template=request.kernel)


def snapshot_info(doc: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as E2B's ``SnapshotInfo``: its id, and its name when it has one."""
    return {"snapshotID": doc["id"], "names": [doc["name"]] if doc.get("name") else []}


class SandboxesHandler(ControlHandler):
    """``POST`` creates a sandbox; ``GET`` lists them (``/v2``: paginated)."""

    actions = {"POST": "session.create"}

    async def post(self) -> None:
        longest = self.api_options.max_ttl
        request = await from_snapshot(self, create_request(self.json_body(), longest))
        session = await self.tools.create(request, self.principal)
        self.audit_session = session.id
        self.send(self.sandbox(session), status=201)

    async def get(self) -> None:
        metadata = dict(urllib.parse.parse_qsl(self.get_argument("metadata", "")))
        states = set(self.get_argument("state", "running,paused").split(","))
        views, _ = await self.listing.page(self.principal, metadata=metadata, limit=PAGE_MAX)
        found = [
            listed(v)
            for v in views
            if ("paused" if v["state"] == "paused" else "running") in states
        ]
        if self.request.path.startswith("/v2/"):
            found = self.page(found)
        self.send(found)


class SandboxInfoHandler(ControlHandler):
    """``GET`` is get_info; ``DELETE`` kills the sandbox."""

    actions = {"DELETE": "session.delete"}

    async def get(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        self.send(
            {
                **listed(session.to_json()),
                "envdAccessToken": self.tokens.issue(session.id, self.principal.token_id),
            }
        )

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


class SnapshotsHandler(ControlHandler):
    """``POST /sandboxes/{id}/snapshots``: the gateway's snapshot; the sandbox keeps running.

    E2B's ``mode="filesystem"`` (``memory: false``) is taken as a full one:
    the kernel's state is kept too, which a fork may ignore by restarting.
    """

    actions = {"POST": "snapshot.create"}

    async def post(self, sandbox_id: str) -> None:
        name = self.json_body().get("name")
        doc = await self.manager.snapshot(sandbox_id, self.principal, TakeSnapshot.from_json(
            {"name": name} if name else {}))  # fmt: skip
        self.audit_detail.update(snapshot_id=doc["id"], name=doc["name"])
        self.send(snapshot_info(doc), status=201)


class SnapshotListHandler(ControlHandler):
    """``GET /snapshots``: the tenant's snapshots (``sandboxID``, ``name`` filter), paged."""

    async def get(self) -> None:
        sandbox_id = self.get_argument("sandboxID", "")
        if sandbox_id:
            docs = await self.reports.snapshots_of(sandbox_id, self.principal)
        else:
            docs = await self.snapshots.of_tenant(self.principal)
        name = self.get_argument("name", "")
        found = [d for d in docs if not name or d.get("name") == name]
        self.send([snapshot_info(d) for d in self.page(found)])


class SnapshotDeleteHandler(ControlHandler):
    """``DELETE /templates/{id}``: the SDK's ``delete_snapshot``, and E2B's API's delete
    of a template (every version of the tenant's template of that name).

    Anything else is a 404 (the SDK's ``False``), as is another tenant's snapshot
    or template.
    """

    actions = {"DELETE": "snapshot.delete"}

    async def delete(self, snapshot_id: str) -> None:
        try:
            await delete_snapshot(self, snapshot_id)
        except SnapshotNotFound as missing:
            try:
                template_name(snapshot_id)
            except BadRequest:
                raise missing from None
            self.actions = {"DELETE": "template.delete"}  # audited as /v1's delete is
            self.audit_detail.update(template=snapshot_id)
            await self.templates.delete(self.principal.tenant, snapshot_id)
            self.set_status(204)
            self.finish()


class ForkHandler(ControlHandler):
    """``POST /sandboxes/{id}/fork``: one snapshot, ``count`` sandboxes from it, then deleted.

    Each fork succeeds or fails on its own (E2B's per-fork ``error``); the
    snapshot is only the means, so it is deleted once the forks hold its state.
    """

    actions = {"POST": "session.fork"}

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        snapshot_id, forks = await self.forks.fork(
            sandbox_id, self.principal, body.get("count", 1), body.get("timeout", DEFAULT_TIMEOUT)
        )
        self.audit_detail.update(snapshot_id=snapshot_id, count=len(forks))
        answers = [
            {"sandbox": self.sandbox(fork)}
            if isinstance(fork, Session)
            else {"error": {"code": fork.status, "message": fork.message}}
            for fork in forks
        ]
        self.audit_detail["forks"] = [a["sandbox"]["sandboxID"] for a in answers if "sandbox" in a]
        self.send(answers, status=201)

    @property
    def forks(self) -> Forks:
        return self.settings["sbx_e2b_forks"]


class MetricsHandler(ControlHandler):
    """One sample now, from the session's own metrics (``GET /v1/sessions/{id}/metrics``).

    Memory is the container's use; ``cpuUsedPct`` is the CPU time used since
    the previous sample this gateway answered for the sandbox (the first:
    since it was created), as a share of its CPU limit, as E2B's is over its
    sampling interval. A frozen sandbox holds its memory; a saved one uses none.
    """

    async def get(self, sandbox_id: str) -> None:
        session = self.manager.get(sandbox_id, self.principal)
        usage = await self.reports.usage(sandbox_id, self.principal)
        shares: CpuShares = self.settings["sbx_e2b_cpu"]
        now, share = shares.sample(session, usage["cpu_seconds"] or 0.0)
        limits = session.limits
        disk = usage["disk_bytes"] or 0
        self.send(
            [
                {
                    "timestamp": iso(now),
                    "timestampUnix": int(now),
                    "cpuCount": max(1, math.ceil(limits.cpus)),
                    "cpuUsedPct": share,
                    "memUsed": usage["memory_bytes"] or 0,
                    "memTotal": limits.memory,
                    "memCache": 0,
                    "diskUsed": disk,
                    "diskTotal": limits.disk,
                }
            ]
        )


class NetworkHandler(ControlHandler):
    """``PUT /sandboxes/{id}/network``: E2B's ``update_network``, replacing the lists whole."""

    actions = {"PUT": "session.network"}

    async def put(self, sandbox_id: str) -> None:
        body = self.json_body()
        internet = internet_access(body)
        lists = {k: v for k, v in body.items() if k != "allow_internet_access"}
        policy = network_of(lists, internet)
        assert policy is not None  # lists are given, so a policy is asked for
        credentials = credentials_of(lists)
        current = self.manager.get(sandbox_id, self.principal).credentials
        if credentials and credentials != current:
            raise Conflict(
                "network.rules are bound when a sandbox is created (its sandbox trusts the "
                "proxy for those hosts from its start): repeat them unchanged, or leave them "
                "out to keep them, or create a sandbox with the new ones"
            )
        session, before = await self.networks.change(sandbox_id, self.principal, policy)
        self.audit_session = session.id
        self.audit_detail.update(before=before.to_json(), after=session.network.to_json())
        self.set_status(204)
        self.finish()


class NotYetHandler(ControlHandler):
    """Logs: 501 with the reason."""

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
    (rf"/sandboxes/{_ID}/snapshots", SnapshotsHandler),
    (rf"/sandboxes/{_ID}/fork", ForkHandler),
    (r"/snapshots", SnapshotListHandler),
    (r"/templates/(?P<snapshot_id>[^/]+)", SnapshotDeleteHandler),
    (rf"/sandboxes/{_ID}/network", NetworkHandler),
    (rf"/sandboxes/{_ID}/logs", NotYetHandler, {"feature": "logs"}),
    (rf"/v2/sandboxes/{_ID}/logs", NotYetHandler, {"feature": "logs"}),
]
