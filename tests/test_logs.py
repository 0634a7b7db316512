"""The gateway's log handler: a turn's lines in one write, none lost or reordered."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

from gateway.observe.logs import TurnBufferedHandler


class _Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def _logger(stream: _Writes) -> tuple[logging.Logger, TurnBufferedHandler]:
    handler = TurnBufferedHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(f"test-logs-{id(stream)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, handler


def test_lines_logged_in_one_turn_of_the_loop_are_written_once_at_its_end():
    stream = _Writes()
    log, _ = _logger(stream)

    async def scenario() -> tuple[str, int]:
        log.info("access")
        log.info("audit")
        during = stream.getvalue()  # nothing yet: the turn is not over
        await asyncio.sleep(0)
        return during, stream.writes

    during, writes = asyncio.run(scenario())
    assert during == ""
    assert (stream.getvalue(), writes) == ("access\naudit\n", 1)


def test_lines_logged_off_the_loop_are_written_at_once_with_what_the_loop_has_waiting():
    stream = _Writes()
    log, handler = _logger(stream)

    async def scenario() -> str:
        log.info("on the loop")
        thread = threading.Thread(target=log.info, args=("on a thread",))
        thread.start()
        thread.join()
        return stream.getvalue()

    assert asyncio.run(scenario()) == "on the loop\non a thread\n"
    log.info("no loop at all")
    assert stream.getvalue().endswith("no loop at all\n")
    handler.close()


def test_what_waits_when_the_loop_ends_is_written_by_logging_shutdown():
    stream = _Writes()
    log, handler = _logger(stream)

    loop = asyncio.new_event_loop()
    loop.call_soon(log.info, "stopping")
    loop.call_soon(loop.stop)  # the loop ends with this turn: its flush never runs
    loop.run_forever()
    loop.close()
    assert stream.getvalue() == ""
    logging.shutdown([lambda: handler])  # as at exit, over this handler alone
    assert stream.getvalue() == "stopping\n"
