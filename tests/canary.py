"""Watching a gateway while something heavy or hostile runs on it.

A ``Canary`` keeps a trivial execute going in a session of its own and
fails the test when one answer takes longer than its bound (liveness, on a
shared machine, not a performance target); ``memory_kib`` and
``reset_peak_memory`` read how far the gateway's memory grew meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
from helpers import GatewayProcess, run, text_of, wait_for

CANARY_SECONDS = 2.0


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


def reset_peak_memory(pid: int) -> None:
    """Make VmHWM start again from the current RSS (Linux ``clear_refs`` 5; needs root)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


@contextlib.contextmanager
def canary_session(gw: GatewayProcess) -> Iterator[str]:
    """A session of its own where ``alive = 42`` ran; deleted afterwards."""
    r = gw.client.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    run(gw.client, sid, "alive = 42")
    yield sid
    gw.client.delete(f"/v1/sessions/{sid}")


class Canary:
    """Runs ``print(alive)`` in a loop on its own connection, keeping the slowest answer.

    ``sid`` names a session where ``alive = 42`` ran.
    """

    def __init__(self, gw: GatewayProcess, sid: str, bound: float = CANARY_SECONDS) -> None:
        self.gw, self.sid, self.bound = gw, sid, bound
        self.slowest = 0.0
        self.answers = 0
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        headers = {"Authorization": f"Bearer {self.gw.token}"}
        with httpx.Client(base_url=self.gw.url, headers=headers, timeout=30) as api:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    reply = run(api, self.sid, "print(alive)")
                except Exception as e:  # the test asserts on it
                    self.failure = repr(e)
                    return
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answers += 1
                if text_of(reply) != "42\n":
                    self.failure = f"the canary lost its state: {reply}"
                    return

    def __enter__(self) -> Canary:
        self._thread.start()
        assert wait_for(lambda: self.answers or self.failure, 30), "the canary never answered"
        return self

    def __exit__(self, *exc) -> None:
        # One more answer once the load is over, however fast it went.
        after = self.answers + 1
        wait_for(lambda: self.answers >= after or self.failure, 30)
        self._stop.set()
        self._thread.join(60)
        print(f"canary: {self.answers} answers, slowest {self.slowest * 1000:.0f} ms")
        assert self.failure is None, f"the canary session failed meanwhile: {self.failure}"
        assert self.slowest < self.bound, (
            f"the canary took {self.slowest:.2f} s to answer a trivial execute meanwhile"
        )
