"""Files the kernel plants where the gateway looks: its socket directory and its workspace.

Each attack is session code followed by what its owner may ask for (a
restart, a listing, an archive, a delete). While it runs a canary session on
the same gateway keeps answering, and the gateway's RSS is sampled (helpers.Canary).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Canary, text_of

from .conftest import Attack

pytestmark = pytest.mark.docker

# The gateway idles at about 100 MiB; a file read whole, or a listing of a
# million entries held as dicts, takes it far past this.
MAX_RSS_MIB = 600
HOST_SECRET_JSON = '{"ip": "sbx-host-file-5c1e", "key": "sbx-host-file-5c1e"}'


@pytest.fixture
def attack(hostile_gateway, canary) -> Iterator[Attack]:
    """Sessions for one attack (runc: the gateway's side is the same under gVisor)."""
    a = Attack(hostile_gateway, "runc")
    yield a
    a.delete_all()


@pytest.fixture
def watched(hostile_gateway, canary) -> Iterator[Canary]:
    with Canary(hostile_gateway, canary, max_rss_mib=MAX_RSS_MIB) as watch:
        yield watch


def plant(kind: str, target: Path) -> str:
    """Session code that replaces ``name`` in the kernel's socket directory with ``kind``."""
    make = {
        "fifo": "os.mkfifo(p)",
        "dev_zero": "os.symlink('/dev/zero', p)",
        "sparse": "open(p, 'wb').truncate(2**40)",
        "host_link": f"os.symlink({str(target)!r}, p)",
    }[kind]
    return (
        "import os\n"
        "for name in ('connection.json', 'kernel-connection.json'):\n"
        "    p = '/run/sbx/' + name\n"
        "    if os.path.lexists(p): os.remove(p)\n"
        f"    {make}\n"
        "print(sorted(os.listdir('/run/sbx')))"
    )


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse", "host_link"])
def test_a_restart_never_opens_what_the_kernel_planted_in_its_socket_directory(
    attack, watched, kind, tmp_path
):
    host_file = tmp_path / "secret.json"
    host_file.write_text(HOST_SECRET_JSON)
    before = host_file.stat()
    sid = attack.session()
    # The kernel can write its socket directory: it binds its sockets there.
    reply = attack.run(sid, plant(kind, host_file))
    assert reply["status"] == "ok", reply
    started = time.monotonic()
    r = attack.api.post(f"/v1/sessions/{sid}/restart", timeout=60)
    took = time.monotonic() - started
    assert r.status_code == 200, f"a restart after planting a {kind} answered {r.text}"
    assert took < 30, f"the restart took {took:.0f} s"
    assert text_of(attack.run(sid, "print(6 * 7)")) == "42\n", "the restarted kernel does not run"
    after = host_file.stat()
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode), "changed via a link"
    assert host_file.read_text() == HOST_SECRET_JSON, "the gateway wrote through the kernel's link"
    readable = (
        "import glob, os\n"
        "print([open(p).read() for p in glob.glob('/run/sbx*/*.json')\n"
        "       if os.path.isfile(p) and os.path.getsize(p) < 2**20])"
    )
    seen = text_of(attack.run(sid, readable))
    assert "sbx-host-file-5c1e" not in seen, "a host file's content reached the sandbox"
