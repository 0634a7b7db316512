"""A command's output is masked as one text per stream, however its reads cut it."""

from __future__ import annotations

import asyncio

from gateway.masking import Masker
from gateway.sessions.commands import Command
from gateway.sessions.requests import StartCommand
from gateway.tasks import TaskSet

VALUE = "wh-7Qx9/z+Lk2=pass&wordé"


class Process:
    """A SandboxProcess that says the given pieces, pausing where one is a number (seconds)."""

    pid = 7

    def __init__(self, pieces: list) -> None:
        self.pieces = list(pieces)

    async def read(self):
        if self.pieces and isinstance(self.pieces[0], float):
            await asyncio.sleep(self.pieces.pop(0))
        return self.pieces.pop(0) if self.pieces else None

    async def wait(self) -> int:
        return 0

    def close(self) -> None:
        pass


async def said(pieces: list) -> tuple[dict[str, bytes], list]:
    command = Command(Process(pieces), StartCommand(argv=["sh"]), TaskSet(), Masker({"KEY": VALUE}))
    listener = command.listen()
    heard: list = []
    while (item := await listener.next(5)) is not None:
        heard.append(item)
    joined = {"stdout": b"", "stderr": b""}
    for kind, data in heard:
        joined[kind] += data
    return joined, heard


def test_a_secret_split_between_reads_is_masked() -> None:
    raw = VALUE.encode()
    for cut in (1, 5, len(raw) - 2, len(raw) - 1):  # the last ones cut the é in two
        joined, _ = asyncio.run(
            said([("stdout", b"key=" + raw[:cut]), ("stderr", b"x"), ("stdout", raw[cut:] + b"\n")])
        )
        assert joined == {"stdout": b"key=***KEY***\n", "stderr": b"x"}, cut


def test_held_back_output_is_let_out_when_the_command_goes_quiet() -> None:
    joined, heard = asyncio.run(said([("stdout", b"prompt wh-7"), 1.0, ("stdout", b"!\n")]))
    assert heard[:2] == [("stdout", b"prompt "), ("stdout", b"wh-7")], "a prompt waits no second"
    assert joined["stdout"] == b"prompt wh-7!\n"
