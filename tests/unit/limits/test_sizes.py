"""Sizes and limits: parsing, printing, resolving a request against the defaults and the maximum."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest, LimitExceeded
from gateway.limits import Limits, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512m", 512 * 2**20), ("1g", 2**30), ("1GiB", 2**30), ("64 MB", 64 * 2**20), (100, 100)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_format_size():
    assert format_size(256 * 2**20) == "256 MiB" and format_size(1536 * 2**20) == "1.5 GiB"


DEFAULTS = Limits(memory=2**29, cpus=1, pids=256, disk=2**30, timeout=60, output_bytes=2**20)


MAXIMUM = Limits(memory=2**32, cpus=4, pids=4096, disk=2**34, timeout=3600, output_bytes=2**26)


def test_limits_resolve_against_defaults_and_maximum():
    defaults, maximum = DEFAULTS, MAXIMUM
    got = defaults.resolve({"memory": "1g", "pids": 32}, maximum)
    assert got.memory == 2**30 and got.pids == 32 and got.cpus == 1
    with pytest.raises(LimitExceeded, match="memory = 8 GiB is above the server maximum 4 GiB"):
        defaults.resolve({"memory": "8g"}, maximum)
    with pytest.raises(LimitExceeded, match="not a size"):
        defaults.resolve({"disk": "lots"}, maximum)
    with pytest.raises(BadRequest, match="unknown limit"):
        defaults.resolve({"gpu": 1}, maximum)
    with pytest.raises(LimitExceeded, match="positive"):
        defaults.resolve({"cpus": 0}, maximum)


@pytest.mark.parametrize(
    ("requested", "message"),
    [
        ({"memory": "32m"}, "memory = 32 MiB is below the 64 MiB a kernel needs"),
        ({"disk": "64k"}, "disk = 64 KiB is below the 1 MiB"),
        ({"pids": 8}, "pids = 8 is below the 16"),
        ({"cpus": 0.001}, "cpus = 0.001 is below the 0.01"),
        ({"pids": "nan"}, "must be a number"),
        ({"pids": 1e400}, "must be a number"),
        ({"cpus": "inf"}, "must be a number"),
        ({"memory": float("inf")}, "must be a size"),
    ],
)
def test_limits_no_kernel_could_start_under_are_refused(requested, message):
    """Each was a 500 or 503 (mkfs failing, the engine refusing, NaN reaching docker)."""
    with pytest.raises(LimitExceeded, match=message):
        DEFAULTS.resolve(requested, MAXIMUM)
