"""A live session's network rules, changed (``PATCH /v1/sessions/{id}/network``, E2B's
``update_network``): checked as at create, in force for the proxy's next connection at once.

The rules are the session's record (a paused session gets them when it is
resumed; a gateway that takes the session over admits it with them). A
session created with no network (``none``) has no interface to change: its
container is not on the egress network, so only a new session can give it one.
"""

from __future__ import annotations

from ..access.auth import Principal
from ..egress import Egress
from ..errors import Conflict
from ..hosts import NetworkPolicy
from ..policy.gate import Gate
from .manager import SessionManager
from .model import Session


class NetworkRules:
    """Changes sessions' network rules within their tenants' policies."""

    def __init__(self, manager: SessionManager, gate: Gate, egress: Egress) -> None:
        self.manager = manager
        self.gate = gate
        self.egress = egress

    async def change(
        self, session_id: str, who: Principal, network: NetworkPolicy
    ) -> tuple[Session, NetworkPolicy]:
        """Put ``network`` in force for a session; return it and the rules it had before.

        ``none`` on a session with a network allows nothing (its interface stays).
        """
        session = self.manager.get(session_id, who)
        if session.network.is_none:
            raise Conflict(
                f'session {session.id} was created with network "none": its sandbox has no '
                'network to change. Create a session with {"allow": [...]} (an empty list '
                "allows nothing yet) to change its rules while it runs"
            )
        if network.is_none:
            network = NetworkPolicy(rules=())
        bounded = self.gate.bound_network(session.tenant, session.policy, network)
        before, session.network = session.network, bounded
        self.egress.update(session.id, bounded)
        await self.manager.save(session)
        return session, before
