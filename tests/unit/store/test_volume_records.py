"""Volumes' records on SQLite: quotas counted with sessions' disk, mounts held by claims;
tests/test_store_postgres.py runs them again on PostgreSQL."""

from __future__ import annotations

GIB = 2**30
CAPS = {"volumes": 2, "disk": 10 * GIB}
SESSION_CAPS = {"sessions": 10, "memory": 100 * GIB, "cpus": 64.0, "disk": 10 * GIB,
                "per_minute": 0}  # fmt: skip


def vol(volume_id: str, name: str, tenant: str = "acme", size: int = GIB) -> dict:
    return {"id": volume_id, "tenant": tenant, "name": name, "size_bytes": size,
            "created_at": "2026-11-29T00:00:00.000Z"}  # fmt: skip


def claim(session_id: str, disk: int = GIB, tenant: str = "acme") -> dict:
    return {"session_id": session_id, "tenant": tenant, "owner": "g1", "memory": GIB,
            "cpus": 1.0, "disk": disk}  # fmt: skip


def test_a_volume_name_is_taken_once_per_tenant_and_another_tenants_is_invisible(in_store):
    async def scenario(store):
        assert await store.add_volume(vol("v1", "data"), CAPS) is None
        assert (await store.add_volume(vol("v2", "data"), CAPS))["what"] == "name"
        assert await store.add_volume(vol("v3", "data", tenant="zeta"), CAPS) is None
        assert (await store.get_volume("acme", "data"))["id"] == "v1"
        assert (await store.get_volume("acme", "v1"))["name"] == "data"
        assert await store.get_volume("acme", "v3") is None  # zeta's, by id
        assert [v["id"] for v in await store.volumes_of_tenant("zeta")] == ["v3"]

    in_store(scenario)


def test_volumes_count_toward_the_tenants_disk_beside_its_sessions(in_store):
    async def scenario(store):
        assert await store.claim_quota(claim("s1", disk=6 * GIB), SESSION_CAPS, 60) is None
        refused = await store.add_volume(vol("v1", "big", size=5 * GIB), CAPS)
        assert refused == {"what": "disk", "used": 6 * GIB, "cap": 10 * GIB}
        assert await store.add_volume(vol("v1", "small", size=3 * GIB), CAPS) is None
        # and a session's workspace now finds the volume's bytes in use
        again = await store.claim_quota(claim("s2", disk=2 * GIB), SESSION_CAPS, 60)
        assert again == {"what": "disk", "used": 9 * GIB, "cap": 10 * GIB, "wanted": 2 * GIB}
        assert await store.add_volume(vol("v2", "one"), CAPS) is None
        assert (await store.add_volume(vol("v3", "two", size=1), CAPS))["what"] == "volumes"

    in_store(scenario)


def test_readers_share_a_volume_and_a_writer_holds_it_alone_while_its_claim_holds(in_store):
    async def scenario(store):
        await store.add_volume(vol("v1", "data"), CAPS)
        for sid in ("r1", "r2", "w1", "w2"):
            assert await store.claim_quota(claim(sid, disk=1), SESSION_CAPS, 60) is None
        assert await store.mount_volumes("r1", [("v1", True)]) is None
        assert await store.mount_volumes("r2", [("v1", True)]) is None
        conflict = await store.mount_volumes("w1", [("v1", False)])
        assert conflict == {
            "volume_id": "v1",
            "holders": [{"session_id": "r1", "read_only": True},
                        {"session_id": "r2", "read_only": True}],
        }  # fmt: skip
        assert [h["session_id"] for h in await store.delete_volume("v1")] == ["r1", "r2"]
        await store.release_claim("r1")  # a create that never started
        await store.save_session({"id": "r2", "tenant": "acme", "state": "idle",
                                  "created_at": "t0", "ended_at": None})  # fmt: skip
        await store.save_session({"id": "r2", "tenant": "acme", "state": "deleted",
                                  "created_at": "t0", "ended_at": "t1"})  # fmt: skip
        assert await store.volume_holders("v1") == []
        assert await store.mount_volumes("w1", [("v1", False)]) is None
        refused = await store.mount_volumes("w2", [("v1", True)])
        assert refused["holders"] == [{"session_id": "w1", "read_only": False}]
        await store.release_claim("w1")  # its create never started
        assert await store.delete_volume("v1") == []
        assert await store.get_volume("acme", "data") is None

    in_store(scenario)


def test_a_mount_is_taken_whole_or_not_at_all(in_store):
    async def scenario(store):
        await store.add_volume(vol("v1", "a"), CAPS)
        await store.add_volume(vol("v2", "b"), CAPS)
        for sid in ("s1", "s2"):
            await store.claim_quota(claim(sid, disk=1), SESSION_CAPS, 60)
        assert await store.mount_volumes("s1", [("v2", False)]) is None
        assert (await store.mount_volumes("s2", [("v1", False), ("v2", True)]))["volume_id"] == "v2"
        assert await store.volume_holders("v1") == []  # not half taken

    in_store(scenario)


def test_a_volume_deleted_meanwhile_is_not_mounted(in_store):
    """A create found the volume, a delete then removed it: the mount must not be taken."""

    async def scenario(store):
        await store.add_volume(vol("v1", "a"), CAPS)
        await store.claim_quota(claim("s1", disk=1), SESSION_CAPS, 60)
        assert await store.delete_volume("v1") == []
        assert await store.mount_volumes("s1", [("v1", False)]) == {
            "volume_id": "v1", "holders": [], "gone": True
        }  # fmt: skip
        assert await store.volume_holders("v1") == []

    in_store(scenario)


def test_a_name_wins_over_an_id_when_a_volume_is_named_as_another_ones_id(in_store):
    """Else a delete by name could remove the other volume, the one with that id."""

    async def scenario(store):
        await store.add_volume(vol("7f3a", "data"), CAPS)
        await store.add_volume(vol("9b1c", "7f3a"), CAPS)
        assert (await store.get_volume("acme", "7f3a"))["id"] == "9b1c"
        assert (await store.get_volume("acme", "data"))["id"] == "7f3a"

    in_store(scenario)
