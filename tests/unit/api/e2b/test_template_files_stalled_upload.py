"""A template file set's upload that stalls ends: it holds its reservation no longer.

An authenticated body is not timed at the edge (workspace uploads may be huge).
A file set's upload reserves its bytes against the tenant's bound and the
gateway-wide one until it ends, and an upload under way is never evicted: a
connection kept open with a byte now and then held them for the gateway's life
(tenants enough doing so left every other tenant a 503).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gateway.api.e2b.builds import TemplateFilesHandler
from gateway.sessions.template_files import UPLOAD_TIME


class Connection:  # as Tornado's request has it
    def __init__(self) -> None:
        self.max_body_size: int | None = None
        self.body_timeout: float | None = None

    def set_max_body_size(self, size: int) -> None:
        self.max_body_size = size

    def set_body_timeout(self, timeout: float) -> None:
        self.body_timeout = timeout


class Templates:
    async def open_upload(self, tenant, name, files_hash, declared):
        return SimpleNamespace(room=declared)


def test_a_file_sets_upload_is_given_a_deadline_for_its_body():
    connection = Connection()
    handler = SimpleNamespace(
        request=SimpleNamespace(headers={"Content-Length": "10"}, connection=connection),
        templates=Templates(),
        principal=SimpleNamespace(tenant="alice"),
        path_kwargs={"template_id": "geo", "files_hash": "1" * 64},
    )
    asyncio.run(TemplateFilesHandler.start_upload(handler))
    assert connection.max_body_size == 10
    assert connection.body_timeout == UPLOAD_TIME
