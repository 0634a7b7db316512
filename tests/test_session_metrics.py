"""``GET /v1/sessions/{id}/metrics`` and ``session.get_metrics()``: what a session uses."""

from __future__ import annotations

import pytest
from test_client import client, sdk_session, token  # noqa: F401 (fixtures)

pytestmark = pytest.mark.docker

MB = 2**20


def test_cpu_memory_peak_network_and_disk(sdk_session, api):  # noqa: F811
    sdk_session.files.write("data.bin", b"x" * 3 * MB)
    code = "block = bytearray(200 * 2**20)\ndel block\nsum(i * i for i in range(3_000_000))"
    assert sdk_session.run(code).ok
    metrics = sdk_session.get_metrics()
    assert metrics.cpu_seconds is not None and metrics.cpu_seconds > 0.1, metrics
    assert metrics.memory_peak_bytes is not None and metrics.memory_peak_bytes > 200 * MB, (
        "the peak missed a 200 MiB allocation"
    )
    assert metrics.memory_bytes is not None and metrics.memory_bytes < metrics.memory_peak_bytes
    assert metrics.memory_limit_bytes == sdk_session.refresh().limits["memory"]
    assert metrics.disk_bytes is not None and metrics.disk_bytes >= 3 * MB
    assert (metrics.network_bytes_sent, metrics.network_bytes_received) == (0, 0)
    assert metrics.raw["network"]["connections"] == 0

    assert api.get("/v1/sessions/nope/metrics").status_code == 404
