"""Which Host names a preview (the host form) and which stay the gateway's own."""

from __future__ import annotations

import re

from gateway.api.previews import HOST_FORM

SID = "0f6a8c9e-3b1d-4c2a-9e8f-1a2b3c4d5e6f"


def test_a_port_and_a_session_id_name_a_preview():
    found = re.fullmatch(HOST_FORM, f"8000-{SID}.sbx.example.org")
    assert found is not None and found["port"] == "8000" and found["session_id"] == SID
    assert re.fullmatch(HOST_FORM, f"3000-{SID}.localhost")


def test_the_gateways_own_names_and_envds_ports_are_not_previews():
    for host in (
        "2024-gateway.corp.example",  # a gateway reached by such a name keeps its API
        "8000-gateway.example.org",
        f"49983-{SID}.sbx.example.org",  # envd
        f"49999-{SID}.sbx.example.org",  # the code interpreter
        f"8000-{SID}",  # no domain
        f"123456-{SID}.x",
        "localhost",
    ):
        assert re.fullmatch(HOST_FORM, host) is None, host
