"""Installing a package through the cache: cold (fetched from upstream) against cached.

Usage: .venv/bin/python bench/bench_packages.py [--package pandas]

Starts a gateway with ``--package-cache`` (devpi-server beside it, a mirror of
the index pip is configured with here), then times ``pip install --no-deps``
of ``--package`` in one network-none session (the cache fetches it) and in a
second (the cache serves it), measured inside the kernel. Prints a table and
rewrites its section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from harness import Gateway, write_section

INSTALL = (
    "import os, subprocess, sys, time\n"
    "os.makedirs('/workspace/tmp', exist_ok=True)\n"  # /tmp is a small tmpfs
    "t0 = time.perf_counter()\n"
    "done = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', "
    "'--no-cache-dir', '--target', '/workspace/pkgs', '{package}'], capture_output=True, "
    "text=True, env={{**os.environ, 'TMPDIR': '/workspace/tmp'}})\n"
    "print(done.returncode, round(time.perf_counter() - t0, 2))\n"
    "print(done.stderr[-800:])"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="pandas", help="a mid-size wheel to install")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="sbx-") as data_dir,
        Gateway(data_dir, "--pool", "", "--package-cache", "true") as gw,
    ):
        rows = []
        for label in ("cold (the cache fetches it)", "cached (a second session)"):
            sid = gw.client.post("/v1/sessions", json={"limits": {"disk": "2g"}}).json()["id"]
            t0 = time.perf_counter()
            reply = gw.client.post(
                f"/v1/sessions/{sid}/execute",
                json={"code": INSTALL.format(package=args.package), "timeout": 900},
            ).json()
            total = time.perf_counter() - t0
            text = "".join(o.get("text", "") for o in reply["outputs"])
            code, seconds = text.split("\n", 1)[0].split()
            if code != "0":
                raise SystemExit(f"pip install failed: {text}")
            rows.append(f"| {label} | {float(seconds):.1f} s | {total:.1f} s |")
            gw.client.delete(f"/v1/sessions/{sid}")
        events = gw.client.get("/v1/audit", params={"action": "package.install"}).json()
        wheel = next(e["detail"] for e in events["events"] if e["detail"]["filename"])
    body = [
        f"`pip install --no-deps {wheel['filename']}` ({wheel['size'] / 2**20:.1f} MiB)",
        "",
        "| install | pip, in the kernel | execute round trip |",
        "| --- | --- | --- |",
        *rows,
    ]
    print("\n".join(body))
    write_section(
        "bench_packages",
        "Package installs through the cache",
        "a network-none session installs through the gateway's socket and devpi-server; the "
        "cold install includes the cache's fetch from the configured index, so it depends on "
        "the upstream's speed from this machine.",
        body,
    )


if __name__ == "__main__":
    main()
