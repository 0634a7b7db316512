"""What masking sealed secrets costs an execute: none without secrets, five with.

Usage: .venv/bin/python bench/bench_secrets.py [--n 300]

Measures, on this machine: the masking work alone (an ``OutputCollector``
fed a trivial execute's messages, and a 64 KiB stream chunk) without a
masker and with one of five secrets; and trivial execute round trips over
HTTP on a real gateway, in a session without secrets and in one given five,
taken in alternation so drift in the machine's load hits both alike.
Prints a table and rewrites its section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time

from harness import Gateway, median, pct, round_trips, write_section

from gateway.execution.outputs import OutputCollector
from gateway.masking import NO_SECRETS, Masker

FIVE = {f"KEY_{i}": secrets.token_urlsafe(24) for i in range(5)}


def trivial_messages() -> list[dict]:
    """What a kernel sends for ``print('hi'); 1 + 1``: a stream and a result."""
    return [
        {"header": {"msg_type": "stream"}, "content": {"name": "stdout", "text": "hi\n"}},
        {
            "header": {"msg_type": "execute_result"},
            "content": {"execution_count": 1, "data": {"text/plain": "2"}, "metadata": {}},
        },
    ]


def collect_us(masker: Masker, messages: list[dict], n: int) -> list[float]:
    """Microseconds to fold ``messages`` into a fresh collector and finish it, ``n`` times."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        collector = OutputCollector(1 << 20, mask=masker)
        for msg in messages:
            collector.add_message(msg)
        collector.finish()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="round trips per session")
    args = parser.parse_args()

    five = Masker(FIVE)
    chunk = [{"header": {"msg_type": "stream"}, "content": {"name": "stdout", "text": "x" * 65536}}]
    rows = []
    for label, messages in (
        ("trivial execute's outputs", trivial_messages()),
        ("64 KiB stream chunk", chunk),
    ):
        none = collect_us(NO_SECRETS, messages, 2000)
        masked = collect_us(five, messages, 2000)
        rows.append(
            f"| masking work: {label} | {median(none):.1f} µs | {median(masked):.1f} µs "
            f"| {median(masked) - median(none):+.1f} µs |"
        )

    with (
        tempfile.TemporaryDirectory(prefix="sbx-") as data_dir,
        Gateway(data_dir, "--pool", "") as gw,
    ):
        for name, value in FIVE.items():
            gw.client.post("/v1/secrets", json={"name": name, "value": value}).raise_for_status()
        plain = gw.client.post("/v1/sessions", json={}).json()["id"]
        sealed = gw.client.post("/v1/sessions", json={"secrets": list(FIVE)}).json()["id"]
        without, with_five = [], []
        for _ in range(args.n // 10):  # alternate in blocks of ten
            without += round_trips(gw.client, plain, 10)
            with_five += round_trips(gw.client, sealed, 10)
    rows.append(
        f"| execute `1 + 1` over HTTP, median | {median(without):.2f} ms | "
        f"{median(with_five):.2f} ms | {median(with_five) - median(without):+.2f} ms |"
    )
    rows.append(
        f"| execute `1 + 1` over HTTP, p99 | {pct(without, 0.99):.2f} ms | "
        f"{pct(with_five, 0.99):.2f} ms | {pct(with_five, 0.99) - pct(without, 0.99):+.2f} ms |"
    )
    body = [
        "| measure | no secrets | five secrets | difference |",
        "| --- | --- | --- | --- |",
        *rows,
    ]
    print("\n".join(body))
    write_section(
        "bench_secrets",
        "Masking sealed secrets",
        f"{args.n} round trips per session, alternating in blocks of ten; masking work "
        "median of 2000. Without secrets no masker runs at all (the target: no measurable "
        "cost); with five the target is at most 0.5 ms per execute.",
        body,
    )


if __name__ == "__main__":
    main()
