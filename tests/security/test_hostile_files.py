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


def timed(call, *args, **kw):
    """A call's answer and how long it took, in seconds."""
    started = time.monotonic()
    answer = call(*args, **kw)
    return answer, time.monotonic() - started


def test_a_chain_ten_thousand_directories_deep(attack, watched):
    sid = attack.session()
    attack.run(sid, "1")  # a small workspace: the next walk would run on the event loop
    code = (
        "import os\n"
        "os.mkdir('chain'); fd = os.open('chain', os.O_RDONLY)\n"
        "for _ in range(10_000):\n"
        "    os.mkdir('d', dir_fd=fd); nfd = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
        "    os.close(fd); fd = nfd\n"
        "os.close(os.open('bottom.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n"
        "open('top.txt', 'w').write('top')"
    )
    reply, took = timed(attack.run, sid, code, timeout=120)
    assert reply["status"] == "ok", reply
    assert took < 30, f"the execute that built the chain took {took:.0f} s (artifacts walk)"
    assert reply["artifacts_truncated"] is True, reply
    assert "top.txt" in [a["path"] for a in reply["artifacts"]], reply["artifacts"]
    base = f"/v1/sessions/{sid}/files"
    listing = attack.api.get(base).json()
    assert {e["name"] for e in listing["entries"]} == {"chain", "top.txt"}, listing
    assert listing["truncated"] is False
    r = attack.api.get(base, params={"format": "tar"}, timeout=60)
    assert r.status_code == 409 and "levels" in r.json()["error"]["message"], r.text
    r, took = timed(attack.api.delete, f"{base}/chain", timeout=60)
    assert r.status_code == 204, r.text
    assert took < 20, f"deleting the chain took {took:.0f} s"
    assert attack.api.get(base).json()["entries"][0]["name"] == "top.txt"
    attack.run(sid, "import os; os.makedirs('again/' + '/'.join(['d'] * 1000))")
    r, took = timed(attack.api.delete, f"/v1/sessions/{sid}", timeout=60)
    assert r.status_code == 204 and took < 10, f"deleting the session took {took:.0f} s"


def test_a_directory_with_a_million_entries(attack, watched):
    sid = attack.session()
    # Hard links: a million names need no inodes (ext4 allows 65,000 links per file).
    code = (
        "import os\n"
        "os.mkdir('wide')\n"
        "for i in range(1_000_000):\n"
        "    if i % 60_000 == 0:\n"
        "        src = f'wide/f{i}'; open(src, 'w').close(); continue\n"
        "    os.link(src, f'wide/f{i}')\n"
        "print(len(os.listdir('wide')))"
    )
    reply, took = timed(attack.run, sid, code, timeout=900)
    assert text_of(reply) == "1000000\n", reply
    print(f"made a million entries in {took:.0f} s")
    base = f"/v1/sessions/{sid}/files"
    r = attack.api.get(base, params={"path": "wide"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["truncated"] is True and len(r.json()["entries"]) <= 10_000, len(r.text)
    r = attack.api.get(base, params={"path": "wide", "format": "zip"}, timeout=60)
    assert r.status_code == 409 and "entries" in r.json()["error"]["message"], r.text
    for _ in range(30):  # each DELETE is bounded in time; what it left, the next one takes
        r, took = timed(attack.api.delete, f"{base}/wide", timeout=60)
        assert took < 20, f"a DELETE took {took:.0f} s"
        if r.status_code == 204:
            break
        assert r.status_code == 409 and "again" in r.json()["error"]["message"], r.text
    assert r.status_code == 204, r.text
    r, took = timed(attack.api.delete, f"/v1/sessions/{sid}", timeout=60)
    assert r.status_code == 204 and took < 10, f"deleting the session took {took:.0f} s"


def test_a_sparse_terabyte_file(attack, watched):
    sid = attack.session()
    attack.run(sid, "import os; os.mkdir('big'); open('big/tb', 'wb').truncate(2**40)")
    base = f"/v1/sessions/{sid}/files"
    for fmt in ("tar", "zip"):
        r = attack.api.get(f"{base}/big", params={"format": fmt}, timeout=30)
        assert r.status_code == 413 and "archive limit" in r.json()["error"]["message"], r.text
    with attack.api.stream("GET", f"{base}/big/tb") as r:
        assert r.headers["content-length"] == str(2**40)  # streamed: the client decides
    listing = attack.api.get(base, params={"path": "big"}).json()["entries"]
    assert listing[0]["size"] == 2**40
