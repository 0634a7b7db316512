"""The gate every execute passes: its tenant's policy, tightened by its session's, on a scan.

Scanning a Python cell takes tens of microseconds, so it runs on the loop; a
cell past ``OFFLOAD_BYTES``, and any cell a policy's patterns are matched
against (written by tenants and sessions: bounded, but up to seconds), is
scanned on a thread instead. A scanner that breaks is logged, and under an
enforcing policy the code is refused (fail closed).
"""

from __future__ import annotations

import asyncio
import logging

from ..access.auth import Principal
from ..errors import Denied, NotAllowed
from ..hosts import NetworkPolicy
from .approvals import ApprovalDesk
from .book import PolicyBook
from .model import ACTIONS, Decision, Policy
from .scan import RULES, Finding, ScanFailed, Scanner

log = logging.getLogger(__name__)

OFFLOAD_BYTES = 64 * 1024


class Gate:
    """Policies, the scanner and the approval desk, for the session manager."""

    def __init__(self, book: PolicyBook, scanner: Scanner, desk: ApprovalDesk) -> None:
        self.book = book
        self.scanner = scanner
        self.desk = desk

    async def review(
        self,
        tenant: str,
        session_policy: Policy | None,
        language: str,
        code: str,
        given: tuple[Finding, ...] = (),
        apart: tuple[str, ...] = (),
    ) -> Decision:
        """What the policy in force says about ``code``, with the scan's findings and ``given``.

        ``apart`` are texts the kernel runs each on its own (a cell's user
        expressions): each is scanned alone, since joined to the cell one could
        open a string that hides the next. Scanned on the loop (tens of
        microseconds), or on a thread for a large cell, several texts, or
        code that patterns are matched against.
        """
        policy = self.book.policy(tenant).tighten(session_policy)
        texts = (code, *apart)
        if apart or len(code) > OFFLOAD_BYTES or self.scanner.matches(language, policy.patterns):
            return await asyncio.to_thread(self._judge, tenant, policy, language, texts, given)
        return self._judge(tenant, policy, language, texts, given)

    def _judge(
        self,
        tenant: str,
        policy: Policy,
        language: str,
        texts: tuple[str, ...],
        given: tuple[Finding, ...],
    ) -> Decision:
        if not policy.scans:
            return policy.decide(())
        try:
            findings = [
                f for text in texts for f in self.scanner.scan(text, language, policy.patterns)
            ]
        except ScanFailed as e:
            log.error(
                "the scanner failed on a %s cell of tenant %s (%s); %s",
                language,
                tenant,
                e,
                "refused (fail closed)" if policy.enforcing else "allowed (report mode)",
            )
            return policy.failed_scan(str(e))
        return policy.decide([*given, *findings])

    def review_debugger(self, tenant: str, session_policy: Policy | None) -> Decision:
        """A kernel debugger's request: refused under a policy that holds or refuses anything.

        The debugger evaluates what it is sent (its console, watches,
        breakpoint conditions and log messages, values to set) in the kernel,
        as code no scan reads and no approver can hold.
        """
        policy = self.book.policy(tenant).tighten(session_policy)
        gated = [rule for rule in RULES if policy.action(rule) != "allow"]
        if not (policy.enforcing and gated):
            return policy.decide(())
        reason = (
            "the kernel's debugger evaluates expressions that pass no scan, so it is off "
            f"under a policy that holds or refuses {', '.join(gated)}; run code as cells"
        )
        return Decision("deny", "deny", policy.mode, (reason,))

    def bound_network(
        self, tenant: str, session_policy: Policy | None, network: NetworkPolicy
    ) -> NetworkPolicy:
        """``network`` as a session may have it: within every ceiling of the policy in force
        (403 naming the entries outside), with the ceilings' deny entries added."""
        policy = self.book.policy(tenant).tighten(session_policy)
        for ceiling in policy.network:
            outside = network.outside(ceiling)
            if outside:
                allowed = ", ".join(r.text for r in ceiling.rules or ()) or "nothing"
                raise NotAllowed(
                    f"network entries {', '.join(map(repr, outside))} are outside what the "
                    f"policy of tenant {tenant!r} allows ({allowed}); ask for hosts within it"
                )
            network = network.bounded(ceiling)
        return network

    async def review_command(
        self, tenant: str, session_policy: Policy | None, line: str
    ) -> Decision:
        """A command beside the kernel: a shell by definition, and the shell patterns on its line.

        Its one finding of the ``shell`` rule is what a policy that holds or
        refuses shell commands in cells holds or refuses here too.
        """
        shell = Finding("shell", "SBX300", 1, "runs a command in the sandbox")
        return await self.review(tenant, session_policy, "bash", line, (shell,))

    def review_tool(
        self, tenant: str, session_policy: Policy | None, tool: str, action: str
    ) -> Decision:
        """A tool call from a session's code: the action its tool rule (or, unset, its MCP
        annotations) gives, made stricter by the ``tools`` table of the policy in force.

        The session's own action holds in any mode (an agent builder chose it); the
        policy's table is enforced under an enforcing policy, else only reported.
        """
        policy = self.book.policy(tenant).tighten(session_policy)
        ceiling, pattern = policy.tool_action(tool)
        verdict = max(action, ceiling, key=ACTIONS.index)
        decided = verdict if policy.enforcing else action
        reasons = []
        if ceiling != "allow" and ceiling == verdict:
            reasons.append(f"the tenant's policy says {ceiling} for tools {pattern!r} ({tool})")
        elif action != "allow":
            reasons.append(f"the session's rule for tool {tool} is {action}")
        return Decision(decided, verdict, policy.mode, tuple(reasons))

    def check_file(self, tenant: str, session_policy: Policy | None, op: str, size: int = 0) -> int:
        """Refuse a files API ``op`` the policy forbids (Denied); the download limit in force.

        In report mode a refusal is only logged.
        """
        policy = self.book.policy(tenant).tighten(session_policy)
        refusal = policy.files.refusal(op, size)
        if refusal is not None and policy.enforcing:
            raise Denied(refusal)
        if refusal is not None:
            log.info("report mode: tenant %s: %s", tenant, refusal)
            return 0
        return policy.files.max_download if policy.enforcing else 0

    async def approve_host(
        self,
        session_id: str,
        tenant: str,
        session_policy: Policy | None,
        owner: Principal,
        ended: asyncio.Event,
        target: str,
    ) -> bool:
        """Whether a session's first connection to ``target`` may go ahead (the proxy waits).

        The ``egress`` rule decides: allow, deny, or hold for an approver, bounded
        by ``approval_timeout``. In report mode every host goes ahead.
        """
        policy = self.book.policy(tenant).tighten(session_policy)
        action = policy.action("egress") if policy.enforcing else "allow"
        if action != "hold":
            return action == "allow"
        reason = f"the first connection of this session to {target}"
        decision = Decision("hold", "hold", policy.mode, (reason,))
        approval = await self.desk.request(
            session_id, tenant, owner, f"CONNECT {target}", "egress", decision
        )
        await self.desk.wait(approval, ended)
        return approval.state == "approved"
