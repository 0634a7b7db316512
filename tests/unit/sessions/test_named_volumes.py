"""Named volumes without an engine: names, tenants, quotas, a full volume, mounts.

A real SQLite store and, as root, real loop-mounted ext4 images (a plain
directory elsewhere, where the ENOSPC test is skipped).
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

from gateway.access.auth import Principal, Quota
from gateway.errors import (
    BadRequest,
    Conflict,
    FileTooLarge,
    LimitExceeded,
    PathForbidden,
    QuotaExceeded,
    VolumeInUse,
    VolumeNotFound,
)
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.scan import Scanner
from gateway.sandbox import volume
from gateway.sessions.requests import CreateSession, CreateVolume, MountVolume
from gateway.sessions.volumes import MIN_SIZE, VolumeOptions, Volumes
from gateway.store.sqlite import SQLiteStore

MIB = 2**20
ACME, ZETA = Principal("acme", token_id="a"), Principal("zeta", token_id="z")
QUOTA = Quota(max_sessions=4, max_memory=2**34, max_disk=100 * MIB, max_volumes=3)
LOOPS = volume.loop_mounts_available()


def run(tmp_path: Path, scenario, quota: Quota = QUOTA) -> None:
    async def go() -> None:
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        gate = Gate(PolicyBook(tmp_path / "policies"), Scanner(), ApprovalDesk(store, 60.0, bool))
        volumes = Volumes(
            store, lambda tenant: quota, gate, VolumeOptions(tmp_path / "volumes", 32 * MIB)
        )
        try:
            await scenario(volumes, store)
        finally:
            for doc in await store.volumes_of_tenant("acme") + await store.volumes_of_tenant(
                "zeta"
            ):
                await asyncio.to_thread(volume.destroy, Path(doc["where"]))
            await store.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    "name",
    ["..", "a/../b", "a..b", "x/y", "a\x00b", "tab\there", "x" * 10_000, "", ".hidden", "-dash",
     "é", 7, None],
)  # fmt: skip
def test_a_hostile_volume_name_is_a_400_that_says_what_names_look_like(name):
    with pytest.raises(BadRequest) as caught:
        CreateVolume.from_json({"name": name})
    assert "1 to 63 letters" in caught.value.message
    assert len(caught.value.message) < 400  # a 10,000-character name is not echoed back


def test_a_mount_path_that_leaves_the_workspace_is_a_400():
    for path in ("../etc", "/etc", "a/../../b", "a\x00", ""):
        with pytest.raises(BadRequest):
            CreateSession.from_json({"volumes": [{"name": "data", "path": path}]})
    with pytest.raises(BadRequest, match="overlap"):
        CreateSession.from_json(
            {"volumes": [{"name": "a", "path": "data"}, {"name": "b", "path": "data/sub"}]}
        )
    request = CreateSession.from_json(
        {"volumes": [{"name": "data", "path": "./in//put/", "read_only": True}]}
    )
    assert request.volumes == (MountVolume("data", "in/put", True),)


def test_names_are_per_tenant_and_another_tenants_volume_is_a_404_by_name_and_by_id(tmp_path):
    async def scenario(volumes, store):
        doc = await volumes.create(ACME, CreateVolume("data", 16 * MIB))
        with pytest.raises(Conflict, match="already has a volume named 'data'"):
            await volumes.create(ACME, CreateVolume("data", 16 * MIB))
        await volumes.create(ZETA, CreateVolume("data", 16 * MIB))  # zeta's own
        for ref in ("data", doc["id"]):
            found = await volumes.get(ACME, ref)
            assert found["id"] == doc["id"]
        with pytest.raises(VolumeNotFound):
            await volumes.get(ZETA, doc["id"])
        with pytest.raises(VolumeNotFound):
            await volumes.delete(ZETA, doc["id"])
        with pytest.raises(VolumeNotFound):
            await volumes.files(ZETA, doc["id"])
        assert [v["name"] for v in await volumes.list(ZETA)] == ["data"]
        assert doc["name"] not in os.listdir(Path(doc["where"]).parent)  # dirs are ids

    run(tmp_path, scenario)


def test_sizes_and_counts_are_held_to_the_servers_bounds_and_the_tenants_quota(tmp_path):
    async def scenario(volumes, store):
        with pytest.raises(LimitExceeded):
            await volumes.create(ACME, CreateVolume("tiny", MIN_SIZE - 1))
        await volumes.create(ACME, CreateVolume("a", 60 * MIB))
        with pytest.raises(QuotaExceeded, match="disk quota"):
            await volumes.create(ACME, CreateVolume("b", 50 * MIB))
        await volumes.create(ACME, CreateVolume("b"))  # the default size, 32 MiB
        with pytest.raises(QuotaExceeded, match="keeps 2 volumes"):
            await volumes.create(ACME, CreateVolume("c", MIN_SIZE))

    run(tmp_path, scenario, Quota(max_sessions=4, max_memory=2**34, max_disk=100 * MIB,
                                  max_volumes=2))  # fmt: skip


def _fill(root: Path) -> int:
    """Write past a mounted volume's size as a sandbox would; the errno it met, then clean up."""
    assert os.path.ismount(root)
    try:
        with open(root / "big", "wb") as f:
            for _ in range(64):
                f.write(b"\0" * MIB)
                f.flush()
                os.fsync(f.fileno())
    except OSError as e:
        return e.errno
    finally:
        os.unlink(root / "big")
    return 0


@pytest.mark.skipif(not LOOPS, reason="a volume's cap needs loop mounts (root)")
def test_a_full_volume_is_enospc_to_a_writer_and_a_413_to_an_upload_never_an_error(tmp_path):
    async def scenario(volumes, store):
        doc = await volumes.create(ACME, CreateVolume("full", 16 * MIB))
        files = await volumes.files(ACME, "full")
        root = Path(doc["where"]) / "workspace"
        assert await asyncio.to_thread(_fill, root) == errno.ENOSPC  # what the kernel's code meets
        upload = await files.open_write("again")
        with pytest.raises(OSError) as caught:
            for _ in range(64):
                await upload.write(b"\1" * MIB)
        assert caught.value.errno == errno.ENOSPC
        await upload.finish(False)
        assert (await files.list(""))["entries"] == []  # nothing half-written is left

    run(tmp_path, scenario)


def test_files_follow_the_workspace_rules_without_a_session(tmp_path):
    async def scenario(volumes, store):
        doc = await volumes.create(ACME, CreateVolume("ds", 16 * MIB))
        files = await volumes.files(ACME, "ds")
        await files.save("in/data.csv", b"a,b\n1,2\n")
        listing = await files.list("in")
        assert [e["name"] for e in listing["entries"]] == ["data.csv"]
        root = Path(doc["where"]) / "workspace"
        assert (root / "in" / "data.csv").stat().st_uid == 1000  # the sandbox user's
        os.symlink("/etc", root / "link")  # as code in a sandbox could
        with pytest.raises(PathForbidden):
            await files.open_read("link/passwd")
        for bad in ("../x", "/etc/passwd", "a\x00b"):
            with pytest.raises(BadRequest):
                await files.open_read(bad)
        view = await volumes.inspect(ACME, "ds")
        assert view["used_bytes"] > 0 and view["mounted_by"] == []
        assert "where" not in view and "tenant" not in view

    run(tmp_path, scenario)


def test_readers_share_a_volume_a_writer_is_alone_and_a_mounted_volume_is_not_deleted(tmp_path):
    async def scenario(volumes, store):
        await volumes.create(ACME, CreateVolume("ds", 16 * MIB))
        caps = {"sessions": 9, "memory": 2**40, "cpus": 64.0, "disk": 2**40, "per_minute": 0}
        for sid in ("r1", "r2", "w1"):
            claim = {"session_id": sid, "tenant": "acme", "owner": "g", "memory": 1, "cpus": 0.1,
                     "disk": 1}  # fmt: skip
            assert await store.claim_quota(claim, caps, 60) is None
        mounts = await volumes.mount("r1", ACME, (MountVolume("ds", "data", True),))
        assert mounts[0].target == "data" and mounts[0].read_only
        where = Path((await volumes.get(ACME, "ds"))["where"])
        if LOOPS:  # a read-only, nosuid, nodev view: what a read-only bind keeps in the sandbox
            assert Path(mounts[0].source) == where / "read-only"
            flags = os.statvfs(mounts[0].source).f_flag
            assert flags & os.ST_RDONLY and flags & os.ST_NOSUID and flags & os.ST_NODEV
        await volumes.mount("r2", ACME, (MountVolume("ds", "in", True),))
        with pytest.raises(VolumeInUse) as caught:
            await volumes.mount("w1", ACME, (MountVolume("ds", "data", False),))
        assert "r1 (read-only)" in caught.value.message and "r2" in caught.value.message
        with pytest.raises(VolumeInUse, match="r1"):
            await volumes.delete(ACME, "ds")
        with pytest.raises(VolumeNotFound):
            await volumes.mount("w1", ZETA, (MountVolume("ds", "data", False),))
        await store.release_claim("r1")
        await store.release_claim("r2")
        writer = await volumes.mount("w1", ACME, (MountVolume("ds", "data", False),))
        assert Path(writer[0].source) == where / "workspace"
        await store.release_claim("w1")
        await volumes.delete(ACME, "ds")
        assert not await asyncio.to_thread(where.exists)  # its view unmounted with it
        with pytest.raises(VolumeNotFound):
            await volumes.get(ACME, "ds")

    run(tmp_path, scenario)


def test_uploads_to_a_volume_past_its_free_space_are_refused_up_front(tmp_path):
    """The upload edge checks the declared size against the volume as against a workspace."""
    from gateway.api.files import open_upload

    class Request:
        headers = {"Content-Length": str(10**12)}

    async def scenario(volumes, store):
        await volumes.create(ACME, CreateVolume("ds", 16 * MIB))
        files = await volumes.files(ACME, "ds")
        with pytest.raises(FileTooLarge):
            await open_upload(Request(), files, "big.bin")

    if not LOOPS:
        pytest.skip("free space is the host's without loop mounts")
    run(tmp_path, scenario)


def test_a_fork_mounts_its_sources_volumes_read_only_unless_it_names_its_own():
    from gateway.sessions.manager import _fork_request

    snapshot = {"id": "s", "kernel": "python3", "image": "img",
                "volumes": [{"name": "ds", "path": "data", "read_only": False}]}  # fmt: skip
    fork = _fork_request(CreateSession.from_json({"from_snapshot": "s"}), snapshot)
    assert fork.volumes == (MountVolume("ds", "data", read_only=True),)
    bare = _fork_request(CreateSession.from_json({"from_snapshot": "s", "volumes": []}), snapshot)
    assert bare.volumes == ()


def test_a_placement_that_cannot_bind_this_hosts_volumes_refuses_a_create_naming_them():
    from types import SimpleNamespace

    from gateway.errors import NotAllowed
    from gateway.sandbox.docker.placement import DockerPlacement
    from gateway.sandbox.swarm.placement import SwarmPlacement
    from gateway.sessions.manager import SessionManager

    assert DockerPlacement.mounts_volumes and not SwarmPlacement.mounts_volumes
    manager = SimpleNamespace(
        volumes=object(), lifecycle=SimpleNamespace(placement=SimpleNamespace(
            name="swarm", mounts_volumes=False)),
    )  # fmt: skip
    request = CreateSession.from_json({"volumes": [{"name": "ds", "path": "data"}]})
    with pytest.raises(NotAllowed, match="swarm placement cannot mount named volumes"):
        asyncio.run(SessionManager._mount_volumes(manager, None, request, ACME))
    assert asyncio.run(SessionManager._mount_volumes(manager, None, CreateSession(), ACME)) == ()


def test_a_volume_is_mounted_once_per_session_so_its_holder_record_tells_the_truth():
    """Mounted read-write at one path and read-only at another, the session's one mount row
    said read-only, and a second session could then read beside the writer."""
    with pytest.raises(BadRequest, match="'ds' named twice"):
        CreateSession.from_json(
            {
                "volumes": [
                    {"name": "ds", "path": "a"},
                    {"name": "ds", "path": "b", "read_only": True},
                ]
            }
        )


@pytest.mark.skipif(not LOOPS, reason="needs loop mounts (root)")
def test_files_of_a_volume_whose_create_is_still_running_are_a_409_saying_so(tmp_path, monkeypatch):
    """Not a 503: the volume is there, not yet usable (schemathesis, two workers: a DELETE of a
    volume's file while another request's create was formatting its image)."""
    formatting, go_on = threading.Event(), threading.Event()
    real_create = volume.create

    def slow_create(*args):
        formatting.set()  # recorded first, then made
        go_on.wait(10)
        return real_create(*args)

    monkeypatch.setattr(volume, "create", slow_create)

    async def scenario(volumes, store):
        creating = asyncio.create_task(volumes.create(ACME, CreateVolume("data", 16 * MIB)))
        assert await asyncio.to_thread(formatting.wait, 10)
        try:
            with pytest.raises(Conflict, match="its create is still running"):
                await volumes.files(ACME, "data")
        finally:
            go_on.set()
        await creating
        assert await (await volumes.files(ACME, "data")).free_bytes() > 0  # made: usable

    run(tmp_path, scenario)
