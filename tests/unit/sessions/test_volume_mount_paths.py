"""A volume's mount path is bounded up front: the host and the runtime refuse long ones late.

A 300-character name was a 500 (ENAMETOOLONG making the mount point) and a
path of thousands of levels a 503 blaming the container engine; both are the
client's to fix, so they are a 400 saying the bounds.
"""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest
from gateway.sessions.requests import MountVolume


@pytest.mark.parametrize("path", ["x" * 256, "y" * 10_000, "/".join(["d"] * 3000), "é" * 128])
def test_a_mount_path_past_the_filesystems_bounds_is_a_400_saying_them(path):
    with pytest.raises(BadRequest, match=r"255 bytes.*1024"):
        MountVolume.from_json({"name": "ds", "path": path})


def test_a_mount_path_within_the_bounds_is_taken():
    deep = "/".join(["d"] * 500)
    for path in ("x" * 255, deep, "é" * 127):
        assert MountVolume.from_json({"name": "ds", "path": path}).path == path


@pytest.mark.parametrize("path", [".", "", "./"])
def test_a_mount_over_the_whole_workspace_is_a_400_saying_to_name_a_directory(path):
    with pytest.raises(BadRequest, match="not over the workspace itself"):
        MountVolume.from_json({"name": "ds", "path": path})
