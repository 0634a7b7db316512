"""What the gate judges apart: user expressions one by one, and the kernel's debugger.

A Jupyter execute's user expressions are evaluated by the kernel each on its
own; joined to the cell for one scan, expressions of unclosed quotes turned a
shell call between them into a string. A debugger evaluates what it is sent
where no scan reads it, so a policy that gates code refuses it.
"""

from __future__ import annotations

import asyncio

from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.model import session_policy
from gateway.policy.scan import Scanner

STRICT = session_policy({"mode": "enforce", "rules": {"shell": "deny"}})
HIDING = ("'''", "os.system('id')", "'''")


def gate(tmp_path) -> Gate:
    """Tenant ``open`` enforces a policy that allows everything; others have the built-in one."""
    (tmp_path / "open.toml").write_text('mode = "enforce"\n')
    book = PolicyBook(tmp_path)
    book.load()
    return Gate(book, Scanner(), ApprovalDesk(None, 1, bool))  # type: ignore[arg-type]


def test_each_user_expression_is_scanned_alone(tmp_path) -> None:
    g = gate(tmp_path)
    joined = "\n".join(["import os", *HIDING])
    hidden = asyncio.run(g.review("acme", STRICT, "python", joined))
    assert hidden.action == "allow", "joined, the shell call reads as a string"
    decision = asyncio.run(g.review("acme", STRICT, "python", "import os", apart=HIDING))
    assert decision.action == "deny", decision
    assert any("shell" in reason for reason in decision.reasons), decision.reasons


def test_the_debugger_is_refused_under_a_policy_that_gates_code(tmp_path) -> None:
    g = gate(tmp_path)
    refused = g.review_debugger("acme", STRICT)
    assert refused.action == "deny"
    assert "debugger" in refused.reasons[0] and "shell" in refused.reasons[0], refused.reasons
    assert g.review_debugger("open", None).action == "allow"
    assert g.review_debugger("open", STRICT).action == "deny", "a session's policy tightens"
    assert g.review_debugger("acme", None).action == "allow", "the built-in policy only reports"
