"""What a connection to one kernel socket offers the gateway's channels, whatever carries it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class KernelLink(Protocol):
    """One of the gateway's connections to a kernel socket: shell (DEALER) or iopub (SUB)."""

    def start(self, deliver: Callable[[list[bytes]], None]) -> None:
        """Hand each whole message (its frames) to ``deliver`` from now on."""

    def send(self, frames: list[bytes]) -> object:
        """Queue a message without blocking; RuntimeError if the kernel reads none.

        Returns what ``withdraw`` takes back.
        """

    def withdraw(self, sent: object) -> None:
        """Take back a message the kernel has not been sent yet: its caller gave up.

        Sent when the kernel came back, it would run code whose caller was
        told it failed.
        """

    def poke(self) -> None:
        """Read whatever waits, whether or not its readiness was seen."""

    def close(self) -> None: ...
