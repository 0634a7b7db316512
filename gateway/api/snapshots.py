"""The v1 API for snapshots: take one of a session, list, inspect and delete them.

A fork is a create (``POST /v1/sessions`` with ``from_snapshot``), in ``api.sessions``.
"""

from __future__ import annotations

from ..sessions.requests import TakeSnapshot
from ..sessions.snapshots import public
from .base import JSONHandler

_ID = r"(?P<session_id>[^/]+)"


class SessionSnapshotsHandler(JSONHandler):
    actions = {"POST": "snapshot.create"}

    async def get(self, session_id: str) -> None:
        docs = await self.reports.snapshots_of(session_id, self.principal)
        self.send({"snapshots": [public(doc) for doc in docs]})

    async def post(self, session_id: str) -> None:
        request = TakeSnapshot.from_json(self.json_body())
        doc = await self.manager.snapshot(session_id, self.principal, request)
        self.audit_detail.update(snapshot_id=doc["id"], name=doc["name"], strategy=doc["strategy"])
        self.set_header("Location", f"/v1/snapshots/{doc['id']}")
        self.send(public(doc), status=201)


class SnapshotHandler(JSONHandler):
    actions = {"DELETE": "snapshot.delete"}

    async def get(self, snapshot_id: str) -> None:
        self.send(public(await self.snapshots.get(snapshot_id, self.principal)))

    async def delete(self, snapshot_id: str) -> None:
        await delete_snapshot(self, snapshot_id)


async def delete_snapshot(handler: JSONHandler, snapshot_id: str) -> None:
    """Delete one of the caller's tenant's snapshots, named in the audit log (/v1 and E2B)."""
    doc = await handler.snapshots.get(snapshot_id, handler.principal)
    handler.audit_session = doc["session_id"]
    handler.audit_detail.update(snapshot_id=doc["id"], name=doc["name"])
    await handler.snapshots.delete(snapshot_id, handler.principal)
    handler.set_status(204)
    handler.finish()


routes = [
    (rf"/v1/sessions/{_ID}/snapshots", SessionSnapshotsHandler),
    (r"/v1/snapshots/(?P<snapshot_id>[^/]+)", SnapshotHandler),
]
