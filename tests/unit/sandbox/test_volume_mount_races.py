"""A named volume's host mounts raced by the gateway's own concurrent calls (as root).

Every files request remounts a volume a reboot unmounted, every reader's create
makes sure of its read-only view, and a delete unmounts and removes it; these
run on worker threads at once (and in every gateway of the host), so each must
see the others' mounts whole.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gateway.sandbox import volume

MIB = 2**20
pytestmark = pytest.mark.skipif(not volume.loop_mounts_available(), reason="needs root")


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(path))]


def test_a_read_only_view_is_never_handed_out_before_it_is_read_only(tmp_path, monkeypatch):
    where = tmp_path / "v"
    volume.create(where, 16 * MIB, 1000, 1000)
    real, bound, go = volume._run, threading.Event(), threading.Event()

    def slow(*cmd: str) -> None:
        real(*cmd)
        if cmd[:2] == ("mount", "--bind"):  # bound, not yet remounted read-only
            bound.set()
            go.wait(5)

    monkeypatch.setattr(volume, "_run", slow)
    seen: dict[str, int] = {}

    def second_reader() -> None:
        seen["flags"] = os.statvfs(volume.read_only_view(where)).f_flag

    first = threading.Thread(target=volume.read_only_view, args=(where,))
    first.start()
    try:
        assert bound.wait(5)
        second = threading.Thread(target=second_reader)
        second.start()
        second.join(0.5)
    finally:
        go.set()
        first.join(5)
    second.join(5)
    try:
        assert seen["flags"] & os.ST_RDONLY, "a reader was handed a writable view"
        assert _mounts_under(where / volume.READ_ONLY_VIEW) == [str(where / "read-only")]
    finally:
        volume.destroy(where)


def test_a_remount_racing_a_delete_leaves_nothing_mounted_or_on_disk(tmp_path, monkeypatch):
    """A files request that found the volume just before its delete remounts it meanwhile."""
    where = tmp_path / "v"
    volume.create(where, 16 * MIB, 1000, 1000)
    (where / "workspace" / "data").write_bytes(b"x" * MIB)
    real = volume.remove_tree
    late: list[threading.Thread] = []

    def meanwhile(parent: int, name: str) -> None:
        remount = threading.Thread(target=volume.mount_again, args=(where,))
        remount.start()
        remount.join(0.5)
        late.append(remount)
        real(parent, name)

    monkeypatch.setattr(volume, "remove_tree", meanwhile)
    try:
        volume.destroy(where)
    finally:
        for thread in late:
            thread.join(5)
        leftover = _mounts_under(where)
        for point in reversed(leftover):
            os.system(f"umount -l {point}")
    assert leftover == [] and not where.exists()
