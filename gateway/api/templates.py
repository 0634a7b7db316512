"""The v1 API for templates: build one from a Dockerfile, list, inspect and delete them.

A session starts from one with ``POST /v1/sessions {"template": "name[:version]"}``;
``PUT /v1/templates/NAME/pool {"size": N}`` keeps N sandboxes of it ready for those.
"""

from __future__ import annotations

from typing import Any

from ..errors import BadRequest, NotAllowed
from ..sessions.requests import BuildTemplate
from .base import JSONHandler


def public(doc: dict[str, Any], logs: bool = True) -> dict[str, Any]:
    """A build's record as its tenant sees it (the log only where one build is asked for)."""
    shown = {k: v for k, v in doc.items() if k not in ("tenant", "logs")}
    if logs:
        shown["logs"] = list(doc.get("logs", ()))
    return shown


class TemplatesHandler(JSONHandler):
    actions = {"POST": "template.build"}

    async def get(self) -> None:
        docs = await self.templates.list(self.principal.tenant)
        self.send({"templates": [public(d, logs=False) for d in docs]})

    async def post(self) -> None:
        request = BuildTemplate.from_json(self.json_body())
        doc = await self.templates.build(
            self.principal.tenant,
            request.name,
            request.dockerfile,
            request.context,
            request.kernel,
            request.tags,
        )
        self.audit_detail.update(template=doc["name"], version=doc["version"])
        self.set_header("Location", f"/v1/templates/{doc['name']}")
        self.send(public(doc), status=202)


class TemplateHandler(JSONHandler):
    actions = {"DELETE": "template.delete"}

    async def get(self, name: str) -> None:
        tenant = self.principal.tenant
        docs = await self.templates.versions(tenant, name)
        view = {"name": name, "versions": [public(d) for d in docs]}
        if self.template_pools is not None:
            view["pool"] = self.template_pools.view(tenant, name)
        self.send(view)

    async def delete(self, name: str) -> None:
        self.audit_detail.update(template=name)
        await self.templates.delete(self.principal.tenant, name)
        self.set_status(204)
        self.finish()


class TemplatePoolHandler(JSONHandler):
    actions = {"PUT": "template.pool"}

    async def put(self, name: str) -> None:
        if self.template_pools is None:
            raise NotAllowed("this gateway builds no templates, so it pools none")
        body = self.json_body()
        if not isinstance(body, dict) or "size" not in body:
            raise BadRequest('send the sandboxes to keep ready, like {"size": 2} (0: none)')
        self.audit_detail.update(template=name, size=body["size"])
        self.send(await self.template_pools.resize(self.principal.tenant, name, body["size"]))


routes = [
    (r"/v1/templates", TemplatesHandler),
    (r"/v1/templates/(?P<name>[^/]+)", TemplateHandler),
    (r"/v1/templates/(?P<name>[^/]+)/pool", TemplatePoolHandler),
]
