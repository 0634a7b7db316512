"""A session's files for the files APIs: its workspace, the policy's file rules, its watches.

Files stay usable while the kernel is busy, dead or paused: they live on
the host (or in the sandbox, behind the same async facade on Swarm).
"""

from __future__ import annotations

from ..access.auth import Principal
from ..errors import Conflict
from ..policy.gate import Gate
from ..workspace.files import AsyncWorkspace
from .manager import SessionManager
from .watchers import Watcher, Watchers


class Workspaces:
    """Every way in to a session's files goes through here, so the file rules hold on each."""

    def __init__(self, sessions: SessionManager, gate: Gate, watchers: Watchers) -> None:
        self.sessions = sessions
        self.gate = gate
        self.watchers = watchers

    def files(self, session_id: str, who: Principal) -> AsyncWorkspace:
        """The session's files; usable while its kernel is busy or dead."""
        session = self.sessions.get(session_id, who)
        if session.workspace is None:
            raise Conflict(f"session {session_id} is still starting; retry in a moment")
        return session.workspace

    def check_file(self, session_id: str, who: Principal, op: str, size: int = 0) -> int:
        """Refuse a files API ``op`` the session's policy forbids; its download limit (0: none)."""
        session = self.sessions.get(session_id, who)
        return self.gate.check_file(session.tenant, session.policy, op, size)

    async def watch(self, session_id: str, who: Principal, path: str, recursive: bool) -> Watcher:
        """Watch a directory of the session's workspace (paused or not) for changes."""
        workspace = self.files(session_id, who)
        tenant = self.sessions.get(session_id, who).tenant
        return await self.watchers.start(session_id, tenant, workspace, path, recursive)

    def watcher(self, session_id: str, who: Principal, watcher_id: str) -> Watcher:
        self.sessions.get(session_id, who)
        return self.watchers.get(session_id, watcher_id)

    def unwatch(self, session_id: str, who: Principal, watcher_id: str) -> None:
        self.sessions.get(session_id, who)
        self.watchers.stop(session_id, watcher_id)

    def forget(self, session_id: str, watcher_id: str) -> None:
        """Drop a watch whose client went away (E2B's stream of events ended)."""
        self.watchers.discard(session_id, watcher_id)
