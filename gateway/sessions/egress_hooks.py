"""What the egress proxy asks of the sessions: may a session connect, whose secrets to mask,
and where to record a connection. ``app`` hands these hooks to the proxy, so
``sandbox/`` never imports a session."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from ..egress import EgressConnection
from ..policy.gate import Gate
from ..store.base import Store
from ..timestamps import iso
from .model import Session

log = logging.getLogger(__name__)

# Egress connections recorded per session (by this process); past it they are only counted.
MAX_CONNECTION_RECORDS = 10_000


class EgressHooks:
    """The proxy's questions about live sessions, answered from the registry."""

    def __init__(self, sessions: Mapping[str, Session], gate: Gate, store: Store) -> None:
        self.sessions = sessions
        self.gate = gate
        self.store = store

    def record_connection(self, connection: EgressConnection) -> None:
        """Keep a connection the egress proxy saw, under its session and the running execution.

        Host names and reasons are masked of the session's secrets; past
        ``MAX_CONNECTION_RECORDS`` a session's connections are only counted.
        """
        session = self.sessions.get(connection.session_id)
        if session is None:
            return
        session.egress_recorded += 1
        session.egress_bytes[0] += connection.bytes_up
        session.egress_bytes[1] += connection.bytes_down
        if session.egress_recorded > MAX_CONNECTION_RECORDS:
            if session.egress_recorded == MAX_CONNECTION_RECORDS + 1:
                log.warning("session %s: further egress connections are not recorded", session.id)
            return
        mask = session.masker
        running = next(iter(session.running), None)
        record = dataclasses.asdict(connection)
        record.update(
            at=iso(record.pop("started")),
            duration_ms=round(connection.duration_ms, 3),
            host=mask.text(connection.host),
            sni=connection.sni and mask.text(connection.sni),
            reason=connection.reason and mask.text(connection.reason),
        )
        del record["session_id"]
        self.store.add_connection(session.id, running.id if running else None, record)

    def redact(self, session_id: str, text: str) -> str:
        """``text`` with a live session's secrets masked (the egress proxy's log lines)."""
        session = self.sessions.get(session_id)
        return session.masker.text(text) if session else text

    async def approve_host(self, session_id: str, target: str) -> bool:
        """Whether a first connection to ``target`` may go ahead (the egress proxy asks)."""
        session = self.sessions.get(session_id)
        if session is None or session.kernel is None:
            return False
        return await self.gate.approve_host(
            session.id, session.tenant, session.policy, session.owner, session.kernel.died, target
        )
