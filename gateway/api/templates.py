"""The v1 API for templates: build one from a Dockerfile, list, inspect and delete them.

A session starts from one with ``POST /v1/sessions {"template": "name[:version]"}``.
"""

from __future__ import annotations

from typing import Any

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
        docs = await self.templates.versions(self.principal.tenant, name)
        self.send({"name": name, "versions": [public(d) for d in docs]})

    async def delete(self, name: str) -> None:
        self.audit_detail.update(template=name)
        await self.templates.delete(self.principal.tenant, name)
        self.set_status(204)
        self.finish()


routes = [
    (r"/v1/templates", TemplatesHandler),
    (r"/v1/templates/(?P<name>[^/]+)", TemplateHandler),
]
