"""The data directory's lock: held for a gateway's life, refused to a second holder."""

from __future__ import annotations

import os

import pytest

from gateway.errors import ConfigError
from gateway.store.datadir import DataDirLock


def test_a_held_directory_is_refused_naming_its_holder(tmp_path) -> None:
    held = DataDirLock.take(tmp_path / "data")
    with pytest.raises(ConfigError, match=rf"in use by another gateway \(pid {os.getpid()}\)"):
        DataDirLock.take(tmp_path / "data")
    held.release()
    DataDirLock.take(tmp_path / "data").release()


def test_a_link_in_the_locks_place_is_not_followed(tmp_path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep me")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / DataDirLock.NAME).symlink_to(target)
    with pytest.raises(ConfigError, match="not a plain file"):
        DataDirLock.take(tmp_path / "data")
    assert target.read_text() == "keep me"
