"""A self-correcting coding loop: generate code, run it, feed the error back, retry.

The code generator is a plain function ``(task, last_attempt) -> code``; in
real use it calls a model with the task and, after a failure, the traceback
the sandbox returned. Here it is ``scripted_generator``, deterministic: its
first try has a bug and it fixes the bug from the error it is shown::

    python examples/self_correcting_loop.py --url http://127.0.0.1:8765
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from gateway.client import Execution, Session

TASK = "Print the mean of the numbers in numbers.txt (one per line), rounded to 2 places."
NUMBERS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


@dataclasses.dataclass
class Attempt:
    code: str
    execution: Execution

    @property
    def feedback(self) -> str:
        """What the generator is told about a failed attempt: the traceback, else the output."""
        if self.execution.error is not None:
            return self.execution.error.text
        return f"no error, but the output was {self.execution.stdout!r}"


Generator = Callable[[str, Attempt | None], str]
Check = Callable[[Execution], bool]


class GaveUp(Exception):
    def __init__(self, attempts: list[Attempt]) -> None:
        super().__init__(f"no working code after {len(attempts)} attempts")
        self.attempts = attempts


def solve(
    session: Session, task: str, generate: Generator, check: Check, max_attempts: int = 3
) -> list[Attempt]:
    """Run generated code until it passes ``check``; return every attempt, the last one good."""
    attempts: list[Attempt] = []
    for number in range(1, max_attempts + 1):
        code = generate(task, attempts[-1] if attempts else None)
        execution = session.run(code, timeout=30, description=f"### Attempt {number}\n{task}")
        attempts.append(Attempt(code, execution))
        if execution.ok and check(execution):
            return attempts
    raise GaveUp(attempts)


def scripted_generator(task: str, last: Attempt | None) -> str:
    """Stands in for a model: wrong the first time, right once it sees the TypeError."""
    if last is None:
        return (
            "values = open('numbers.txt').read().split()\n"
            "print(round(sum(values) / len(values), 2))"
        )
    if "TypeError" in last.feedback:
        return (
            "values = [float(v) for v in open('numbers.txt').read().split()]\n"
            "print(round(sum(values) / len(values), 2))"
        )
    raise RuntimeError(f"the scripted generator has no fix for:\n{last.feedback}")


def expected_output(execution: Execution) -> bool:
    """The agent's acceptance test: the printed mean is the right number."""
    try:
        return float(execution.stdout) == round(sum(NUMBERS) / len(NUMBERS), 2)
    except ValueError:
        return False


def run(
    url: str | None, token: str | None, generate: Generator = scripted_generator
) -> list[Attempt]:
    with Session.create(url, token, ttl=300, metadata={"agent": "self-correcting"}) as session:
        session.files.write("numbers.txt", "\n".join(map(str, NUMBERS)))
        attempts = solve(session, TASK, generate, expected_output)
    for number, attempt in enumerate(attempts, 1):
        error = attempt.execution.error
        print(f"attempt {number}: {attempt.execution.status}" + (f" ({error})" if error else ""))
    print(f"solved on attempt {len(attempts)}: {attempts[-1].execution.stdout.strip()}")
    return attempts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="gateway URL (default: SBX_URL or http://127.0.0.1:8765)")
    parser.add_argument("--token", help="bearer token (default: SBX_TOKEN)")
    args = parser.parse_args(argv)
    try:
        run(args.url, args.token)
    except GaveUp as e:
        print(f"{e}; last error:\n{e.attempts[-1].feedback}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
