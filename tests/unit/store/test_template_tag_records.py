"""Templates' tag rows on SQLite: one version holds a tag, moved in one transaction;
tests/test_store_postgres.py runs them again on PostgreSQL."""

from __future__ import annotations


def build(build_id: str, version: int, tenant: str = "acme", status: str = "ready") -> dict:
    return {"id": build_id, "tenant": tenant, "name": "geo", "version": version,
            "status": status, "created_at": 1.0}  # fmt: skip


def test_a_tag_moves_between_versions_and_goes_with_its_version(in_store):
    async def scenario(store):
        for doc in (build("b1", 1), build("b2", 2), build("b3", 3, status="failed")):
            await store.save_template(doc)
        assert await store.tag_template("b1", "acme", "geo", ["prod", "v1"], 5.0, 8) is None
        assert await store.tag_template("b2", "acme", "geo", ["prod"], 6.0, 8) is None
        rows = await store.template_tags("acme", "geo")
        assert [(r["tag"], r["build"], r["created_at"]) for r in rows] == [
            ("prod", "b2", 6.0), ("v1", "b1", 5.0)
        ]  # fmt: skip
        assert await store.tag_template("b3", "acme", "geo", ["x"], 7.0, 8) == "gone"  # failed
        assert await store.tag_template("b1", "other", "geo", ["x"], 7.0, 8) == "gone"
        assert await store.tag_template("b1", "acme", "geo", ["a", "b", "c"], 7.0, 4) == "full"
        assert len(await store.template_tags("acme", "geo")) == 2  # all or nothing
        assert await store.template_tags("other", "geo") == []
        await store.delete_template_version("b2")
        assert [r["tag"] for r in await store.template_tags("acme", None)] == ["v1"]
        assert await store.untag_template("acme", "geo", ["v1", "nope"]) == 1
        await store.tag_template("b1", "acme", "geo", ["p", "q"], 8.0, 8)
        assert await store.untag_template("acme", "geo", None) == 2

    in_store(scenario)


def test_tags_outlive_the_store_being_opened_again(in_store):
    async def scenario(store):
        await store.save_template(build("b1", 1))
        await store.tag_template("b1", "acme", "geo", ["prod"], 5.0, 8)

    in_store(scenario)

    async def again(store):
        assert [r["tag"] for r in await store.template_tags("acme", "geo")] == ["prod"]

    in_store(again)
