"""npm installs through the cache: cold (fetched from upstream) against cached.

Usage: .venv/bin/python bench/bench_npm_packages.py [--package typescript --package express]

Starts a gateway with ``--npm-cache`` (verdaccio beside it, a caching proxy of
the registry npm is configured with here), then, for each ``--package``, times
``npm install`` in one network-none JavaScript session (the cache fetches
every tarball) and in a second (the cache serves them), measured inside the
kernel. Prints a table and rewrites its section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from harness import Gateway, write_section

INSTALL = (
    "var t0 = Date.now();\n"
    "var done = require('child_process').spawnSync('npm', ['install', '--no-save', "
    "'--prefix', '/workspace', '{package}'], {{encoding: 'utf8'}});\n"
    "console.log(done.status, ((Date.now() - t0) / 1000).toFixed(2));\n"
    "console.log(done.stderr.slice(-800));"
)
SESSION = {
    "kernel": "javascript",
    "limits": {"disk": "2g"},
    "env": {"npm_config_cache": "/workspace/.npm"},  # /tmp is a small tmpfs
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", action="append", help="packages to install (repeat)")
    args = parser.parse_args()
    packages = args.package or ["typescript", "express"]
    with (
        tempfile.TemporaryDirectory(prefix="sbx-") as data_dir,
        Gateway(data_dir, "--pool", "", "--npm-cache", "true") as gw,
    ):
        rows = []
        for package in packages:
            for label in ("cold (the cache fetches it)", "cached (a second session)"):
                sid = gw.client.post("/v1/sessions", json=SESSION).json()["id"]
                t0 = time.perf_counter()
                reply = gw.client.post(
                    f"/v1/sessions/{sid}/execute",
                    json={"code": INSTALL.format(package=package), "timeout": 900},
                ).json()
                total = time.perf_counter() - t0
                text = "".join(o.get("text", "") for o in reply["outputs"])
                code, seconds = text.split("\n", 1)[0].split()
                if code != "0":
                    raise SystemExit(f"npm install failed: {text}")
                events = gw.client.get(
                    "/v1/audit", params={"action": "package.install", "session_id": sid}
                ).json()["events"]
                gw.client.delete(f"/v1/sessions/{sid}")
                size = sum(e["detail"]["size"] for e in events) / 2**20
                cached = sum(e["detail"]["cached"] for e in events)
                rows.append(
                    f"| `{package}` | {label} | {len(events)} ({size:.1f} MiB), {cached} cached "
                    f"| {float(seconds):.1f} s | {total:.1f} s |"
                )
    body = [
        "| package | install | tarballs | npm, in the kernel | execute round trip |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ]
    print("\n".join(body))
    write_section(
        "bench_npm_packages",
        "npm installs through the cache",
        "a network-none JavaScript session runs `npm install` through the gateway's socket "
        "and verdaccio; the cold install includes the cache's fetch of each tarball and "
        "package document from the configured registry, so it depends on the upstream's "
        "speed from this machine.",
        body,
    )


if __name__ == "__main__":
    main()
