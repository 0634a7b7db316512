"""A policy's patterns are evaluated in bounded time, whoever wrote them (issue 35, item 3).

A tenant's policy file and a session's own policy carry regular expressions
the gateway matches against every cell of a non-Python kernel. A pattern that
backtracks catastrophically must not hold the gateway, and one that cannot be
matched in bounded time is refused when the policy is read, naming it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

import pytest

from gateway.errors import PolicyInvalid
from gateway.policy import scan
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.model import Policy, session_policy
from gateway.policy.scan import ScanFailed, Scanner

# Python's backtracking engine takes about 2**n steps on this pattern and input:
# at 40 it would not end today, and it holds the interpreter's lock while it runs.
CATASTROPHIC = {"rule": "shell", "regex": r"(\w+\s?)+$", "kernels": ["bash"]}
CELL = "x" * 40 + "!"
BOUND = 5.0  # seconds: generous on a shared machine, never reached by a linear matcher


def _evaluate(conn) -> None:
    """In a process of its own: read a policy, say so, then scan the cell it is sent."""
    policy = session_policy({"mode": "enforce", "rules": {}, "patterns": [CATASTROPHIC]})
    scanner = Scanner()
    conn.send("ready")
    code = conn.recv()
    findings = scanner.scan(code, "bash", policy.patterns)
    conn.send(len(findings))


def test_a_catastrophic_pattern_is_matched_in_bounded_time() -> None:
    # In a process, not a thread: a backtracking match holds the interpreter's lock,
    # so a thread's timeout would only fire once the match was over.
    parent, child = multiprocessing.get_context("spawn").Pipe()
    process = multiprocessing.get_context("spawn").Process(target=_evaluate, args=(child,))
    process.start()
    try:
        assert parent.poll(60) and parent.recv() == "ready", "the evaluator never started"
        parent.send(CELL)
        assert parent.poll(BOUND), (
            f"matching a 41-character cell against {CATASTROPHIC['regex']!r} "
            f"took over {BOUND:.0f} s (catastrophic backtracking)"
        )
        assert parent.recv() == 0
    finally:
        process.kill()
        process.join()


@pytest.mark.parametrize(
    ("regex", "words"),
    [
        (r"(a)\1", "RE2"),  # a backreference: no linear-time matcher has them
        (r"foo(?=bar)", "RE2"),  # lookaround likewise
        ("a" * (scan.MAX_PATTERN_CHARS + 1), f"longer than {scan.MAX_PATTERN_CHARS}"),
        (r"[a-z]{400}", "too complex"),
        ("((", "not valid"),
    ],
)
def test_a_pattern_that_cannot_be_matched_in_bounded_time_is_refused_by_name(regex, words):
    with pytest.raises(PolicyInvalid) as e:
        session_policy({"patterns": [{"rule": "shell", "regex": regex}]})
    assert e.value.status == 400
    assert repr(regex)[:40] in e.value.message and words in e.value.message, e.value.message
    text = f"[[patterns]]\nrule = 'shell'\nregex = '''{regex}'''\n"
    with pytest.raises(PolicyInvalid, match="line 3") as e:
        Policy.parse(text, "toml", "acme.toml")
    assert words in e.value.message, e.value.message


def test_a_policy_has_a_bounded_number_of_patterns(tmp_path) -> None:
    many = [{"rule": "shell", "regex": f"word{n}"} for n in range(scan.MAX_PATTERNS + 1)]
    with pytest.raises(PolicyInvalid, match=f"at most {scan.MAX_PATTERNS} patterns"):
        session_policy({"patterns": many})
    (tmp_path / "acme.yaml").write_text(
        "patterns:\n" + "".join(f"  - {{rule: shell, regex: word{n}}}\n" for n in range(40))
    )
    with pytest.raises(PolicyInvalid, match=f"acme.yaml.*at most {scan.MAX_PATTERNS}"):
        PolicyBook(tmp_path).load()


def test_findings_of_a_pattern_are_bounded() -> None:
    policy = session_policy({"patterns": [{"rule": "shell", "regex": "x"}]})
    findings = Scanner().scan("x x x\n" * 10_000, "bash", policy.patterns)
    assert len(findings) == scan.MAX_FINDINGS
    assert [f.line for f in findings] == list(range(1, scan.MAX_FINDINGS + 1))


def test_a_cell_too_large_for_the_policys_patterns_fails_the_scan() -> None:
    policy = session_policy({"patterns": [{"rule": "shell", "regex": r"a[ab]{100}c"}] * 8})
    cell = "ab" * (scan.MATCH_BUDGET // 1_000)
    with pytest.raises(ScanFailed, match="too large to match"):
        Scanner().scan(cell, "bash", policy.patterns)


def test_patterns_are_matched_off_the_event_loop(tmp_path) -> None:
    seen = []

    class Watching(Scanner):
        def scan(self, code, language, patterns=()):
            seen.append(threading.current_thread() is threading.main_thread())
            return super().scan(code, language, patterns)

    gate = Gate(PolicyBook(tmp_path), Watching(), ApprovalDesk(None, 1, bool))  # type: ignore[arg-type]
    asyncio.run(gate.review("acme", None, "bash", "echo hi"))
    asyncio.run(gate.review("acme", None, "python", "print(1)"))
    assert seen == [False, True], "bash is matched on a thread, Python scanned on the loop"
