"""What recording an execution's file changes costs, on a workspace of 10,000 files.

Usage: .venv/bin/python bench/bench_file_changes.py [--n 30] [--files 10000]

Each execute ends with a bounded walk of the workspace (in a worker thread
past 64 entries) and hashes the files it changed. Measured on a real
gateway: execute round trips in an empty workspace and in one of
``--files`` files, for code that changes nothing, that modifies one file,
that creates 100 files of 10 KiB, and that deletes 100. Prints a table and
rewrites its section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import tempfile

from harness import Gateway, median, pct, timed, write_section

CASES = {
    "changes nothing (`1 + 1`)": "1 + 1",
    "modifies one file": "open('touch.txt', 'a').write('x')",
    "replaces 100 files of 10 KiB (100 deleted, 100 created)": (
        "import os, shutil\nshutil.rmtree('made', ignore_errors=True); os.makedirs('made')\n"
        "for i in range(100): open(f'made/{i}-{_n}.bin', 'wb').write(os.urandom(10240))\n_n += 1"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30, help="executes per case")
    parser.add_argument("--files", type=int, default=10_000, help="files in the large workspace")
    args = parser.parse_args()
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="sbx-") as data_dir,
        Gateway(data_dir, "--pool", "") as gw,
    ):
        client = gw.client

        def execute(sid: str, code: str) -> dict:
            r = client.post(f"/v1/sessions/{sid}/execute", json={"code": code, "timeout": 600})
            r.raise_for_status()
            return r.json()

        sessions = {}
        for label, files in (("empty", 0), (f"{args.files:,} files", args.files)):
            sid = client.post("/v1/sessions", json={"limits": {"disk": "2g"}}).json()["id"]
            execute(
                sid,
                "import os\n_n = 0\n"
                f"for i in range({files}):\n"
                "    d = f'tree/{i // 100}'\n"
                "    os.makedirs(d, exist_ok=True)\n"
                "    open(f'{d}/{i}.txt', 'w').write(str(i))",
            )
            execute(sid, "1 + 1")  # the walk after the fill is the next baseline
            sessions[label] = sid
        for case, code in CASES.items():
            medians = []
            for sid in sessions.values():
                times = timed(lambda s=sid, c=code: execute(s, c), args.n, warmup=3)
                medians.append((median(times), pct(times, 0.9)))
            rows.append(
                f"| {case} | {medians[0][0]:.1f} ms (p90 {medians[0][1]:.1f}) "
                f"| {medians[1][0]:.1f} ms (p90 {medians[1][1]:.1f}) |"
            )
        check = execute(sessions[f"{args.files:,} files"], "open('one.txt', 'w').write('1')")
        assert [f["path"] for f in check["files"]] == ["one.txt"], check["files"]
        assert not check["artifacts_truncated"], "the walk of the large workspace was cut"
    body = [
        f"| execute that | empty workspace | workspace of {args.files:,} files |",
        "| --- | --- | --- |",
        *rows,
    ]
    print("\n".join(body))
    write_section(
        "bench_file_changes",
        "Recording file changes",
        f"median execute round trip over HTTP of {args.n} per case. Every execute's reply "
        "and history record carry the files it created, modified or deleted with sizes and "
        "SHA-256; the large workspace is walked in a worker thread, so the event loop is "
        "never held by it.",
        body,
    )


if __name__ == "__main__":
    main()
