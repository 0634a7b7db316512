"""The v1 API for templates' tags: ``name:tag`` names the version a tag was moved to.

``POST /v1/templates/{name}/tags {"version": 2, "tags": ["prod"]}`` moves
tags to a ready version (``version``: its number, or a tag naming it);
``DELETE`` with ``{"tags": [...]}`` removes them; ``GET`` lists them. A
template's view shows each version's tags. E2B's ``Template.assign_tags``
and friends reach the same (``e2b/builds.py``).
"""

from __future__ import annotations

from ..errors import BadRequest
from .base import JSONHandler


class TemplateTagsHandler(JSONHandler):
    actions = {"POST": "template.tag", "DELETE": "template.untag"}

    async def get(self, name: str) -> None:
        self.send({"name": name, "tags": await self.templates.tags(self.principal.tenant, name)})

    async def post(self, name: str) -> None:
        body = self.json_body()
        version = body.get("version")
        if isinstance(version, bool) or not isinstance(version, int | str):
            raise BadRequest(
                'name the version to tag, by number or by a tag it has: {"version": 2, '
                '"tags": ["production"]}'
            )
        doc, tags = await self.templates.assign(
            self.principal.tenant, f"{name}:{version}", body.get("tags")
        )
        self.audit_detail.update(template=name, version=doc["version"], tags=list(tags))
        self.send({"name": name, "version": doc["version"], "tags": list(tags)})

    async def delete(self, name: str) -> None:
        self.audit_detail.update(template=name)
        await self.templates.remove(self.principal.tenant, name, self.json_body().get("tags"))
        self.set_status(204)
        self.finish()


routes = [(r"/v1/templates/(?P<name>[^/]+)/tags", TemplateTagsHandler)]
