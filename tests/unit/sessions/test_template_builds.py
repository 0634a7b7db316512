"""Tenants' templates: versions, lookups within a tenant, failed builds, deletes, bounds.

The engine is faked at its boundary (``TemplateEngine.build``/``remove``); the
store is the real SQLite one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import docker.errors
import pytest

from gateway.errors import (
    BadRequest,
    Conflict,
    NotAllowed,
    Overloaded,
    PayloadTooLarge,
    QuotaExceeded,
)
from gateway.sandbox.images import ImageBuilder
from gateway.sandbox.kernelspecs import KernelSpecs
from gateway.sandbox.templates import BuildFailed, BuildLimits
from gateway.sessions.requests import CreateSession
from gateway.sessions.template_files import UploadedSets
from gateway.sessions.templates import (
    LOG_BYTES,
    MAX_KEPT,
    UPLOADS_KEPT,
    BuildBounds,
    BuildLog,
    TemplateNotFound,
    Templates,
)
from gateway.store.sqlite import SQLiteStore

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"
PY = "FROM sbx/python\nRUN pip install nothing\n"


class FakeImages(ImageBuilder):
    """Tags from the real image directories; every kernel image counts as built."""

    def __init__(self) -> None:
        super().__init__(None, GATEWAY / "images")  # type: ignore[arg-type]

    def exists(self, ref: str) -> bool:
        return True


class FakeEngine:
    def __init__(self) -> None:
        self.limits = BuildLimits()
        self.built: list[tuple[str, str, str, str]] = []
        self.removed: list[str] = []
        self.fail: BuildFailed | None = None
        self.hold = threading.Event()
        self.hold.set()
        self.threads: set[str] = set()
        self.ids: dict[str, str | None] = {}  # an image's id by its tag (None: gone); else the tag
        self.forged: dict[str, list[str]] = {}  # an image's labels named as the gateway's

    def image_id(self, ref: str) -> str | None:
        return self.ids.get(ref, ref)

    def own_labels(self, ref: str) -> list[str]:
        return self.forged.get(ref, [])

    def build(self, tag, dockerfile, context, kernel_image, user, log, refusal=None) -> str:
        self.threads.add(threading.current_thread().name)
        self.hold.wait(10)
        log("Step 1/2 : FROM x")
        if self.fail is not None:
            raise self.fail
        self.built.append((tag, dockerfile, kernel_image, user))
        return "sha256:1"

    def remove(self, ref: str) -> bool:
        self.removed.append(ref)
        return True

    def cancel(self) -> None:
        self.hold.set()


@pytest.fixture
def templates(tmp_path):
    made = []

    async def make(in_use=lambda image: False, bounds: BuildBounds | None = None) -> Templates:
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        kept = Templates(
            store,
            FakeEngine(),
            KernelSpecs(GATEWAY / "kernels"),
            FakeImages(),
            in_use,
            UploadedSets(tmp_path / "template-files", 1 << 30),
            bounds or BuildBounds(),
        )
        await kept.start()
        made.append(kept)
        return kept

    return make


async def _settled(templates: Templates) -> None:
    """Until no build is under way."""
    for _ in range(1000):
        if not templates.live:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("builds did not end")


async def _upload(templates: Templates, tenant: str, name: str, files_hash: str, data: bytes):
    """A file set uploaded as E2B's builder sends one: declared, streamed, put in place."""
    upload = await templates.open_upload(tenant, name, files_hash, len(data))
    await upload.write(data)
    await upload.finish(True)


async def _built(templates: Templates, tenant: str, name: str, dockerfile: str = PY) -> dict:
    doc = await templates.build(tenant, name, dockerfile)
    assert doc["status"] == "building"
    await _settled(templates)
    return (await templates.versions(tenant, name))[0]


def test_each_build_is_a_new_version_and_the_name_resolves_to_the_newest_ready(templates):
    async def scenario():
        t = await templates()
        one = await _built(t, "alice", "geo")
        two = await _built(t, "alice", "geo")
        assert (one["version"], two["version"]) == (1, 2)
        assert two["status"] == "ready" and two["kernel"] == "python3"
        assert two["logs"] == ["Step 1/2 : FROM x"]
        assert (await t.resolve("alice", "geo"))["version"] == 2
        assert (await t.resolve("alice", "geo:1"))["image"] == one["image"]
        assert one["image"].startswith("sbxt/") and "alice" not in one["image"]
        tag, dockerfile, kernel_image, user = t.engine.built[0]
        assert dockerfile.startswith("FROM sbx/python:") and kernel_image.startswith("sbx/python:")
        assert user == "1000:1000"
        request = await t.session_request(CreateSession(template="geo:1"), "alice")
        assert (request.kernel, request.image, request.template) == ("python3", tag, None)

    asyncio.run(scenario())


def test_a_template_builds_from_the_tenants_own_template_and_keeps_its_kernel(templates):
    async def scenario():
        t = await templates()
        await t.build("alice", "r-base", "FROM sbx/r\n")
        await _settled(t)
        derived = await _built(t, "alice", "r-more", "FROM r-base\nRUN true\n")
        assert derived["kernel"] == "ir" and derived["base"] == "r-base"
        with pytest.raises(BadRequest, match="no base 'r-base'"):
            await t.build("bob", "mine", "FROM r-base\n")  # another tenant's name is no base

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "name", ["..", "a/../b", "a\x00b", "x" * 10_000, "Geo", "-geo", "geo-", "a--b", ""]
)
def test_bad_names_get_a_clear_400(templates, name):
    async def scenario():
        t = await templates()
        with pytest.raises(BadRequest) as refused:
            await t.build("alice", name, PY)
        assert refused.value.status == 400
        assert len(refused.value.message) < 400
        with pytest.raises(BadRequest):
            await t.resolve("alice", name)

    asyncio.run(scenario())


def test_another_tenants_template_is_a_404_like_one_nobody_has(templates):
    async def scenario():
        t = await templates()
        await _built(t, "alice", "geo")
        with pytest.raises(TemplateNotFound) as theirs:
            await t.resolve("bob", "geo")
        with pytest.raises(TemplateNotFound) as nobodys:
            await t.resolve("bob", "nobody")
        assert theirs.value.status == 404
        assert theirs.value.message.replace("geo", "X") == nobodys.value.message.replace(
            "nobody", "X"
        )
        assert await t.list("bob") == []
        with pytest.raises(TemplateNotFound):
            await t.delete("bob", "geo")
        assert (await t.resolve("alice", "geo"))["status"] == "ready"

    asyncio.run(scenario())


def test_a_failed_build_says_which_step_failed_and_why_and_is_never_resolved(templates):
    async def scenario():
        t = await templates()
        t.engine.fail = BuildFailed(
            "step 2 (RUN pip install nothing)", "returned a non-zero code: 1"
        )
        failed = await _built(t, "alice", "geo")
        assert failed["status"] == "failed"
        assert failed["error"] == {
            "step": "step 2 (RUN pip install nothing)",
            "reason": "returned a non-zero code: 1",
        }
        with pytest.raises(Conflict, match="no ready version"):
            await t.resolve("alice", "geo")
        with pytest.raises(Conflict, match="failed"):
            await t.resolve("alice", "geo:1")

    asyncio.run(scenario())


def test_delete_removes_images_once_no_session_uses_them(templates):
    async def scenario():
        used: set[str] = set()
        t = await templates(in_use=used.__contains__)
        one = await _built(t, "alice", "geo")
        two = await _built(t, "alice", "geo")
        used.add(one["image"])
        assert await t.delete("alice", "geo") == 2
        assert t.engine.removed == [two["image"]]
        with pytest.raises(TemplateNotFound):
            await t.resolve("alice", "geo")
        used.clear()
        await t.sweep()
        assert t.engine.removed == [two["image"], one["image"]]
        assert await t.store.templates_in_status("deleted") == []

    asyncio.run(scenario())


def test_builds_are_bounded_per_tenant_and_run_off_the_loop_while_it_answers(templates):
    async def scenario():
        t = await templates(bounds=BuildBounds(running=1, waiting=4, per_tenant=2))
        t.engine.hold.clear()
        await t.build("alice", "a", PY)
        await t.build("alice", "b", PY)
        with pytest.raises(Overloaded, match="2 of your template builds"):
            await t.build("alice", "c", PY)
        other = await t.build("bob", "c", PY)  # another tenant still builds
        with pytest.raises(Conflict, match="building"):
            await t.delete("alice", "a")
        # The loop keeps answering while a build holds its thread.
        started = time.monotonic()
        for _ in range(20):
            await asyncio.sleep(0.005)
        assert time.monotonic() - started < 0.5
        assert (await t.versions("bob", "c"))[0]["status"] == "building"
        t.engine.hold.set()
        await _settled(t)
        assert (await t.resolve("bob", "c"))["id"] == other["id"]
        assert t.engine.threads == {"sbx-template-build_0"}

    asyncio.run(scenario())


def test_a_build_a_stopped_gateway_cut_short_is_failed_at_the_next_start(templates):
    async def scenario():
        t = await templates()
        t.engine.hold.clear()
        doc = await t.build("alice", "geo", PY)
        fresh = Templates(t.store, t.engine, t.kernelspecs, t.images, lambda image: False, t.files)
        await fresh.start()
        (found,) = await fresh.versions("alice", "geo")
        assert (
            found["status"] == "failed" and "stopped during the build" in found["error"]["reason"]
        )
        assert found["id"] == doc["id"]
        t.engine.hold.set()

    asyncio.run(scenario())


def test_a_ready_template_whose_image_carries_the_gateways_labels_is_failed_at_a_start(templates):
    """Made before builds checked an image's labels (a LABEL key of variables passed the line
    check): a sandbox inherits them, and the gateway and ``sbx gc`` find containers by
    theirs. Such a version is failed, saying to build it again; the others stay ready."""

    async def scenario():
        t = await templates()
        forged, kept = await _built(t, "alice", "geo"), await _built(t, "alice", "roads")
        t.engine.forged[forged["image"]] = ["sbx.session", "sbx.tool-server"]
        fresh = Templates(t.store, t.engine, t.kernelspecs, t.images, lambda image: False, t.files)
        await fresh.start()
        (found,) = await fresh.versions("alice", "geo")
        assert found["status"] == "failed", found
        assert "sbx.session" in found["error"]["reason"] and "again" in found["error"]["reason"]
        assert (await fresh.versions("alice", "roads"))[0]["status"] == "ready"
        with pytest.raises(Conflict):
            await fresh.resolve("alice", "geo:1")
        assert kept["status"] == "ready"

    asyncio.run(scenario())


def test_an_engine_error_reading_one_images_labels_does_not_stop_a_start(templates):
    """The check of ready templates' labels runs at each start: a daemon timeout on one
    image raised out of the start, and the gateway did not come up."""

    async def scenario():
        t = await templates()
        await _built(t, "alice", "geo")
        forged = await _built(t, "bob", "roads")
        t.engine.forged[forged["image"]] = ["sbx.session"]

        def own_labels(ref: str) -> list[str]:
            if ref != forged["image"]:
                raise docker.errors.APIError("500 Server Error: context deadline exceeded")
            return ["sbx.session"]

        t.engine.own_labels = own_labels
        fresh = Templates(t.store, t.engine, t.kernelspecs, t.images, lambda image: False, t.files)
        await fresh.start()
        assert (await fresh.versions("alice", "geo"))[0]["status"] == "ready"
        assert (await fresh.versions("bob", "roads"))[0]["status"] == "failed"

    asyncio.run(scenario())


def test_a_build_id_another_tenant_chose_reaches_none_of_their_builds(templates):
    """E2B's builder names its build; a tenant naming another's id must not reach it."""

    async def scenario():
        t = await templates()
        _, chosen, _ = t.request_build("alice", "geo", [])
        await _upload(t, "alice", "geo", "d" * 64, b"")
        alice = await t.build_uploaded("alice", "geo", PY, [], chosen)
        await _settled(t)
        with pytest.raises(TemplateNotFound, match="not requested"):
            await t.build_uploaded("bob", "geo", PY, [], chosen)
        mine = await t.build_of("alice", "geo", chosen)
        assert (mine["tenant"], mine["id"], mine["status"]) == ("alice", alice["id"], "ready")
        with pytest.raises(TemplateNotFound):
            await t.build_of("bob", "geo", chosen)
        with pytest.raises(TemplateNotFound, match="not requested"):
            await t.build_uploaded("alice", "geo", PY, [], chosen)

    asyncio.run(scenario())


def test_a_tenant_keeps_a_bounded_number_of_builds(templates):
    """Each kept version is an image on the host's disk: a tenant cannot fill it with them."""

    async def scenario():
        t = await templates()
        for _ in range(MAX_KEPT):
            await _built(t, "alice", "geo")
        with pytest.raises(QuotaExceeded, match=f"{MAX_KEPT} template builds"):
            await t.build("alice", "geo", PY)
        await _built(t, "bob", "geo")  # another tenant's are its own
        await t.delete("alice", "geo")
        await _built(t, "alice", "geo")

    asyncio.run(scenario())


def test_e2b_uploads_are_bounded_per_tenant_and_abandoned_ones_expire(templates):
    async def scenario():
        t = await templates()
        t.engine.limits = BuildLimits(context=10_000)
        await _upload(t, "alice", "a", "1" * 64, b"x" * 6000)
        with pytest.raises(PayloadTooLarge, match="would pass"):
            await _upload(t, "alice", "b", "2" * 64, b"x" * 6000)  # another name, the same tenant
        await _upload(t, "bob", "a", "1" * 64, b"x" * 6000)
        later = time.time() + UPLOADS_KEPT + 1
        t.files.clock = lambda: later
        await _upload(t, "alice", "b", "2" * 64, b"x" * 6000)  # alice's first set expired
        assert not t.uploaded("alice", "a", "1" * 64)

    asyncio.run(scenario())


def test_two_gateways_on_one_engine_never_name_one_image(templates, tmp_path):
    """Each has its own data dir, so the same tenants, names and versions."""

    async def scenario():
        first = await _built(await templates(), "alice", "geo")
        store = SQLiteStore(tmp_path / "other.sqlite3")
        await store.open()
        other = Templates(
            store, FakeEngine(), KernelSpecs(GATEWAY / "kernels"), FakeImages(), lambda i: False,
            UploadedSets(tmp_path / "other-files", 1 << 30),
        )  # fmt: skip
        second = await _built(other, "alice", "geo")
        assert first["version"] == second["version"] == 1
        assert first["image"] != second["image"]

    asyncio.run(scenario())


def test_a_builds_log_is_kept_bounded_in_bytes(templates):
    """32 kept builds of 2,000 lines of 4 KiB would be 256 MiB read at every listing."""

    async def scenario():
        t = await templates()
        build = t.engine.build

        def chatty(tag, dockerfile, context, kernel_image, user, log, refusal=None):
            for n in range(5000):
                log(f"{n:05d} " + "x" * 4000)
            return build(tag, dockerfile, context, kernel_image, user, log)

        t.engine.build = chatty
        doc = await _built(t, "alice", "geo")
        assert sum(map(len, doc["logs"])) <= LOG_BYTES
        assert doc["logs"][-1] == "Step 1/2 : FROM x"  # the newest lines are kept

    asyncio.run(scenario())


def test_a_placement_whose_sessions_run_elsewhere_refuses_templates_saying_why(tmp_path):
    async def scenario():
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        why = "the swarm placement runs sessions on other nodes"
        t = Templates(
            store, FakeEngine(), KernelSpecs(GATEWAY / "kernels"), FakeImages(),
            lambda image: False, UploadedSets(tmp_path / "files", 1 << 30), unavailable=why,
        )  # fmt: skip
        with pytest.raises(NotAllowed, match=why):
            await t.build("alice", "geo", PY)
        with pytest.raises(NotAllowed, match=why):
            await t.session_request(CreateSession(template="geo"), "alice")

    asyncio.run(scenario())


def test_a_log_of_tiny_lines_keeps_few_of_them_as_each_costs_a_listing_more_than_its_text():
    log = BuildLog()
    for _ in range(LOG_BYTES):  # a step printing one character a line
        log.append("x")
    assert len(log) <= LOG_BYTES // 64  # E2B's status makes each a timestamped entry
    assert sum(map(len, log)) <= LOG_BYTES


def test_a_flood_of_build_output_reaches_the_loop_in_batches_not_a_callback_a_line(templates):
    """`RUN yes` prints without end: a callback a line on the loop every tenant shares."""

    async def scenario():
        t = await templates()
        build = t.engine.build
        loop = asyncio.get_running_loop()
        scheduled = 0
        schedule = loop.call_soon_threadsafe

        def counted(*args, **kwargs):
            nonlocal scheduled
            scheduled += 1
            return schedule(*args, **kwargs)

        def flood(tag, dockerfile, context, kernel_image, user, log, refusal=None):
            loop.call_soon_threadsafe = counted
            try:
                for _ in range(100_000):
                    log("y")
            finally:
                loop.call_soon_threadsafe = schedule
            return build(tag, dockerfile, context, kernel_image, user, log)

        t.engine.build = flood
        doc = await _built(t, "alice", "geo")
        assert doc["logs"][-1] == "Step 1/2 : FROM x" and doc["logs"][-2] == "y"
        assert scheduled < 1000, f"{scheduled} callbacks for 100,000 lines"

    asyncio.run(scenario())
