"""A named volume's read and write throughput beside the workspace's, in one run.

Usage: .venv/bin/python bench/bench_volumes.py [--mib 256] [--rounds 3]

One gateway, one session whose workspace and a mounted volume (both
loop-mounted ext4 images, the volume bound in under ``vol/``) are measured
side by side, each round alternating which goes first: from the kernel,
a sequential write of ``--mib`` MiB (fsynced), its read back (from the page
cache: nothing here can drop it), and 2,000 files of 4 KiB written; over
HTTP, a 64 MiB upload and its download through the session's files API and
through the volume's (no session). Prints a table and rewrites its section
of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from harness import Gateway, median, write_section

KERNEL = """
import json, os, time
def measure(root, mib):
    block = os.urandom(1 << 20)
    path = os.path.join(root, 'bench.bin')
    t0 = time.perf_counter()
    with open(path, 'wb') as f:
        for _ in range(mib):
            f.write(block)
        f.flush(); os.fsync(f.fileno())
    write = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(path, 'rb') as f:
        while f.read(1 << 20):
            pass
    read = time.perf_counter() - t0
    os.unlink(path)
    small = os.path.join(root, 'small')
    os.makedirs(small, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(2000):
        with open(os.path.join(small, str(i)), 'wb') as f:
            f.write(block[:4096])
    os.sync()
    files = time.perf_counter() - t0
    for i in range(2000):
        os.unlink(os.path.join(small, str(i)))
    return {'write': mib / write, 'read': mib / read, 'files': 2000 / files}
print(json.dumps({root: measure(root, MIB) for root in ORDER}))
"""


def kernel_round(gw: Gateway, sid: str, mib: int, order: list[str]) -> dict[str, dict]:
    code = f"MIB = {mib}\nORDER = {order!r}\n" + KERNEL
    r = gw.client.post(f"/v1/sessions/{sid}/execute", json={"code": code, "timeout": 600})
    r.raise_for_status()
    reply = r.json()
    if reply["status"] != "ok":
        raise SystemExit(f"the kernel's round failed: {reply['error']}")
    return json.loads(reply["outputs"][0]["text"])


def http_round(gw: Gateway, base: str, data: bytes) -> tuple[float, float]:
    """MiB/s of one upload and one download of ``data`` under ``base`` (a files URL)."""
    mib = len(data) / 2**20
    t0 = time.perf_counter()
    gw.client.put(f"{base}/bench.bin", content=data).raise_for_status()
    up = mib / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    got = gw.client.get(f"{base}/bench.bin")
    got.raise_for_status()
    down = mib / (time.perf_counter() - t0)
    assert len(got.content) == len(data)
    gw.client.delete(f"{base}/bench.bin").raise_for_status()
    return up, down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB written per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = os.urandom(64 << 20)
    results: dict[str, dict[str, list[float]]] = {"workspace": {}, "volume": {}}

    def keep(where: str, what: str, value: float) -> None:
        results[where].setdefault(what, []).append(value)

    with (
        tempfile.TemporaryDirectory(prefix="sbx-") as data_dir,
        Gateway(data_dir, "--pool", "") as gw,
    ):
        size = f"{args.mib * 2 + 256}m"
        gw.client.post("/v1/volumes", json={"name": "bench", "size": size}).raise_for_status()
        body = {"limits": {"disk": size}, "volumes": [{"name": "bench", "path": "vol"}]}
        r = gw.client.post("/v1/sessions", json=body)
        r.raise_for_status()
        sid = r.json()["id"]
        try:
            for n in range(args.rounds):
                order = ["/workspace", "/workspace/vol"][:: 1 if n % 2 == 0 else -1]
                for root, got in kernel_round(gw, sid, args.mib, order).items():
                    where = "volume" if root.endswith("/vol") else "workspace"
                    for what, value in got.items():
                        keep(where, what, value)
                bases = [("workspace", f"/v1/sessions/{sid}/files"),
                         ("volume", "/v1/volumes/bench/files")]  # fmt: skip
                for where, base in bases[:: 1 if n % 2 == 0 else -1]:
                    up, down = http_round(gw, base, data)
                    keep(where, "upload", up)
                    keep(where, "download", down)
        finally:
            gw.client.delete(f"/v1/sessions/{sid}")
            gw.client.delete("/v1/volumes/bench")

    labels = {
        "write": f"kernel: sequential write, {args.mib} MiB, fsynced (MiB/s)",
        "read": "kernel: read it back, page cache (MiB/s)",
        "files": "kernel: 4 KiB files written, then sync (files/s)",
        "upload": "HTTP: 64 MiB upload, streamed (MiB/s)",
        "download": "HTTP: 64 MiB download, streamed (MiB/s)",
    }
    rows = [
        f"| {label} | {median(results['workspace'][k]):,.0f} | {median(results['volume'][k]):,.0f} "
        f"| {median(results['volume'][k]) / median(results['workspace'][k]):.2f} |"
        for k, label in labels.items()
    ]
    body = ["| measure (median) | workspace | volume | volume / workspace |",
            "| --- | --- | --- | --- |", *rows]  # fmt: skip
    print("\n".join(body))
    write_section(
        "bench_volumes",
        "Named volumes against the workspace",
        f"median of {args.rounds} rounds, each alternating which goes first. Both are "
        "loop-mounted ext4 images on the same host disk; the volume is bound into the "
        "sandbox under the workspace, and its HTTP transfers need no session. The target: "
        "a volume as fast as the workspace (a ratio near 1; on this shared machine a "
        "run's ratios move by up to a quarter either way from the one before).",
        body,
    )


if __name__ == "__main__":
    main()
