"""Template builds started at once: the per-tenant and the gateway's bounds hold together.

Each build awaits the store and the images' checks before it is registered;
builds racing through those awaits must still count each other, else a
tenant holds any number of builds (each with its context in memory) waiting.
"""

from __future__ import annotations

import asyncio

from test_template_builds import PY, _settled, templates  # noqa: F401 (its fixture)

from gateway.errors import Overloaded
from gateway.sessions.templates import BuildBounds


def test_builds_started_at_once_pass_neither_bound(templates):  # noqa: F811
    async def scenario():
        t = await templates(bounds=BuildBounds(running=1, waiting=2, per_tenant=2))
        t.engine.hold.clear()
        mine = await asyncio.gather(
            *(t.build("alice", f"t{i}", PY) for i in range(6)), return_exceptions=True
        )
        refused = [r for r in mine if isinstance(r, Overloaded)]
        assert len(refused) == 4, f"{6 - len(refused)} builds of one tenant, over its 2"
        theirs = await asyncio.gather(
            *(t.build(f"t{i}", "geo", PY) for i in range(4)), return_exceptions=True
        )
        assert len(t.live) == 3, f"{len(t.live)} builds under way or waiting, over 1 + 2"
        assert sum(isinstance(r, Overloaded) for r in theirs) == 3
        t.engine.hold.set()
        await _settled(t)

    asyncio.run(scenario())
