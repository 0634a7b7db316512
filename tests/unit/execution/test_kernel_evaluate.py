"""The gateway's own code in a kernel (a checkpoint's dump, a comeback's load) and its death."""

from __future__ import annotations

import asyncio

import pytest

from gateway.execution.kernel import Kernel


class Request:
    """A request whose reply never comes: the kernel died before it answered."""

    msg_id = "m"

    def __init__(self) -> None:
        self.reply: asyncio.Future = asyncio.get_running_loop().create_future()

    async def wait_reply(self, timeout: float):
        await asyncio.sleep(timeout)
        return None

    def close(self) -> None:
        pass


class Manager:
    def __init__(self, alive: bool) -> None:
        self.alive = alive
        self.asked = 0

    async def is_alive(self) -> bool:
        self.asked += 1
        return self.alive


def kernel(alive: bool) -> Kernel:
    """A Kernel without its jupyter_client manager: only what ``evaluate`` reaches."""
    k = Kernel.__new__(Kernel)
    k.manager = Manager(alive)  # type: ignore[assignment]
    k.died = asyncio.Event()
    k._request = lambda *a, **kw: Request()  # type: ignore[method-assign]
    return k


def test_a_kernel_that_dies_under_the_gateways_code_fails_it_at_once_not_at_its_timeout():
    # A namespace whose load kills the kernel (a __reduce__ calling os._exit, or out of
    # memory) held a comeback 'starting', and every execute queued behind it, for 300 s.
    async def scenario() -> float:
        k = kernel(alive=False)
        started = asyncio.get_running_loop().time()
        with pytest.raises(RuntimeError, match="died"):
            await asyncio.wait_for(k.evaluate("load()", "1", timeout=300.0), 10.0)
        return asyncio.get_running_loop().time() - started

    assert asyncio.run(scenario()) < 3.0


def test_a_live_kernel_still_gets_its_whole_timeout():
    async def scenario() -> int:
        k = kernel(alive=True)
        with pytest.raises(TimeoutError, match=r"no answer within 1\.5 s"):
            await k.evaluate("dump()", "1", timeout=1.5)
        return k.manager.asked  # type: ignore[attr-defined]

    assert asyncio.run(scenario()) >= 1


class LateRequest(Request):
    """A request answered after 5.2 s: a loaded host's kernel, slow but alive."""

    async def wait_reply(self, timeout: float):
        left = self.at - asyncio.get_running_loop().time()
        if left > timeout:
            await asyncio.sleep(timeout)
            return None
        await asyncio.sleep(max(0.0, left))
        return {"status": "ok"}


def test_setup_code_answered_late_by_a_live_kernel_is_waited_for_up_to_the_start_timeout():
    """schemathesis on a loaded CI host got a 503 'the kernel refused its setup code: None'
    from an execute: the gateway's own code in a live kernel got 5 s, whatever the kernel's
    start timeout, and a late reply was called a refusal."""

    async def scenario() -> None:
        k = kernel(alive=True)
        k.start_timeout = 30.0

        def late(*a, **kw) -> LateRequest:
            request = LateRequest()
            request.at = asyncio.get_running_loop().time() + 5.2
            return request

        k._request = late  # type: ignore[method-assign]
        await k.run_silently("setup()")

    asyncio.run(scenario())
