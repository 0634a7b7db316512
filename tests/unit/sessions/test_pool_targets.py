"""The warm pool's size follows demand, within the operator's bounds."""

from __future__ import annotations

from gateway.sessions.pool import PoolTargets


def test_creates_finding_the_pool_empty_grow_it_to_its_bound_and_quiet_shrinks_it_back():
    now = [0.0]
    targets = PoolTargets({"python3": 2, "bash": 1}, {"python3": 4}, 60, clock=lambda: now[0])
    for _ in range(5):
        targets.missed("python3")
    targets.missed("bash")  # no pool_max named: it stays at its pool size
    targets.missed("r")  # not pooled at all
    assert targets.sizes == {"python3": 4, "bash": 1}
    now[0] = 59
    targets.relax()
    assert targets.sizes["python3"] == 4, "shrank while creates still found it empty"
    for when, size in ((60, 3), (119, 3), (120, 2), (1000, 2)):  # one a minute, to its size
        now[0] = when
        targets.relax()
        assert targets.sizes == {"python3": size, "bash": 1}, when
    targets.missed("python3")
    assert targets.sizes["python3"] == 3
