"""Warm pool: kernels started ahead of time, so a create returns in milliseconds.

Per kernelspec (``pool`` setting, e.g. ``python3=2``) a few sandboxes wait
with their kernel answering. A create that fits one claims it: the
requested limits are applied to the running container (Docker updates
memory, swap, CPU and pids in place) and the session's env is set in the
kernel process as a cold start would have it. A request the pool cannot
satisfy starts cold: another image, runtime or network policy, another
workspace size (its filesystem is made at pool time, and online resizing
is not permitted everywhere), a memory limit that changes /tmp's size, a
client-chosen id, sealed secrets (they reach a kernel only as it starts),
env for a kernel that cannot take it late, or, where the placement
cannot resize a running sandbox (swarm), any other limits. A pooled
kernel serves exactly one session, ever. Refills run in the background,
a bounded number at a time, so they do not starve live sessions;
pooled sandboxes count against the server's session limit and give way to
real sessions when it is reached. A resume takes one the same way, where the
placement can hand a running sandbox to a session that keeps its id
(``Placement.hands_over``: docker, not swarm).

Demand moves the sizes (``PoolTargets``): each create that finds a
kernelspec's pool empty raises its target by one, up to ``pool_max``; once
``pool_shrink_after`` seconds pass without one, it falls back by one, down
to its ``pool`` size, and a ready sandbox past the target is removed.

A pool's key is a kernelspec's name (the server's pool, any tenant's create
takes from it) or a ``TemplateKey``: one version of one tenant's template,
whose sandboxes run the template's image, count against that tenant's quota
while they wait (``Admission.claim``, given back as a create takes one) and
serve that tenant's creates alone. Such pools are sized by their tenant
(``template_pools.TemplatePools``), not by demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sized
from typing import TYPE_CHECKING, Any

from ..errors import TooManySessions
from ..tasks import TaskSet, end_task
from .lifecycle import SandboxLifecycle
from .model import Session
from .requests import CreateSession
from .templates import REPO

if TYPE_CHECKING:
    from .admission import Admission

log = logging.getLogger(__name__)

# How a kernel of each language takes env after it started, as a cold start would set it.
_SET_ENV = {"python": "import os as _o; _o.environ.update({env}); del _o"}


@dataclasses.dataclass(frozen=True)
class TemplateKey:
    """The pool of one version of a tenant's template: its sandboxes serve that tenant alone.

    Two keys are one pool when tenant and image match: the image names the
    template and its version (``sessions/templates.py``), and is what a
    session started from the template runs.
    """

    tenant: str
    image: str
    kernel: str = dataclasses.field(compare=False)
    template: str = dataclasses.field(default="", compare=False)  # as its tenant names it
    version: int = dataclasses.field(default=0, compare=False)


PoolKey = str | TemplateKey  # a kernelspec's name: the server's pool, any tenant's


def pool_key(session: Session) -> PoolKey:
    """The pool a session could be served from: its template version's, or its kernelspec's."""
    if session.image.startswith(f"{REPO}/"):
        return TemplateKey(session.tenant, session.image, session.kernel_name)
    return session.kernel_name


class PoolTargets:
    """Ready sandboxes to keep per pool: its size, more while creates find none."""

    def __init__(
        self,
        base: Mapping[PoolKey, int],
        most: Mapping[PoolKey, int],
        shrink_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = dict(base)
        self.most = {name: max(size, most.get(name, size)) for name, size in base.items()}
        self.sizes = dict(base)  # the targets now
        self.shrink_after = shrink_after
        self.clock = clock
        self._moved: dict[PoolKey, float] = {}  # pool -> when its target last moved

    def set(self, key: PoolKey, size: int) -> None:
        """Keep ``size`` ready for ``key`` as asked, not moved by demand (0: no pool)."""
        for sizes in (self.base, self.most, self.sizes, self._moved):
            sizes.pop(key, None)
        if size:
            self.base[key] = self.most[key] = self.sizes[key] = size

    def missed(self, name: PoolKey) -> None:
        """A create found ``name``'s pool empty: keep one more ready, within its bound."""
        if name in self.sizes:
            self.sizes[name] = min(self.most[name], self.sizes[name] + 1)
            self._moved[name] = self.clock()

    def relax(self) -> None:
        """Give back one of a grown target where no create has found it empty for a while."""
        now = self.clock()
        for name, size in self.sizes.items():
            if size > self.base[name] and now - self._moved.get(name, now) >= self.shrink_after:
                self.sizes[name] = size - 1
                self._moved[name] = now


# Imported for their cache (sys.modules); no name is left in the user's namespace.
_IMPORTS = """
for _sbx_module in {modules!r}:
    try:
        __import__(_sbx_module)
    except ImportError:
        pass
del _sbx_module
"""


class WarmPool:
    """Ready sandboxes per pool key, each claimed by at most one session."""

    def __init__(
        self,
        lifecycle: SandboxLifecycle,
        sizes: dict[str, int] | PoolTargets,
        refill_concurrency: int,
        max_sandboxes: int,
        live: Sized,
        imports: tuple[str, ...] = (),
    ) -> None:
        """``live`` holds the sessions that share ``max_sandboxes`` with the pool;
        ``sizes``: fixed sizes, or targets that follow demand; ``imports``: modules each
        pooled Python kernel imports ahead (one its image lacks is skipped)."""
        self.lifecycle = lifecycle
        self.targets = sizes if isinstance(sizes, PoolTargets) else PoolTargets(sizes, {}, 0)
        self.sizes = self.targets.sizes
        self.max_sandboxes = max_sandboxes
        self.live = live
        self.imports = imports
        self.tasks = TaskSet()  # refills and discards, cancelled by ``stop``
        self.ready: dict[PoolKey, list[Session]] = {name: [] for name in self.sizes}
        self.starting: Counter[PoolKey] = Counter()
        self._made: dict[PoolKey, Session] = {}  # the last sandbox started per pool
        self.claims: Counter[tuple[str, str]] = Counter()  # (kernel, hit|miss)
        self.served: Counter[TemplateKey] = Counter()  # creates a template's pool served
        self.short: dict[PoolKey, str] = {}  # why a template's pool cannot fill (its quota)
        self.reserved: dict[str, Session] = {}  # set aside for creates, by their session id
        # Where a template's pooled sandboxes hold their tenant's quota (the manager's).
        self.quotas: Admission | None = None
        self._holding: set[str] = set()  # the template sandboxes whose quota hold is theirs
        self._refills = asyncio.Semaphore(refill_concurrency)
        self._wake = asyncio.Event()
        self._filler: asyncio.Task | None = None

    def __len__(self) -> int:
        return sum(len(r) for r in self.ready.values()) + sum(self.starting.values())

    def start(self) -> None:
        self._filler = asyncio.create_task(self._fill_forever(), name="sbx-pool")

    def resize(self, key: PoolKey, size: int) -> None:
        """Keep ``size`` sandboxes of ``key`` ready (0: remove its pool and what it holds)."""
        self.targets.set(key, size)
        if size:
            self.ready.setdefault(key, [])
        self._wake.set()

    async def stop(self) -> None:
        """Stop refilling and remove every unclaimed sandbox: they belong to no session."""
        await end_task(self._filler)
        # A refill cut short removes its half-started sandbox itself.
        await self.tasks.cancel(timeout=30)
        entries = [entry for ready in self.ready.values() for entry in ready]
        entries += self.reserved.values()
        self.reserved.clear()
        for ready in self.ready.values():
            ready.clear()
        await asyncio.gather(*(self._discard(e) for e in entries), return_exceptions=True)

    # -- claiming ----------------------------------------------------------------------

    async def reserve(self, session: Session, request: CreateSession) -> None:
        """Set a ready sandbox that fits aside for a create, before its quota is claimed.

        A template's sandbox gives its quota hold back here: the create's own
        claim takes its place, so a tenant at its quota is still served.
        """
        entry = self._take(session, request)
        key = pool_key(session)
        made = self._made.get(key)  # what the pool's sandboxes are like
        if entry is None and made is not None and self._fits(session, request, made):
            self.targets.missed(key)  # one would have served it: keep more
        self._wake.set()
        if entry is not None:
            self.reserved[session.id] = entry
            await self._let_go(entry)

    def unreserve(self, session_id: str) -> None:
        """A create that never claimed what it set aside (refused, cut short): the server's
        sandbox, untouched, is ready again (else each refused create spent one); a
        template's, whose quota hold went, is removed."""
        entry = self.reserved.pop(session_id, None)
        if entry is None:
            return
        key = pool_key(entry)
        ready = self.ready.get(key)
        if not entry.tenant and ready is not None and key in self.sizes:
            ready.insert(0, entry)
        else:
            self.tasks.spawn(self._discard(entry))
        self._wake.set()

    async def claim(self, session: Session) -> bool:
        """Give ``session`` the sandbox set aside for it, if any; False means start it cold.

        On success the session has taken the pooled sandbox's id, kernel and
        workspace, with its own limits and env applied.
        """
        entry = self.reserved.pop(session.id, None)
        self._wake.set()  # its refill may start
        hit = False
        if entry is not None and await self._fitted(entry, session, "starting cold"):
            session.take_sandbox(entry)
            hit = True
        self._count(session, hit)
        return hit

    async def take_for(self, session: Session) -> Session | None:
        """A ready sandbox fitted to a paused session's limits and env (a resume), or None.

        The entry stays a separate session: the caller moves the session into
        its sandbox (``SandboxLifecycle.move_in``) or discards it.
        """
        if not self.lifecycle.placement.hands_over:
            return None
        entry = self._take(session, CreateSession(kernel=session.kernel_name))
        self._wake.set()
        if entry is not None and not await self._fitted(entry, session, "resuming cold"):
            entry = None
        self._count(session, entry is not None)
        return entry

    async def _fitted(self, entry: Session, session: Session, otherwise: str) -> bool:
        """Fit a sandbox taken from the pool to ``session``, which holds its own quota claim.

        One that cannot be fitted is spent (a cold start still works); so is one
        whose fit is cut short (the create or resume cancelled): out of the pool
        and no session's, it is removed in the pool's own task, where a second
        cancel of the caller cannot stop the removal halfway.
        """
        try:
            await self._let_go(entry)
            await self._fit(entry, session)
            return True
        except BaseException as e:
            self.tasks.spawn(self._discard(entry))
            if not isinstance(e, Exception):
                raise
            log.warning("pooled kernel %s could not be fitted (%s); %s", entry.id, e, otherwise)
            return False

    def _count(self, session: Session, hit: bool) -> None:
        """Counted once the outcome is known: /metrics exposes it as a counter, which never
        falls; a template's pool counts under its kernel there, and its hits for its tenant."""
        key = pool_key(session)
        self.claims[(session.kernel_name, "hit" if hit else "miss")] += 1
        if hit and isinstance(key, TemplateKey):
            self.served[key] += 1

    def _take(self, session: Session, request: CreateSession) -> Session | None:
        ready = self.ready.get(pool_key(session))
        if not ready or not self._fits(session, request, ready[0]):
            return None
        return ready.pop(0)

    def _fits(self, session: Session, request: CreateSession, pooled: Session) -> bool:
        """Whether the pooled sandbox can become the session asked for."""
        language = pooled.language_info.get("name", "")
        placement = self.lifecycle.placement
        return not (
            request.session_id is not None
            or session.secret_names
            or session.volumes  # bound when its container is made: a cold start
            or request.volumes
            or session.image != pooled.image
            or session.runtime != pooled.runtime
            or not session.network.is_none
            or session.limits.disk != pooled.limits.disk
            or placement.tmp_bytes(session.limits) != placement.tmp_bytes(pooled.limits)
            or (session.env and language not in _SET_ENV)
            or not (placement.resizes_in_place or _same_box(session, pooled))
        )

    async def _fit(self, pooled: Session, session: Session) -> None:
        """Apply to the pooled sandbox what ``session`` asked for (its limits, its env)."""
        kernel, spec = pooled.kernel, pooled.kernel.sandbox if pooled.kernel else None
        assert kernel is not None and spec is not None and kernel.container_id is not None
        if not _same_box(session, pooled):
            await self.lifecycle.placement.update_limits(kernel.container_id, session.limits)
        if session.env:
            language = pooled.language_info.get("name", "")
            await kernel.run_silently(_SET_ENV[language].format(env=json.dumps(session.env)))
        spec.limits, spec.env = session.limits, session.env  # what a restart starts with

    # -- refilling ---------------------------------------------------------------------

    async def _fill_forever(self) -> None:
        while True:
            self._wake.clear()
            self.targets.relax()
            for key in list(self.ready):
                ready, size = self.ready[key], self.sizes.get(key, 0)
                if key not in self.sizes:  # its pool was removed: all of it goes
                    for kept in (self.ready, self.short, self.served, self._made):
                        kept.pop(key, None)  # type: ignore[call-overload]
                    for entry in ready:
                        self.tasks.spawn(self._discard(entry))
                    continue
                if len(ready) > size:  # demand fell: one fewer kept ready
                    self.tasks.spawn(self._discard(ready.pop()))
                while len(ready) + self._coming(key) < size and self._has_room():
                    self.starting[key] += 1
                    self.tasks.spawn(self._refill(key))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._wake.wait()

    def _coming(self, key: PoolKey) -> int:
        """Sandboxes of ``key`` starting, or set aside for a create not yet done: one
        refilled meanwhile would race that create for its tenant's quota."""
        return self.starting[key] + sum(pool_key(e) == key for e in self.reserved.values())

    def _has_room(self) -> bool:
        return len(self.live) + len(self) < self.max_sandboxes

    async def _refill(self, key: PoolKey) -> None:
        try:
            async with self._refills:
                entry = await self._start(key)
            self.short.pop(key, None)
            if key not in self.sizes:  # its pool went meanwhile (and is forgotten: stay so)
                await self._discard(entry)
                return
            self._made[key] = entry
            if len(self.live) + len(self) > self.max_sandboxes:
                await self._discard(entry)  # sessions took the room while it started
            else:
                self.ready[key].append(entry)
        except TooManySessions as e:  # its tenant's quota is full: it waits for room
            if key in self.sizes:
                self.short[key] = e.message
            await asyncio.sleep(5)
        except Exception:
            log.exception("could not start a pooled %s kernel; will retry", key)
            await asyncio.sleep(5)
        finally:
            self.starting[key] -= 1
            if not self.starting[key]:
                del self.starting[key]  # a removed template's pool leaves nothing behind
            self._wake.set()

    async def _start(self, key: PoolKey) -> Session:
        """A sandbox with the server's default limits, its kernel answering.

        A template's holds its share of its tenant's quota first.
        """
        if isinstance(key, TemplateKey):
            request, tenant = CreateSession(kernel=key.kernel, image=key.image), key.tenant
        else:
            request, tenant = CreateSession(kernel=key), ""
        entry = self.lifecycle.new_session(request, tenant=tenant)
        entry.state = "pooled"
        if tenant:
            assert self.quotas is not None, "a template's pool needs its tenants' quotas"
            await self.quotas.claim(entry)
            self._holding.add(entry.id)
        try:
            await self.lifecycle.launch(entry)
            if self.imports and entry.language_info.get("name") == "python":
                assert entry.kernel is not None
                await entry.kernel.run_silently(_IMPORTS.format(modules=list(self.imports)))
        except BaseException:
            await self._discard(entry)
            raise
        log.debug("pooled %s kernel %s ready", key, entry.id)
        return entry

    async def _discard(self, entry: Session) -> None:
        try:
            await self.lifecycle.teardown(entry)
        finally:
            await self._let_go(entry)

    async def _let_go(self, entry: Session) -> None:
        """Give back the quota a template's pooled sandbox holds, once: a session that took
        the sandbox holds its claim under the same id, which a second give-back would free."""
        if entry.id in self._holding and self.quotas is not None:
            self._holding.discard(entry.id)
            await self.quotas.let_go(entry.id)

    # -- upkeep ------------------------------------------------------------------------

    def forget(self, session_id: str) -> bool:
        """A pooled sandbox's container died: drop it (a refill replaces it)."""
        for ready in self.ready.values():
            for entry in ready:
                if entry.id == session_id:
                    ready.remove(entry)
                    self.tasks.spawn(self._discard(entry))
                    self._wake.set()
                    return True
        return False

    async def make_room(self) -> None:
        """Give up a pooled sandbox when live sessions need the server's last slot."""
        if self._has_room():
            return
        for ready in self.ready.values():
            if ready:
                await self._discard(ready.pop())
                return

    def stats(self) -> dict[str, Any]:
        """The server's pools, by kernelspec (tenants' templates' are theirs to see)."""
        return {name: self.stats_of(name) for name in self.sizes if isinstance(name, str)}

    def stats_of(self, key: PoolKey) -> dict[str, Any]:
        """A pool's target, its sandboxes ready and starting, and the creates it served
        (a kernelspec's also those it could not: a template's misses are not its own)."""
        stats = {
            "target": self.sizes.get(key, 0),
            "ready": len(self.ready.get(key, ())),
            "starting": self.starting[key],
        }
        if isinstance(key, TemplateKey):
            return {**stats, "hits": self.served[key]}
        return {**stats, "hits": self.claims[(key, "hit")], "misses": self.claims[(key, "miss")]}


def _same_box(session: Session, pooled: Session) -> bool:
    """Whether the container limits match (the rest of the limits are the gateway's own)."""
    a, b = session.limits, pooled.limits
    return (a.memory, a.cpus, a.pids) == (b.memory, b.cpus, b.pids)
