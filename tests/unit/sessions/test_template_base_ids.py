"""A template's FROM is pinned to its base's image id, not its tag: a tag gone before the
build runs (the tenant deleted its base template meanwhile) made the daemon pull that name
from the public registry, on the host's network."""

from __future__ import annotations

import asyncio

import pytest
from test_template_builds import PY, _built, _settled, templates  # noqa: F401 (its fixture)

from gateway.sandbox.dockerfiles import DockerfileRefused


def test_from_names_the_bases_image_id(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        base = await _built(t, "alice", "geo")
        t.engine.ids = {base["image"]: "sha256:" + "a" * 64}
        await t.build("alice", "roads", "FROM geo AS g\nRUN true\nFROM g\n")
        await _settled(t)
        dockerfile = t.engine.built[-1][1]
        assert dockerfile.splitlines()[:3] == [f"FROM sha256:{'a' * 64} AS g", "RUN true", "FROM g"]
        assert base["image"] not in dockerfile

    asyncio.run(scenario())


def test_a_base_whose_image_is_gone_is_refused_not_pulled(templates):  # noqa: F811
    async def scenario():
        t = await templates()
        base = await _built(t, "alice", "geo")
        t.engine.ids = {base["image"]: None}
        with pytest.raises(DockerfileRefused, match="no base 'geo' on this host"):
            await t.build("alice", "roads", "FROM geo\n")
        await t.build("alice", "roads", PY)  # a kernel's image still builds

    asyncio.run(scenario())
