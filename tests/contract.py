"""Check real HTTP responses and WebSocket messages against gateway/openapi.json.

``Contract.client`` is an httpx client whose every response is validated
(status declared for the operation, content type, headers, body schema) by
openapi-core before the test sees it, and remembered, so a test module can
say which documented operations it never saw answer.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

import httpx
from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_core.exceptions import OpenAPIError
from openapi_schema_validator import OAS31Validator
from werkzeug.datastructures import Headers, ImmutableMultiDict

from gateway.api.openapi import DOCUMENT

DOC: dict[str, Any] = json.loads(DOCUMENT.read_text())
# Notebook downloads are JSON under their own media type.
SPEC = OpenAPI.from_dict(
    DOC, config=Config(extra_media_type_deserializers={"application/x-ipynb+json": json.loads})
)
METHODS = ("get", "put", "post", "delete", "patch")


def _pattern(template: str) -> re.Pattern:
    # {path} may hold slashes (the files routes), every other parameter is one segment.
    regex = re.escape(template).replace(r"\{path\}", "(?P<path>.+)")
    return re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"[^/]+", regex) + "$")


PATTERNS = {template: _pattern(template) for template in DOC["paths"]}


def operations() -> set[tuple[str, str]]:
    """Every documented (METHOD, path template)."""
    return {
        (method.upper(), template)
        for template, item in DOC["paths"].items()
        for method in METHODS
        if method in item
    }


def template_of(path: str) -> str | None:
    """The documented path template a request path falls under (most specific first)."""
    matches = [t for t, p in PATTERNS.items() if p.match(path)]
    return min(matches, key=lambda t: t.count("{"), default=None)


def schema_errors(name: str, instance: Any) -> list[str]:
    """Why ``instance`` is not a valid ``components.schemas[name]``; empty when it is."""
    validator = OAS31Validator(
        {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    )
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validator.iter_errors(instance)
    ]


class _Request:
    """An httpx request as openapi-core reads one."""

    def __init__(self, request: httpx.Request) -> None:
        url = request.url
        self.host_url = f"{url.scheme}://{url.netloc.decode()}"
        path = url.raw_path.decode().split("?", 1)[0]
        # openapi-core matches a parameter within one segment; a file path may span several.
        match = _pattern("/v1/sessions/{session_id}/files/{path}").match(path)
        if match:
            start = match.start("path")
            path = path[:start] + path[start:].replace("/", "%2F")
        self.path = path
        self.method = request.method.lower()
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(urllib.parse.parse_qsl(url.query.decode())),
            header=Headers(dict(request.headers)),
            cookie=ImmutableMultiDict(),
        )
        self.body = request.read()  # a multipart body is a stream until read
        self.content_type = request.headers.get("content-type", "").lower()


class _Response:
    def __init__(self, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.content_type = response.headers.get("content-type", "").lower()
        self.headers = Headers(dict(response.headers))
        self.data = response.content


def _explain(error: BaseException) -> str:
    """openapi-core's complaint, with the schema errors under it, each cut to a readable size."""
    cause = error.__cause__ or error.__context__
    details = [str(error)]
    for e in getattr(cause, "schema_errors", None) or []:
        details.append(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}")
    if cause is not None and not getattr(cause, "schema_errors", None):
        details.append(str(cause))
    return "\n".join("  " + (d if len(d) < 300 else d[:300] + "...") for d in details)


class Contract:
    """Validates what a gateway answers; remembers (method, template, status) seen."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.seen: set[tuple[str, str, int]] = set()
        self._clients: list[httpx.Client] = []

    def client(self, token: str | None = None, **headers: str) -> httpx.Client:
        """An httpx client (sending ``token`` as a bearer token) that validates every response."""
        if token:
            headers["Authorization"] = f"Bearer {token}"
        client = httpx.Client(
            base_url=self.base_url,
            timeout=120,
            headers=headers,
            event_hooks={"response": [self.check]},
        )
        self._clients.append(client)
        return client

    def check(self, response: httpx.Response) -> None:
        """Fail unless the document allows this response to this request."""
        response.read()
        request = response.request
        template = template_of(request.url.path)
        where = f"{request.method} {request.url.path} answered {response.status_code}"
        assert template is not None, f"{where}, but the document has no such path"
        try:
            SPEC.validate_response(_Request(request), _Response(response))
        except OpenAPIError as e:
            raise AssertionError(
                f"{where} {response.text[:300]!r}, which the document does not allow:\n"
                + _explain(e)
            ) from None
        self.seen.add((request.method, template, response.status_code))

    def close(self) -> None:
        for client in self._clients:
            client.close()
