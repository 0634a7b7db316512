"""Templates' tags (E2B's ``name:tag``): refs read strictly, tags moved atomically to ready
versions, resolved by sessions' creates, dropped with their template, kept per tenant.

The engine and store are those of test_template_builds (a fake engine, real SQLite).
"""

from __future__ import annotations

import asyncio

import pytest
from test_template_builds import PY, _built, _settled, templates  # noqa: F401 (its fixture)

from gateway.errors import BadRequest, Conflict, QuotaExceeded
from gateway.sandbox.templates import BuildFailed
from gateway.sessions.requests import CreateSession
from gateway.sessions.templates import (
    MAX_TAGS,
    TemplateNotFound,
    template_ref,
    template_tags,
)

HOSTILE = ["..", "v1..2", "a\x00b", "x" * 10_000, "", "-v1", "v 1", "v1/2", "12", "é"]


def test_a_ref_is_a_name_a_version_or_a_tag():
    assert template_ref("geo") == ("geo", None)
    assert template_ref("geo:2") == ("geo", 2)
    assert template_ref("geo:v1.2.0") == ("geo", "v1.2.0")
    assert template_ref("geo:default") == ("geo", "default")
    assert template_tags(["prod", "v1", "prod"]) == ("prod", "v1")


@pytest.mark.parametrize("tag", HOSTILE)
def test_a_bad_tag_is_a_clear_400_that_does_not_echo_it(tag):
    for attempt in (lambda: template_tags([tag]), lambda: template_ref(f"geo:{tag}")):
        if tag == "12":  # a number is a version in a ref, never a tag
            template_ref("geo:12")
            with pytest.raises(BadRequest, match="names a version"):
                template_tags([tag])
            break
        with pytest.raises(BadRequest) as refused:
            attempt()
        assert refused.value.status == 400 and len(refused.value.message) < 300
        if len(tag) > 2:  # ('..' is in the rule it states)
            assert tag not in refused.value.message, refused.value.message
    with pytest.raises(BadRequest):
        template_tags("prod")  # a list, not one string
    with pytest.raises(BadRequest):
        template_tags([f"t{i}" for i in range(MAX_TAGS)])


def test_builds_carry_their_tags_and_a_build_without_tags_moves_default(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        one = await _built(t, "alice", "geo")
        await t.build("alice", "geo", PY, tags=("v2", "stable"))
        await _settled(t)
        tags = {row["tag"]: row["version"] for row in await t.tags("alice", "geo")}
        assert tags == {"default": 1, "v2": 2, "stable": 2}
        # E2B's rule: ``geo`` is ``geo:default``, which a build with tags does not move.
        assert (await t.resolve("alice", "geo"))["version"] == 1
        assert (await t.resolve("alice", "geo:stable"))["version"] == 2
        request = await t.session_request(CreateSession(template="geo:v2"), "alice")
        assert request.image == (await t.resolve("alice", "geo:2"))["image"] != one["image"]
        views = {d["version"]: d["tags"] for d in await t.versions("alice", "geo")}
        assert views == {1: ["default"], 2: ["stable", "v2"]}
        assert {d["version"]: d["tags"] for d in await t.list("alice")} == views
        with pytest.raises(TemplateNotFound, match="no tag 'prod'"):
            await t.resolve("alice", "geo:prod")

    asyncio.run(scenario())


def test_a_tag_moves_to_a_version_and_is_removed(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        await _built(t, "alice", "geo")
        await _built(t, "alice", "geo")
        doc, tags = await t.assign("alice", "geo:1", ["prod", "default"])
        assert (doc["version"], tags) == (1, ("prod", "default"))
        assert (await t.resolve("alice", "geo"))["version"] == 1  # a rollback of the bare name
        await t.assign("alice", "geo:2", ["prod"])  # moves: one version holds a tag
        rows = await t.tags("alice", "geo")
        assert sorted((r["tag"], r["version"]) for r in rows) == [("default", 1), ("prod", 2)]
        await t.assign("alice", "geo:prod", ["live"])  # a tag names its version too
        assert (await t.resolve("alice", "geo:live"))["version"] == 2
        await t.remove("alice", "geo", ["default"])
        assert (await t.resolve("alice", "geo"))["version"] == 2  # no default: the newest ready
        with pytest.raises(TemplateNotFound, match="no tag 'default'"):
            await t.remove("alice", "geo", ["default", "prod"])
        assert {r["tag"] for r in await t.tags("alice", "geo")} == {"prod", "live"}

    asyncio.run(scenario())


def test_a_tag_naming_a_missing_or_failed_version_or_another_tenants_is_refused(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        await _built(t, "alice", "geo")
        t.engine.fail = BuildFailed("step 1", "no")
        await t.build("alice", "geo", PY, tags=("broken",))
        await _settled(t)
        with pytest.raises(TemplateNotFound, match="no version 9"):
            await t.assign("alice", "geo:9", ["prod"])
        with pytest.raises(Conflict, match="geo:2 is failed"):
            await t.assign("alice", "geo:2", ["prod"])
        assert [r["tag"] for r in await t.tags("alice", "geo")] == ["default"]  # none on a failure
        for call in (
            t.assign("bob", "geo:1", ["prod"]),
            t.remove("bob", "geo", ["default"]),
            t.tags("bob", "geo"),
        ):
            with pytest.raises(TemplateNotFound):
                await call
        with pytest.raises(BadRequest):
            await t.assign("alice", "geo:1", ["a\x00"])

    asyncio.run(scenario())


def test_a_template_keeps_a_bounded_number_of_tags(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        await _built(t, "alice", "geo")
        half = MAX_TAGS // 2  # the most one request names
        await t.assign("alice", "geo:1", [f"a{i}" for i in range(half)])
        await t.assign("alice", "geo:1", [f"b{i}" for i in range(half - 1)])  # and default
        await t.assign("alice", "geo:1", ["a0", "b0"])  # moved, not added
        with pytest.raises(QuotaExceeded, match="tags"):
            await t.assign("alice", "geo:1", ["one-more"])

    asyncio.run(scenario())


def test_deleting_a_template_drops_its_tags_and_a_new_one_of_that_name_starts_clean(
    templates,  # noqa: F811
):
    async def scenario():
        t = await templates()
        await _built(t, "alice", "geo")
        await t.assign("alice", "geo:1", ["prod"])
        await t.delete("alice", "geo")
        again = await _built(t, "alice", "geo")
        rows = await t.tags("alice", "geo")
        assert [(r["tag"], r["build_id"]) for r in rows] == [("default", again["id"])]
        with pytest.raises(TemplateNotFound, match="no tag 'prod'"):
            await t.resolve("alice", "geo:prod")

    asyncio.run(scenario())


def test_tags_survive_a_restart(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        await _built(t, "alice", "geo")
        await t.assign("alice", "geo:1", ["prod"])
        await t.store.close()
        again = await templates()
        assert (await again.resolve("alice", "geo:prod"))["version"] == 1

    asyncio.run(scenario())


def test_e2b_build_requests_keep_their_tags_until_the_build_starts(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        name, build_id, tags = t.request_build("alice", "geo:v1", ["stable"])
        assert (name, tags) == ("geo", ("v1", "stable"))
        with pytest.raises(TemplateNotFound, match="was not requested"):
            await t.build_uploaded("bob", "geo", PY, [], build_id)
        doc = await t.build_uploaded("alice", "geo", PY, [], build_id)
        await _settled(t)
        rows = await t.tags("alice", "geo")
        assert {r["tag"]: r["build_id"] for r in rows} == {"v1": build_id, "stable": build_id}
        assert (await t.resolve("alice", f"geo:{build_id}"))["id"] == doc["id"]  # by build id
        with pytest.raises(TemplateNotFound, match="was not requested"):
            await t.build_uploaded("alice", "geo", PY, [], build_id)  # once
        with pytest.raises(BadRequest, match="new version"):
            t.request_build("alice", "geo:3", [])
        for _ in range(100):  # abandoned requests are bounded: the oldest go
            t.request_build("alice", "geo", [])
        assert len(t.requested) <= 16

    asyncio.run(scenario())


def test_a_template_builds_from_a_tagged_version_and_the_bare_name_is_its_default(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        await t.build("alice", "r-base", "FROM sbx/r\n", tags=("stable",))
        await _settled(t)
        await _built(t, "alice", "r-base")  # version 2 takes default
        await t.assign("alice", "r-base:1", ["default"])  # back to 1
        for base in ("r-base:stable", "r-base"):
            await t.build("alice", "more", f"FROM {base}\nRUN true\n")
            await _settled(t)
        dockerfiles = [d for _, d, _, _ in t.engine.built[-2:]]
        one = (await t.resolve("alice", "r-base:1"))["image"]
        assert all(d.startswith(f"FROM {one}") for d in dockerfiles), dockerfiles

    asyncio.run(scenario())
