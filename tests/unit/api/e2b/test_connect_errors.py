"""What the E2B edge's Connect errors become in the stock SDK."""

from __future__ import annotations

import asyncio

import e2b


def test_a_placement_without_commands_is_a_clear_sdk_error() -> None:
    """The Swarm placement runs no commands: the SDK raises its exception with the reason."""
    from e2b.envd.rpc import handle_rpc_exception

    from gateway.api.e2b.connect import connect_error
    from gateway.sandbox.swarm.placement import SwarmPlacement

    refusal = None
    try:
        asyncio.run(SwarmPlacement.start_process(SwarmPlacement.__new__(SwarmPlacement),
                                                 "sbx", ["ls"], {}, "", None))  # fmt: skip
    except Exception as e:
        refusal = e
    shown = handle_rpc_exception(connect_error(refusal))
    assert isinstance(shown, e2b.SandboxException)
    assert "not offered by the swarm placement" in str(shown) and "run_code" in str(shown)
