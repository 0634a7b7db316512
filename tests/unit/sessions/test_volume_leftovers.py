"""A volume whose delete was cut short (its record gone, its filesystem not) is swept at start.

The record goes first, under the claims lock, so no create can mount it
meanwhile; a gateway killed before the unmount and removal left the mounted
image, its loop device and its bytes on the host with nothing counting them.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from gateway.access.auth import Principal, Quota
from gateway.errors import Conflict
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.scan import Scanner
from gateway.sandbox import volume
from gateway.sessions.requests import CreateVolume, MountVolume
from gateway.sessions.volumes import VolumeOptions, Volumes
from gateway.store.sqlite import SQLiteStore

MIB = 2**20
ACME = Principal("acme", token_id="a")
QUOTA = Quota(max_sessions=4, max_memory=2**34, max_disk=100 * MIB, max_volumes=3)


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4].startswith(str(path)) for line in f)


def test_a_volume_left_by_a_delete_cut_short_is_removed_at_start_and_others_are_kept(tmp_path):
    async def scenario() -> None:
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        gate = Gate(PolicyBook(tmp_path / "policies"), Scanner(), ApprovalDesk(store, 60.0, bool))
        volumes = Volumes(store, lambda t: QUOTA, gate, VolumeOptions(tmp_path / "volumes"))
        kept = await volumes.create(ACME, CreateVolume("kept", 16 * MIB))
        cut = await volumes.create(ACME, CreateVolume("cut", 16 * MIB))
        try:
            assert await store.delete_volume(cut["id"]) == []  # then the gateway was killed
            root = tmp_path / "volumes"
            (root / "README").write_text("an operator's note")  # not a volume's: left alone
            (root / "keep-me").mkdir()
            await volumes.sweep()
            assert (root / "README").is_file() and (root / "keep-me").is_dir()
            assert not await asyncio.to_thread(Path(cut["where"]).exists)
            assert not _mounted(Path(cut["where"]))
            files = await volumes.files(ACME, "kept")
            await files.save("a.txt", b"still here")
            assert (await files.list(""))["entries"][0]["name"] == "a.txt"
        finally:
            for doc in (kept, cut):
                await asyncio.to_thread(volume.destroy, Path(doc["where"]))
            await store.close()

    asyncio.run(scenario())


def _cut_short(where: Path, cut: str) -> None:
    """What a gateway killed in the middle of making a volume leaves."""
    subprocess.run(["umount", str(where / "workspace")], check=True)
    image = where / "workspace.img"
    image.unlink() if cut == "before its image" else image.write_bytes(b"\0" * MIB)


@pytest.mark.parametrize("cut", ["before its image", "before mkfs"])
def test_a_volume_whose_create_was_cut_short_is_a_409_never_the_hosts_disk(tmp_path, cut):
    """Its record is there, its filesystem is not: files would land on the data disk, uncapped."""
    if not volume.loop_mounts_available():
        pytest.skip("needs root")

    async def scenario() -> None:
        store = SQLiteStore(tmp_path / "db.sqlite3")
        await store.open()
        gate = Gate(PolicyBook(tmp_path / "policies"), Scanner(), ApprovalDesk(store, 60.0, bool))
        volumes = Volumes(store, lambda t: QUOTA, gate, VolumeOptions(tmp_path / "volumes"))
        doc = await volumes.create(ACME, CreateVolume("half", 16 * MIB))
        where = Path(doc["where"])
        try:
            await asyncio.to_thread(_cut_short, where, cut)
            with pytest.raises(Conflict, match="create it again"):
                await volumes.files(ACME, "half")
            with pytest.raises(Conflict, match="create it again"):
                await volumes.mount("s1", ACME, (MountVolume("half", "data"),))
            await volumes.delete(ACME, "half")  # what the message asks for works
            assert not await asyncio.to_thread(where.exists)
        finally:
            await asyncio.to_thread(volume.destroy, where)
            await store.close()

    asyncio.run(scenario())
