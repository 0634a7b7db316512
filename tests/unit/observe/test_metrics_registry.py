"""The gateway's metrics registry: one per gateway, even two in one process."""

from __future__ import annotations

from gateway.observe.metrics import GatewayMetrics


def test_two_gateways_in_one_process_keep_their_own_counts():
    first, second = GatewayMetrics(), GatewayMetrics()
    first.executed("python3", "acme", "ok", 0.5)
    assert b'sbx_executions_total{kernel="python3",status="ok",tenant="acme"} 1.0' in (
        first.exposition()
    )
    assert b"sbx_executions_total{" not in second.exposition()
