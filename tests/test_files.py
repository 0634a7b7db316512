"""Files in and out of a session, and the walls around the workspace."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import tarfile
import zipfile

import pytest
from helpers import execute_in_background, run, text_of, wait_for

pytestmark = pytest.mark.docker


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_50mb_round_trip_is_streamed(gateway, new_session):
    api = gateway.client
    sid = new_session()["id"]
    data = os.urandom(50 * 2**20)
    before = rss(gateway.pid)

    def chunks():
        view = memoryview(data)
        for i in range(0, len(data), 2**20):
            yield bytes(view[i : i + 2**20])

    r = api.put(f"/v1/sessions/{sid}/files/in/blob.bin", content=chunks())
    assert r.status_code == 201, r.text
    digest = hashlib.sha256(data).hexdigest()
    assert r.json() == {"path": "in/blob.bin", "size": len(data), "sha256": digest}
    digest = hashlib.sha256()
    with api.stream("GET", f"/v1/sessions/{sid}/files/in/blob.bin") as response:
        assert response.status_code == 200
        assert response.headers["content-length"] == str(len(data))
        for chunk in response.iter_bytes():
            digest.update(chunk)
    grown = rss(gateway.pid) - before
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert grown < 20 * 2**20, f"gateway RSS grew {grown / 2**20:.0f} MiB for a 50 MiB file"
    code = "import hashlib; print(hashlib.sha256(open('in/blob.bin','rb').read()).hexdigest())"
    assert text_of(run(api, sid, code)).strip() == hashlib.sha256(data).hexdigest()


def test_code_reads_an_uploaded_csv(api, session):
    sid = session["id"]
    csv = b"city,temp\nOslo,3\nLima,19\n"
    assert api.put(f"/v1/sessions/{sid}/files/data.csv", content=csv).status_code == 201
    out = run(api, sid, "import pandas as pd\nprint(pd.read_csv('data.csv').temp.sum())")
    assert text_of(out) == "22\n"


def test_files_written_by_code_are_artifacts_and_download_intact(api, session):
    sid = session["id"]
    code = (
        "import matplotlib.pyplot as plt, os\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/report.csv', 'w').write('a,b\\n1,2\\n')\n"
        "plt.plot([1, 2]); plt.savefig('out/chart.png')"
    )
    reply = run(api, sid, code)
    artifacts = {a["path"]: a for a in reply["artifacts"]}
    assert set(artifacts) == {"out/report.csv", "out/chart.png"}, reply["artifacts"]
    assert artifacts["out/report.csv"]["mime_type"] == "text/csv"
    assert artifacts["out/chart.png"]["mime_type"] == "image/png"
    assert artifacts["out/report.csv"]["change"] == "created"
    assert api.get(f"/v1/sessions/{sid}/files/out/report.csv").content == b"a,b\n1,2\n"
    png = api.get(f"/v1/sessions/{sid}/files/out/chart.png").content
    assert png.startswith(b"\x89PNG") and len(png) == artifacts["out/chart.png"]["size"]
    again = run(api, sid, "open('out/report.csv', 'a').write('3,4\\n')")
    assert [(a["path"], a["change"]) for a in again["artifacts"]] == [
        ("out/report.csv", "modified")
    ]
    assert run(api, sid, "1 + 1")["artifacts"] == []


def test_list_delete_and_missing(api, session):
    sid = session["id"]
    api.put(f"/v1/sessions/{sid}/files/d/a.txt", content=b"aaa")
    api.put(f"/v1/sessions/{sid}/files/d/sub/b.txt", content=b"b")
    listing = api.get(f"/v1/sessions/{sid}/files", params={"path": "d"}).json()["entries"]
    assert [(e["path"], e["type"], e["size"]) for e in listing] == [
        ("d/a.txt", "file", 3),
        ("d/sub", "directory", None),
    ]
    assert listing[0]["modified"].endswith("Z")
    root = api.get(f"/v1/sessions/{sid}/files").json()["entries"]
    assert [e["name"] for e in root] == ["d"]
    assert api.delete(f"/v1/sessions/{sid}/files/d/a.txt").status_code == 204
    r = api.get(f"/v1/sessions/{sid}/files/d/a.txt")
    assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found"
    r = api.get(f"/v1/sessions/{sid}/files", params={"path": "nowhere"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found"
    assert api.delete(f"/v1/sessions/{sid}/files/d").status_code == 204
    assert api.get(f"/v1/sessions/{sid}/files").json()["entries"] == []


def test_multipart_batch_upload_and_directory_archives(api, session):
    sid = session["id"]
    files = [("files", ("a.txt", b"alpha")), ("files", ("b.txt", b"beta"))]
    r = api.post(f"/v1/sessions/{sid}/files", params={"path": "batch"}, files=files)
    assert r.status_code == 201, r.text
    assert [f["path"] for f in r.json()["files"]] == ["batch/a.txt", "batch/b.txt"]
    tar_bytes = api.get(f"/v1/sessions/{sid}/files/batch", params={"format": "tar"}).content
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        assert sorted(tar.getnames()) == ["a.txt", "b.txt"]
        assert tar.extractfile("b.txt").read() == b"beta"
    zip_bytes = api.get(f"/v1/sessions/{sid}/files/batch", params={"format": "zip"}).content
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
        assert zf.read("a.txt") == b"alpha"
    r = api.get(f"/v1/sessions/{sid}/files/batch")
    assert r.status_code == 409 and "format=tar" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("../../etc/passwd", 400),
        ("a/../../etc/passwd", 400),
        ("%2Fetc%2Fpasswd", 400),
        ("nul%00byte", 400),
    ],
)
def test_paths_that_escape_are_refused(gateway, session, path, status):
    sid = session["id"]
    host, port = gateway.url.removeprefix("http://").split(":")
    for method in ("GET", "PUT", "DELETE"):
        # http.client sends the path as written; httpx would resolve the dots first.
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request(
            method,
            f"/v1/sessions/{sid}/files/{path}",
            body=b"x",
            headers={"Authorization": f"Bearer {gateway.token}"},
        )
        r = conn.getresponse()
        body = json.loads(r.read())
        conn.close()
        assert r.status == status, f"{method} {path} -> {r.status} {body}"
        assert body["error"]["code"] == "bad_request"
    api = gateway.client
    r = api.get(f"/v1/sessions/{sid}/files", params={"path": "../"})
    assert r.status_code == 400


def test_links_and_devices_made_by_the_sandbox_are_never_followed(api, session):
    sid = session["id"]
    run(
        api,
        sid,
        "import os\n"
        "os.symlink('/etc/passwd', 'passwd')\n"
        "os.symlink('/etc', 'etc')\n"
        "os.mkfifo('pipe')\n"
        "os.makedirs('real')",
    )
    for path in ("passwd", "etc/passwd", "etc/hostname"):
        r = api.get(f"/v1/sessions/{sid}/files/{path}")
        assert r.status_code == 403, f"GET {path} -> {r.status_code}: {r.content[:80]!r}"
        assert r.json()["error"]["code"] == "path_forbidden"
    r = api.put(f"/v1/sessions/{sid}/files/etc/evil", content=b"x")
    assert r.status_code == 403
    assert not os.path.exists("/etc/evil")
    r = api.get(f"/v1/sessions/{sid}/files/pipe")
    assert r.status_code == 403 and "not a regular file" in r.json()["error"]["message"]
    r = api.get(f"/v1/sessions/{sid}/files", params={"path": "etc"})
    assert r.status_code == 403
    listing = {e["name"]: e["type"] for e in api.get(f"/v1/sessions/{sid}/files").json()["entries"]}
    assert listing == {"passwd": "symlink", "etc": "symlink", "pipe": "other", "real": "directory"}
    api.put(f"/v1/sessions/{sid}/files/real/data.txt", content=b"data")
    whole = api.get(f"/v1/sessions/{sid}/files/real", params={"format": "tar"})
    with tarfile.open(fileobj=io.BytesIO(whole.content)) as tar:
        assert tar.getnames() == ["data.txt"]
    assert api.delete(f"/v1/sessions/{sid}/files/etc").status_code == 204
    assert os.path.isdir("/etc"), "deleting a link must not touch its target"


def test_upload_larger_than_the_workspace_is_refused(api, new_session):
    sid = new_session(limits={"disk": "16m"})["id"]
    r = api.put(f"/v1/sessions/{sid}/files/big.bin", content=b"x" * (20 * 2**20))
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"
    names = [e["name"] for e in api.get(f"/v1/sessions/{sid}/files").json()["entries"]]
    assert names == [], "a refused upload left a file behind"


def test_files_work_while_busy_and_after_the_kernel_died(api, session, engine):
    sid = session["id"]
    api.put(f"/v1/sessions/{sid}/files/keep.txt", content=b"keep")
    worker, _ = execute_in_background(api, sid, "import time; time.sleep(3)")
    assert api.get(f"/v1/sessions/{sid}/files/keep.txt").content == b"keep"
    worker.join()
    engine.containers.get(f"sbx-{sid}").kill()
    assert wait_for(lambda: api.get(f"/v1/sessions/{sid}").json()["state"] == "dead")
    assert api.get(f"/v1/sessions/{sid}/files/keep.txt").content == b"keep"
    api.delete(f"/v1/sessions/{sid}")
    assert api.get(f"/v1/sessions/{sid}/files/keep.txt").status_code == 404


def test_archive_of_the_workspace_skips_links_and_devices(api, session):
    sid = session["id"]
    run(api, sid, "import os\nos.symlink('/etc/passwd', 'passwd')\nos.mkfifo('pipe')")
    api.put(f"/v1/sessions/{sid}/files/ok.txt", content=b"ok")
    r = api.get(f"/v1/sessions/{sid}/files", params={"format": "tar"})
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        assert tar.getnames() == ["ok.txt"]
