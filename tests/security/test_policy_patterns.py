"""A tenant's own policy patterns cannot freeze the gateway for other tenants (issue 35, item 3).

A session may bring a policy whose patterns the gateway matches against its
cells. One that backtracks catastrophically (``(\\w+\\s?)+$`` on ``echo``
and 20 word characters and a ``!``: some 2**25 steps for Python's ``re``, a
few seconds with the event loop held, each time) must cost its session no
more than a linear scan, while another tenant's canary keeps answering.
"""

from __future__ import annotations

import pytest
from helpers import Canary, canary_session, run, tenant_gateway

pytestmark = pytest.mark.docker

PATTERN = {"rule": "shell", "regex": r"(\w+\s?)+$", "message": "a word", "kernels": ["bash"]}


def test_a_catastrophic_session_pattern_does_not_stall_other_tenants(start_gateway) -> None:
    with tenant_gateway(start_gateway, {"mallory": "mallory-token"}) as (gw, clients):
        mallory = clients["mallory"]
        r = mallory.post(
            "/v1/sessions",
            json={"kernel": "bash", "policy": {"mode": "enforce", "patterns": [PATTERN]}},
        )
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        with canary_session(gw) as canary, Canary(gw, canary, max_rss_growth=64 * 2**20):
            for _ in range(3):
                reply = run(mallory, sid, "echo " + "x" * 20 + "!")
                assert reply["status"] == "ok", reply
