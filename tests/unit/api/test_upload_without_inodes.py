"""An upload to a filesystem with bytes free but no inodes left is a 413, not a 500.

A 16 MiB volume (or workspace) has about 4,000 inodes: code that makes that
many empty files leaves megabytes free, so the upload passes the free-space
check and then fails creating its file (or a parent directory) with ENOSPC.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from gateway.api.files import open_upload
from gateway.errors import FileTooLarge
from gateway.sandbox import volume
from gateway.workspace.files import AsyncWorkspace
from gateway.workspace.rules import Workspace

pytestmark = pytest.mark.skipif(not volume.loop_mounts_available(), reason="needs root")


class Request:
    headers = {"Content-Length": "4"}

    class connection:  # as Tornado's request has it
        @staticmethod
        def set_max_body_size(size: int) -> None:
            pass


def _use_every_inode(root: Path) -> None:
    n = 0
    try:
        while True:
            os.close(os.open(root / f"f{n}", os.O_CREAT | os.O_WRONLY))
            n += 1
    except OSError as e:
        assert e.errno == errno.ENOSPC


@pytest.mark.parametrize("path", ["new.txt", "sub/new.txt"])
def test_an_upload_where_no_inode_is_left_is_a_413(tmp_path, path):
    where = tmp_path / "v"
    root = volume.create(where, 16 * 2**20, 1000, 1000)
    try:
        _use_every_inode(root)
        files = AsyncWorkspace(Workspace(str(root), 1000, 1000))
        with pytest.raises(FileTooLarge, match="no room for another file"):
            asyncio.run(open_upload(Request(), files, path))
    finally:
        volume.destroy(where)
