"""A tenant's policy bounds the tools its sessions' code calls: a ``[tools]`` table of tool
names (shell-style patterns) and actions that a session's own tool rules cannot loosen."""

from __future__ import annotations

import pytest

from gateway.errors import PolicyInvalid
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.model import Policy
from gateway.policy.scan import Scanner

POLICY = """
mode = "enforce"
[tools]
"drop_*" = "deny"
"post_result" = "hold"
"""


def gate(tmp_path, text: str = POLICY) -> Gate:
    (tmp_path / "acme.toml").write_text(text)
    book = PolicyBook(tmp_path)
    book.load()
    return Gate(book, Scanner(), ApprovalDesk(None, 1, bool))  # type: ignore[arg-type]


def test_a_session_cannot_loosen_what_its_tenants_policy_says_of_a_tool(tmp_path):
    g = gate(tmp_path)
    assert g.review_tool("acme", None, "drop_orders", "allow").action == "deny"
    held = g.review_tool("acme", None, "post_result", "allow")
    assert held.action == "hold" and "tenant" in held.reasons[0]
    assert g.review_tool("acme", None, "query", "allow").action == "allow"
    assert g.review_tool("acme", None, "query", "hold").action == "hold"  # a session tightens
    assert g.review_tool("acme", None, "post_result", "deny").action == "deny"


def test_in_report_mode_the_tenants_tool_rules_are_reported_not_enforced(tmp_path):
    g = gate(tmp_path, POLICY.replace("enforce", "report"))
    decision = g.review_tool("acme", None, "drop_orders", "allow")
    assert decision.action == "allow" and decision.verdict == "deny"


def test_a_malformed_tools_table_is_refused_with_its_line():
    with pytest.raises(PolicyInvalid, match=r"line 3.*allow, hold, deny"):
        Policy.parse('mode = "enforce"\n[tools]\n"x" = "maybe"\n', "toml")
    with pytest.raises(PolicyInvalid, match="tools is a table"):
        Policy.parse('tools = ["x"]\n', "toml")
