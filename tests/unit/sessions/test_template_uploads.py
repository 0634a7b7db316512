"""E2B's uploaded COPY file sets: on disk, each tenant's within its own bound, never another's.

The engine and store are those of test_template_builds (a fake engine, real SQLite).
"""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import time

import pytest
from test_template_builds import PY, _settled, _upload, templates  # noqa: F401 (its fixture)

from gateway.errors import BadRequest, PayloadTooLarge, Unavailable
from gateway.sandbox.templates import BuildLimits
from gateway.sessions.template_files import BLOCK, _file_name, _Set

BOUND = 100_000


@pytest.fixture
def bounded(templates):  # noqa: F811 (the fixture imported above)
    """Templates whose tenants' uploads are bounded by ``BOUND`` bytes each."""

    async def make():
        t = await templates()
        t.engine.limits = BuildLimits(context=BOUND)
        return t

    return make


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"a"))
    return out.getvalue()


def _on_disk(t) -> list[str]:
    return sorted(os.listdir(t.files.root))


def test_tenants_filling_their_own_bounds_never_refuse_another_tenants_upload(bounded):
    """A few tenants uploading up to their own bound and never building took the shared
    bound (twice a tenant's, checked before the new set): every other tenant's uploads
    were a 503 for an hour."""

    async def scenario():
        t = await bounded()
        t.files.total = 2 * BOUND  # today's shared bound, full after two tenants
        for tenant in ("alice", "bob", "carol"):
            await _upload(t, tenant, "geo", "1" * 64, b"x" * BOUND)
        await _upload(t, "dave", "geo", "2" * 64, b"x" * 100)
        assert t.uploaded("dave", "geo", "2" * 64)
        assert sum(s.cost for s in t.files.held.values()) <= t.files.total
        assert len(_on_disk(t)) == len(t.files.held) == 2

    asyncio.run(scenario())


def test_room_is_made_from_the_oldest_sets_of_the_tenant_holding_the_most(bounded):
    async def scenario():
        t = await bounded()
        t.files.total = BOUND + BOUND // 4
        await _upload(t, "alice", "geo", "1" * 64, b"x" * (BOUND // 2))
        await _upload(t, "bob", "geo", "1" * 64, b"x" * (BOUND // 4))
        await _upload(t, "alice", "geo", "2" * 64, b"x" * (BOUND // 2))
        await _upload(t, "carol", "geo", "1" * 64, b"x" * (BOUND // 4))
        assert not t.uploaded("alice", "geo", "1" * 64)  # alice's oldest
        assert t.uploaded("alice", "geo", "2" * 64) and t.uploaded("bob", "geo", "1" * 64)
        assert t.uploaded("carol", "geo", "1" * 64)

    asyncio.run(scenario())


def test_a_tenant_past_its_own_bound_gets_a_413_naming_it_and_others_go_on(bounded):
    async def scenario():
        t = await bounded()
        await _upload(t, "alice", "geo", "1" * 64, b"x" * (BOUND - BLOCK + 1))
        with pytest.raises(PayloadTooLarge, match=r"would pass 97\.7 KiB together") as refused:
            await _upload(t, "alice", "other", "2" * 64, b"x" * BLOCK)  # another name
        assert "build the templates waiting first" in str(refused.value)
        with pytest.raises(PayloadTooLarge):
            await _upload(t, "alice", "geo", "3" * 64, b"")  # an empty set costs a block too
        await _upload(t, "bob", "geo", "1" * 64, b"x" * BOUND)
        # Without a declared size, a set may take what the tenant has left; no more is read.
        upload = await t.open_upload("carol", "geo", "4" * 64, None)
        assert upload.room == BOUND
        await upload.finish(False)  # a dropped connection: its reservation goes
        assert "carol" not in {k[0] for k in t.files.held} and not t.uploaded(
            "carol", "geo", "4" * 64
        )
        assert len(_on_disk(t)) == 2  # no part left behind

    asyncio.run(scenario())


def test_a_build_asked_for_takes_its_sets_whether_it_starts_or_is_refused(bounded):
    async def scenario():
        t = await bounded()
        _, build_id, _ = t.request_build("alice", "geo", [])
        await _upload(t, "alice", "geo", "1" * 64, _tar())
        with pytest.raises(BadRequest, match="dockerfile"):
            await t.build_uploaded("alice", "geo", "", ["1" * 64], build_id)
        assert not t.uploaded("alice", "geo", "1" * 64) and _on_disk(t) == []
        await _upload(t, "alice", "geo", "2" * 64, _tar())
        await _upload(t, "alice", "geo", "3" * 64, _tar())  # not read by the build: it goes too
        await _upload(t, "alice", "other", "4" * 64, _tar())  # another template's: it stays
        await t.build_uploaded("alice", "geo", PY, ["2" * 64], build_id)
        assert _on_disk(t) == [_file_name(t.files.held.popitem()[0])]
        await _settled(t)

    asyncio.run(scenario())


def test_a_restart_removes_the_sets_left_behind_without_following_links(bounded, tmp_path):
    async def scenario():
        t = await bounded()
        await _upload(t, "alice", "geo", "1" * 64, b"x")
        outside = tmp_path / "outside"
        outside.write_text("keep")
        os.symlink(outside, t.files.root / "link")
        (t.files.root / ".part-123").write_bytes(b"half")
        fresh = await bounded()
        assert _on_disk(fresh) == [] and not fresh.uploaded("alice", "geo", "1" * 64)
        assert outside.read_text() == "keep"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("name", "files_hash"),
    [
        ("geo", "../" + "1" * 61),
        ("geo", "A" * 64),
        ("geo", "1" * 63),
        ("geo", "1" * 64 + "/x"),
        ("../etc", "1" * 64),
        ("a/b", "1" * 64),
        ("", "1" * 64),
        ("x" * 300, "1" * 64),
        ("geo\x00", "1" * 64),
    ],
)
def test_hostile_names_and_hashes_are_refused_and_write_nothing(bounded, name, files_hash):
    async def scenario():
        t = await bounded()
        with pytest.raises(BadRequest):
            await t.open_upload("alice", name, files_hash, 1)
        assert _on_disk(t) == [] and not t.files.held
        with pytest.raises(ValueError):
            _file_name(("0" * 16, name, files_hash))

    asyncio.run(scenario())


def test_room_made_from_many_tiny_sets_does_not_hold_the_event_loop(bounded):
    """A tenant leaving thousands of block-sized sets (its bound allows 16384 at 64 MiB)
    made the next upload that needed room recount every set for each one removed, on
    the event loop (and a thread hop each): minutes of a stalled gateway at full scale."""

    async def scenario():
        t = await bounded()
        tiny = 4000
        t.engine.limits = BuildLimits(context=tiny * BLOCK)
        t.files.total = tiny * BLOCK
        now = t.files.clock()
        for i in range(tiny):  # held as uploaded sets (their files need not exist)
            t.files.held[("0" * 16, "geo", f"{i:064x}")] = _Set(BLOCK, now + i, done=True)
        started = time.perf_counter()
        upload = await t.open_upload("bob", "geo", "1" * 64, tiny * BLOCK)
        assert time.perf_counter() - started < 1.0
        assert list(t.files.held) == [upload.key]
        await upload.finish(False)

    asyncio.run(scenario())


def test_room_is_never_made_from_a_tenant_holding_less_than_one_still_uploading(bounded):
    """The biggest holder's bytes all in an upload under way (not removable) made the next
    holder lose its sets, though within its bound and holding less: a tenant keeping a big
    upload open could have another's sets removed again and again."""

    async def scenario():
        t = await bounded()
        t.files.total = 2 * BOUND
        alice = await t.open_upload("alice", "geo", "1" * 64, BOUND)  # under way
        await _upload(t, "bob", "geo", "1" * 64, b"x" * (BOUND // 2))
        with pytest.raises(Unavailable, match="uploads under way"):
            await t.open_upload("carol", "geo", "1" * 64, 3 * BOUND // 4)
        assert t.uploaded("bob", "geo", "1" * 64)
        await alice.finish(False)

    asyncio.run(scenario())
