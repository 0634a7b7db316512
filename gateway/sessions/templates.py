"""Tenants' templates: images built from their Dockerfiles, versioned, started by name.

A template is a tenant's name; each build of it is a new version, and the
name resolves to the version its ``default`` tag names, else its newest ready
one (``name:3`` to one version, ``name:prod`` to the one a tag names: E2B's
tags, ``template_tags`` in the store). A build moves ``default`` unless it is
given tags of its own; a tag moves only to a ready version. Builds run in
the background on threads of their own, a bounded number at a time and a
bounded number waiting, so a build never holds the event loop or the
threads sessions' creates use; a build's log and status are read while it
runs. A template is only ever looked up within its tenant: another tenant's
name is a 404 like a name nobody has. Its image is named under ``sbxt/``,
which the ``image`` a session asks for can never name (``validation.image_ref``
takes ``sbx/`` images only), so a template is reached by its tenant alone.
Deleting a template marks its versions; their images go once no session
uses them (checked at each delete and build, and at start).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from ..errors import BadRequest, Conflict, NotAllowed, NotFound, Overloaded, QuotaExceeded
from ..sandbox.dockerfiles import resolve
from ..sandbox.images import ImageBuilder
from ..sandbox.kernelspecs import KernelSpecs
from ..sandbox.templates import BuildFailed, TemplateEngine, merge_contexts
from ..store.base import Store
from ..tasks import TaskSet
from .requests import CreateSession
from .template_files import SetUpload, UploadedSets

log = logging.getLogger(__name__)

NAME = re.compile(r"[a-z0-9]+(?:[_-][a-z0-9]+)*")
MAX_NAME = 63
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_TAG = 128
MAX_TAGS = 32  # a template holds (a request names at most half of them)
DEFAULT_TAG = "default"  # E2B's: what a bare name means, moved by a build without tags
REQUESTS_KEPT = 16  # E2B build requests of a tenant waiting for their steps
LOG_BYTES = 256 * 1024  # of a build's log kept (its last lines): read at every listing
LINE_COST = 64  # what a log line costs a listing beyond its text (E2B's timestamped entry)
MAX_KEPT = 32  # builds a tenant keeps (each ready one an image on the host's disk)
UPLOADS_KEPT = 3600.0  # seconds E2B's build requests wait for their steps
_HASH = re.compile(r"[0-9a-f]{64}")
REPO = "sbxt"  # template images: never a name a session's ``image`` may give
BUILDING, READY, FAILED, DELETED = "building", "ready", "failed", "deleted"
# What E2B's SDK builds from by default, and Debian bases, mapped onto kernel images.
ALIASES = {"e2bdev/base": "python", "e2bdev/code-interpreter": "python"}


class TemplateNotFound(NotFound):
    code = "template_not_found"


def template_name(value: Any) -> str:
    """A template's name: lower-case letters and digits, single ``-`` or ``_`` between."""
    if not isinstance(value, str) or not value:
        raise BadRequest("a template needs a name, like 'geo-stack'")
    if len(value) > MAX_NAME or not NAME.fullmatch(value):
        raise BadRequest(
            f"template name {value[:80]!r}{'...' if len(value) > 80 else ''} is not valid: "
            f"use at most {MAX_NAME} lower-case letters and digits, with single '-' or '_' "
            "between them (like 'geo-stack')"
        )
    return value


def template_ref(value: Any) -> tuple[str, int | str | None]:
    """``name`` (its default), ``name:version`` (a number) or ``name:tag``."""
    if not isinstance(value, str):
        raise BadRequest(
            "template must be a template's name, like 'geo-stack', 'geo-stack:2' or 'geo-stack:v1'"
        )
    name, colon, pin = value.partition(":")
    if not colon:
        return template_name(name), None
    if not (pin.isascii() and pin.isdigit()):
        return template_name(name), template_tag(pin)
    if len(pin) > 9 or int(pin) < 1:
        raise BadRequest(f"template version {pin[:20]!r} must be a number such as 1")
    return template_name(name), int(pin)


def template_tag(value: Any) -> str:
    """A tag: never echoed when refused (it may be anything a client sent)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        raise BadRequest("a tag cannot be a number alone: 'name:3' names a version")
    if (
        not isinstance(value, str)
        or len(value) > MAX_TAG
        or not TAG.fullmatch(value)
        or ".." in value
    ):
        raise BadRequest(
            f"a tag is 1 to {MAX_TAG} letters, digits, '.', '_' or '-', starting with a letter "
            "or digit and without '..' (like 'v1.2' or 'production')"
        )
    return value


def template_tags(values: Any) -> tuple[str, ...]:
    """A list of tags, each once, in order."""
    if not isinstance(values, list | tuple):
        raise BadRequest('tags must be a list, like ["v1.2", "production"]')
    if len(values) > MAX_TAGS // 2:
        raise BadRequest(f"name at most {MAX_TAGS // 2} tags at once")
    return tuple(dict.fromkeys(template_tag(v) for v in values))


class BuildLog(collections.deque):
    """A build's last lines, ``LOG_BYTES`` of them at most; changed on the loop only."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def append(self, line: str) -> None:
        super().append(line)
        self.size += len(line) + LINE_COST
        while self.size > LOG_BYTES and len(self) > 1:
            self.size -= len(self.popleft()) + LINE_COST


class Base(NamedTuple):
    """An image a template may build from: the kernel image it descends from, its kernel."""

    image: str
    image_dir: str  # the kernel image directory (gateway/images/<dir>) at its root
    kernel: str | None  # a template's kernel (None: a kernel image's, chosen by the build)


@dataclasses.dataclass(frozen=True)
class BuildBounds:
    """How many builds run at once (each on its own thread), and how many may wait."""

    running: int = 1
    waiting: int = 4
    per_tenant: int = 2  # running and waiting, of one tenant


class Templates:
    """Builds, lists, inspects, resolves and deletes tenants' templates."""

    def __init__(
        self,
        store: Store,
        engine: TemplateEngine,
        kernelspecs: KernelSpecs,
        images: ImageBuilder,
        in_use: Callable[[str], bool],
        files: UploadedSets,
        bounds: BuildBounds = BuildBounds(),
        unavailable: str | None = None,
        package_refusal: Callable[[str], Callable[[str, str], str | None]] | None = None,
    ) -> None:
        """``in_use``: whether a live session's sandbox runs an image (it is kept).

        ``files``: the file sets E2B's builder uploads for its COPY steps, on disk.

        ``package_refusal``: a tenant's package policy (why it refuses a name and
        version, or None), which holds for the packages its builds install too.

        ``unavailable``: why sessions here cannot run this host's template images
        (a placement whose sandboxes run on other nodes); None: they can.
        """
        self.store = store
        self.engine = engine
        self.kernelspecs = kernelspecs
        self.images = images
        self.in_use = in_use
        self.files = files
        self.bounds = bounds
        self.unavailable = unavailable
        self.package_refusal = package_refusal
        self.threads = concurrent.futures.ThreadPoolExecutor(
            bounds.running, thread_name_prefix="sbx-template-build"
        )
        self.slots = asyncio.Semaphore(bounds.running)
        self.live: dict[str, dict[str, Any]] = {}  # builds under way, by id: logs as they come
        # E2B's build requests, by (tenant, name, build id): their tags and when asked
        self.requested: dict[tuple[str, str, str], tuple[tuple[str, ...], float]] = {}
        self.clock = time.time
        self.tasks = TaskSet()
        self._naming = asyncio.Lock()
        # Told (tenant, name) when what a name resolves to may have moved (its pool follows).
        self.moved: list[Callable[[str, str], Awaitable[None]]] = []

    async def start(self) -> None:
        """Builds a stopped gateway cut short failed, and ready ones whose image carries the
        gateway's own labels; remove images nothing uses any more.

        With a shared store, another gateway's build is failed only once it is
        past its time bound (it would have been stopped by then).
        """
        await self.files.start()
        past = time.time() - self.engine.limits.timeout - 60
        for doc in await self.store.templates_in_status(BUILDING):
            if doc["id"] not in self.live and (not self.store.SHARED or doc["created_at"] < past):
                await self._finish(doc, FAILED, error=("", "the gateway stopped during the build"))
        await self._fail_labelled()
        await self.sweep()

    async def _fail_labelled(self) -> None:
        """Fail ready versions built before builds checked an image's labels, whose image
        carries the gateway's own: a sandbox would inherit them. Read a few at a time (the
        default executor's threads); an image the engine cannot answer for is checked at
        the next start."""
        ready = await self.store.templates_in_status(READY)
        found = await asyncio.gather(
            *(asyncio.to_thread(self.engine.own_labels, doc["image"]) for doc in ready),
            return_exceptions=True,
        )
        for doc, own in zip(ready, found, strict=True):
            if isinstance(own, BaseException):
                log.warning("could not read the labels of template image %s: %s", doc["image"], own)
            elif own:
                why = (f"its image carries labels named as the gateway's own ({', '.join(own)}), "
                       "made before builds checked them; build the template again")  # fmt: skip
                await self._finish(doc, FAILED, error=("", why))

    async def stop(self) -> None:
        """Stop the builds under way (else the process waits for them at its exit)."""
        self.engine.cancel()
        await self.tasks.cancel(5.0)
        self.threads.shutdown(wait=False, cancel_futures=True)

    async def build(
        self,
        tenant: str,
        name: str,
        dockerfile: Any,
        context: bytes | None = None,
        kernel: str | None = None,
        tags: tuple[str, ...] = (),
        build_id: str | None = None,
    ) -> dict[str, Any]:
        """Start building a new version of ``name``; return its record (status building).

        ``build_id``: the id E2B's builder was handed before the build started.
        ``tags``: what the version is tagged once ready (none: it moves ``default``).
        """
        template_name(name)
        tags = template_tags(tags)
        self._check_here()
        if not isinstance(dockerfile, str) or not dockerfile.strip():
            raise BadRequest("dockerfile must be the Dockerfile's text")
        if context is not None and len(context) > self.engine.limits.context:
            raise BadRequest(
                f"the build context is larger than {self.engine.limits.context >> 20} MiB; "
                "send only what the Dockerfile copies"
            )
        bases = await self._bases(tenant)
        # Each FROM names its base's image id: a tag gone before the build runs (a base
        # template deleted meanwhile) would be pulled, by the daemon, from the registry.
        text, root = await asyncio.to_thread(
            resolve,
            dockerfile,
            lambda n: self.engine.image_id(bases[n].image) if n in bases else None,
            sorted(bases),
        )
        kernel = self._kernel(kernel, bases[root])
        async with self._naming:  # counted and registered at once: builds racing count each other
            await self._check_bounds(tenant)
            versions = await self.store.template_versions(tenant, name)
            if build_id is not None and any(
                d["id"] == _scoped(tenant, name, build_id) for d in versions
            ):
                raise Conflict(f"build {build_id} of template {name!r} was started before")
            version = max((d["version"] for d in versions), default=0) + 1
            key = uuid.uuid4().hex if build_id is None else _scoped(tenant, name, build_id)
            doc = {
                "id": key,
                "tenant": tenant,
                "name": name,
                "version": version,
                "status": BUILDING,
                "created_at": time.time(),
                "finished_at": None,
                "kernel": kernel,
                "base": root,
                # The build's id in the tag: another gateway on this engine (a data dir of
                # its own) has the same tenants' names and versions, never the same build.
                "image": f"{REPO}/{_tenant_key(tenant)}-{name}:{version}-{key[:12]}",
                "tags": list(tags),  # once ready; a view shows the tags it holds
                **({"build_id": build_id} if build_id is not None else {}),
                "logs": [],
                "error": None,
            }
            self.live[doc["id"]] = doc
            await self.store.save_template(doc)
        self.tasks.spawn(self._run(doc, text, context))
        return doc

    async def _check_bounds(self, tenant: str) -> None:
        """The builds a tenant keeps, and those under way: its own and the gateway's."""
        kept = await self.store.templates_of_tenant(tenant)
        if sum(d["status"] != DELETED for d in kept) >= MAX_KEPT:
            raise QuotaExceeded(
                f"you keep {MAX_KEPT} template builds, the most a tenant may; delete templates "
                "you no longer use (DELETE /v1/templates/NAME) and build again"
            )
        mine = [d for d in self.live.values() if d["tenant"] == tenant]
        if len(mine) >= self.bounds.per_tenant:
            raise Overloaded(
                f"{len(mine)} of your template builds are under way; retry once one ends"
            )
        if len(self.live) >= self.bounds.running + self.bounds.waiting:
            raise Overloaded("the gateway's template builds are all busy; retry in a minute")

    def _check_here(self) -> None:
        if self.unavailable is not None:
            raise NotAllowed(f"templates are not offered here: {self.unavailable}")

    def uploaded(self, tenant: str, name: str, files_hash: str) -> bool:
        """Whether E2B's builder already uploaded this file set for a build of ``name``."""
        return self.files.present(_tenant_key(tenant), name, files_hash)

    async def open_upload(
        self, tenant: str, name: str, files_hash: str, declared: int | None
    ) -> SetUpload:
        """Start the upload of a file set (a tar) E2B's builder sends for a COPY.

        Written to disk as it comes (``template_files.py``), ``declared`` bytes
        (None: up to what the tenant has left of its bound, the context bound).
        """
        template_name(name)
        if not _HASH.fullmatch(files_hash):
            raise BadRequest("a file set is named by its SHA-256, 64 hex digits")
        return await self.files.open(
            _tenant_key(tenant), name, files_hash, declared, self.engine.limits.context
        )

    def request_build(self, tenant: str, ref: str, tags: Any) -> tuple[str, str, tuple[str, ...]]:
        """E2B's build request (``name`` or ``name:tag``, and more tags): name, build id, tags.

        Its tags wait, in memory, for the build's steps (``build_uploaded``): an
        hour at most, and a tenant's newest ``REQUESTS_KEPT`` (older ones go).
        """
        name, pin = template_ref(ref)
        if isinstance(pin, int):
            raise BadRequest("a build makes a new version: name the template, or name:tag")
        tags = template_tags(([pin] if pin else []) + list(template_tags(tags or [])))
        now = self.clock()
        self.requested = {k: v for k, v in self.requested.items() if now - v[1] <= UPLOADS_KEPT}
        mine = sorted((v[1], k) for k, v in self.requested.items() if k[0] == tenant)
        for _, key in mine[: max(0, len(mine) + 1 - REQUESTS_KEPT)]:
            del self.requested[key]
        build_id = uuid.uuid4().hex
        self.requested[(tenant, name, build_id)] = (tags, now)
        return name, build_id, tags

    async def build_uploaded(
        self, tenant: str, name: str, dockerfile: str, hashes: list[str], build_id: str
    ) -> dict[str, Any]:
        """The build E2B requested, whose context is the file sets uploaded for it by hash."""
        asked = self.requested.get((tenant, name, build_id))
        if asked is None:
            raise TemplateNotFound(
                f"build {build_id} of template {name!r} was not requested here, or over an hour "
                "ago: call Template.build again"
            )
        kept = await self.files.take(_tenant_key(tenant), name, hashes)  # gone, built or not
        missing = [h for h in hashes if h not in kept]
        if missing:
            raise BadRequest(
                f"the files of a COPY step were not uploaded (set {missing[0][:12]}), or waited "
                "over an hour, or went with a build asked for before: call Template.build again"
            )
        limits = self.engine.limits
        parts = {h: kept[h] for h in hashes}
        context = await asyncio.to_thread(merge_contexts, parts, limits) if parts else None
        doc = await self.build(tenant, name, dockerfile, context, tags=asked[0], build_id=build_id)
        self.requested.pop((tenant, name, build_id), None)
        return doc

    async def _bases(self, tenant: str) -> dict[str, Base]:
        """What a tenant may build from, by the name a ``FROM`` gives it."""
        specs = self.kernelspecs
        dirs = sorted({specs.sandbox(k).get("image", k) for k in specs.names()})
        tags = {d: self.images.tag_for(d) for d in dirs}
        built = await asyncio.to_thread(lambda: [d for d in dirs if self.images.exists(tags[d])])
        bases: dict[str, Base] = {}
        for d in built:
            for alias in (f"sbx/{d}", f"sbx/{d}:latest", tags[d]):
                bases[alias] = Base(tags[d], d, None)
        bases.update({a: Base(tags[d], d, None) for a, d in ALIASES.items() if d in built})
        for doc in await self.list(tenant):
            if doc["status"] == READY:
                base = Base(doc["image"], specs.sandbox(doc["kernel"]).get("image"), doc["kernel"])
                for pin in (doc["version"], *doc["tags"]):
                    bases[f"{doc['name']}:{pin}"] = base
                if DEFAULT_TAG in doc["tags"]:  # the bare name: its default, else its newest
                    bases[doc["name"]] = base
                bases.setdefault(doc["name"], base)
        return bases

    def _kernel(self, asked: str | None, root: Base) -> str:
        """The kernel a template runs: asked for, its base template's, or its image's default."""
        specs = self.kernelspecs
        offered = [k for k in specs.names() if specs.sandbox(k).get("image", k) == root.image_dir]
        if asked is not None:
            if asked not in offered:
                raise BadRequest(
                    f"kernel {asked!r} does not run in a template built from the "
                    f"{root.image_dir} image; its kernels: {', '.join(offered)}"
                )
            return asked
        if root.kernel is not None:
            return root.kernel
        return specs.default if specs.default in offered else offered[0]

    async def _run(self, doc: dict[str, Any], dockerfile: str, context: bytes | None) -> None:
        lines = doc["logs"] = BuildLog()
        user = self.kernelspecs.sandbox(doc["kernel"]).get("user", "1000:1000")
        kernel_image = self.images.tag_for(
            self.kernelspecs.sandbox(doc["kernel"]).get("image", doc["kernel"])
        )
        loop = asyncio.get_running_loop()
        # Lines gather on the build's thread (as bounded as the log) and reach the loop in
        # batches, one callback waiting at a time: a step printing without end (`RUN yes`)
        # costs the loop every tenant shares a callback per batch, not per line.
        pending, guard, flushing = BuildLog(), threading.Lock(), False

        def flush() -> None:
            nonlocal pending, flushing
            with guard:
                batch, pending, flushing = pending, BuildLog(), False
            for line in batch:
                lines.append(line)

        def said(line: str) -> None:  # on the build's thread: the log is the loop's to change
            nonlocal flushing
            with guard:
                pending.append(line)
                if flushing:
                    return
                flushing = True
            loop.call_soon_threadsafe(flush)

        try:
            async with self.slots:
                await loop.run_in_executor(
                    self.threads,
                    self.engine.build,
                    doc["image"],
                    dockerfile,
                    context,
                    kernel_image,
                    user,
                    said,
                    self.package_refusal(doc["tenant"]) if self.package_refusal else None,
                )
        except BuildFailed as e:
            await self._finish(doc, FAILED, error=(e.step, e.reason))
        except Exception as e:  # the engine's own failure: the build failed, the gateway goes on
            log.warning("template build %s failed: %s", doc["id"], e)
            await self._finish(doc, FAILED, error=("", f"the container engine failed: {e}"))
        else:
            await self._finish(doc, READY)
            await self._tag_built(doc)
            await self._moved(doc["tenant"], doc["name"])
        await self.sweep()

    async def _moved(self, tenant: str, name: str) -> None:
        for listener in self.moved:
            try:
                await listener(tenant, name)
            except Exception:  # the build or delete stands; its pool catches up at a restart
                log.exception("template %s of %s moved; a listener failed", name, tenant)

    async def _tag_built(self, doc: dict[str, Any]) -> None:
        """A ready build takes its tags (none asked: ``default`` moves to it)."""
        tags = list(doc["tags"]) or [DEFAULT_TAG]
        done = await self.store.tag_template(
            doc["id"], doc["tenant"], doc["name"], tags, time.time(), MAX_TAGS
        )
        if done is not None:  # deleted meanwhile, or its template's tags filled meanwhile
            log.warning("template build %s was not tagged: %s", doc["id"], done)

    async def _finish(
        self, doc: dict[str, Any], status: str, error: tuple[str, str] | None = None
    ) -> None:
        doc.update(
            status=status,
            finished_at=time.time(),
            logs=list(doc["logs"]),
            error=None if error is None else {"step": error[0], "reason": error[1]},
        )
        try:
            await self.store.save_template(doc)
        finally:
            self.live.pop(doc["id"], None)

    async def versions(self, tenant: str, name: str) -> list[dict[str, Any]]:
        """Every build of a tenant's template, newest first (a 404 when it has none)."""
        template_name(name)
        docs = [
            self.live.get(d["id"], d)
            for d in await self.store.template_versions(tenant, name)
            if d["status"] != DELETED
        ]
        if not docs:
            raise TemplateNotFound(f"you have no template {name!r}; GET /v1/templates lists yours")
        return await self._tagged(tenant, name, docs)

    async def _tagged(
        self, tenant: str, name: str | None, docs: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Builds' records as views: each with the tags it holds now."""
        held: dict[str, list[str]] = {}
        for row in await self.store.template_tags(tenant, name):
            held.setdefault(row["build"], []).append(row["tag"])
        return [dict(d, tags=held.get(d["id"], [])) for d in docs]

    async def build_of(self, tenant: str, name: str, build_id: str) -> dict[str, Any]:
        """The build E2B's builder knows by ``build_id`` (its own id, scoped to the tenant)."""
        scoped = _scoped(tenant, name, build_id)
        for doc in await self.versions(tenant, name):
            if doc["id"] == scoped:
                return doc
        raise TemplateNotFound(f"template {name!r} has no build {build_id}")

    async def list(self, tenant: str) -> list[dict[str, Any]]:
        """A tenant's templates' builds, newest first per name."""
        docs = await self.store.templates_of_tenant(tenant)
        kept = [self.live.get(d["id"], d) for d in docs if d["status"] != DELETED]
        return await self._tagged(tenant, None, kept)

    async def resolve(self, tenant: str, ref: str) -> dict[str, Any]:
        """The ready build ``ref`` names: ``name`` (its default, else its newest ready),
        ``name:version``, ``name:tag`` or ``name:build-id`` (E2B's, or ``id``)."""
        name, version = template_ref(ref)
        docs = await self.versions(tenant, name)
        if not isinstance(version, int):
            tag = version or DEFAULT_TAG
            build = tag.replace("-", "").lower()
            found = next((d for d in docs if tag in d["tags"]), None) or next(
                (d for d in docs if build in (d["id"], d.get("build_id"))), None
            )
            if found is not None and found["status"] != READY:
                raise Conflict(f"template {name}:{tag} is {found['status']}, not ready")
            if found is not None:
                return found
            if version is not None:
                raise TemplateNotFound(f"template {name!r} has no tag {tag!r}")
            ready = [d for d in docs if d["status"] == READY]
            if not ready:
                raise Conflict(
                    f"template {name!r} has no ready version yet "
                    f"(newest: {docs[0]['version']}, {docs[0]['status']})"
                )
            return ready[0]
        found = next((d for d in docs if d["version"] == version), None)
        if found is None:
            raise TemplateNotFound(f"template {name!r} has no version {version}")
        if found["status"] != READY:
            raise Conflict(f"template {name}:{version} is {found['status']}, not ready")
        return found

    async def session_request(self, request: CreateSession, tenant: str) -> CreateSession:
        """A create request naming a template, as the kernel and image it runs."""
        assert request.template is not None
        self._check_here()
        doc = await self.resolve(tenant, request.template)
        if request.image is not None:
            raise BadRequest("name a template or an image, not both")
        return dataclasses.replace(request, kernel=doc["kernel"], image=doc["image"], template=None)

    async def delete(self, tenant: str, name: str) -> int:
        """Delete every version of a tenant's template; return how many there were."""
        docs = await self.versions(tenant, name)
        if any(d["status"] == BUILDING for d in docs):
            raise Conflict(f"template {name!r} is building; delete it once the build ends")
        for doc in docs:
            doc.update(status=DELETED)
            await self.store.save_template(doc)
        await self.store.untag_template(tenant, name, None)
        await self._moved(tenant, name)
        await self.sweep()
        return len(docs)

    async def assign(
        self, tenant: str, target: str, tags: Any
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Move ``tags`` to the ready version ``target`` names (``name:version``, ``name:tag``)."""
        tags = template_tags(tags)
        if not tags:
            raise BadRequest('name the tags to assign, like ["production"]')
        doc = await self.resolve(tenant, target)
        name = doc["name"]
        done = await self.store.tag_template(
            doc["id"], tenant, name, list(tags), time.time(), MAX_TAGS
        )
        if done == "full":
            raise QuotaExceeded(
                f"a template holds at most {MAX_TAGS} tags; remove some first "
                f"(DELETE /v1/templates/{name}/tags)"
            )
        if done is not None:
            raise TemplateNotFound(f"template {name}:{doc['version']} was deleted meanwhile")
        await self._moved(tenant, name)  # ``default`` may name another version now
        return doc, tags

    async def remove(self, tenant: str, name: str, tags: Any) -> None:
        """Remove tags from a template (every one of them must be there); its versions stay."""
        tags = template_tags(tags)
        if not tags:
            raise BadRequest('name the tags to remove, like ["production"]')
        held = {t for d in await self.versions(tenant, name) for t in d["tags"]}
        missing = [t for t in tags if t not in held]
        if missing:
            raise TemplateNotFound(f"template {name!r} has no tag {missing[0]!r}")
        await self.store.untag_template(tenant, name, list(tags))
        await self._moved(tenant, name)

    async def tags(self, tenant: str, name: str) -> list[dict[str, Any]]:
        """A template's tags: each with its version, build id and when it was assigned."""
        docs = {d["id"]: d for d in await self.versions(tenant, name)}
        return [
            {
                "tag": row["tag"],
                "version": docs[row["build"]]["version"],
                "build_id": docs[row["build"]].get("build_id", row["build"]),
                "created_at": row["created_at"],
            }
            for row in await self.store.template_tags(tenant, name)
            if row["build"] in docs
        ]

    async def sweep(self) -> None:
        """Remove the images of deleted versions no session uses, and then their records."""
        for doc in await self.store.templates_in_status(DELETED):
            if self.in_use(doc["image"]):
                continue
            if await asyncio.to_thread(self.engine.remove, doc["image"]):
                await self.store.delete_template_version(doc["id"])


def _scoped(tenant: str, name: str, build_id: str) -> str:
    """A build id a client chose, as one no other tenant or template can reach."""
    return hashlib.sha256(f"{tenant}\0{name}\0{build_id}".encode()).hexdigest()[:32]


def _tenant_key(tenant: str) -> str:
    """A tenant's part of its templates' image names: fixed length, lower-case, no name leaks."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]
