"""The OpenAPI document itself: valid, and naming every route and error code the code has."""

from __future__ import annotations

import importlib
import pkgutil
import re

import tornado.web
import tornado.websocket
from contract import DOC, METHODS, operations
from openapi_spec_validator import validate

import gateway.api
from gateway import errors

# Routes the document leaves to other contracts: the Jupyter kernels REST API
# follows Jupyter Server's own, and /metrics is Prometheus text for scrapers.
NOT_DOCUMENTED = {
    "/api", "/api/kernelspecs", "/api/kernelspecs/{name}", "/kernelspecs/{name}/{filename}",
    "/api/kernels", "/api/kernels/{kernel_id}", "/api/kernels/{kernel_id}/{action}", "/metrics",
}  # fmt: skip


# Codes only the E2B edge answers with, in E2B's error shape (docs/e2b.md).
E2B_ONLY = {"unsupported_media_type", "sandbox_not_found", "too_many_watchers"}


def _template(regex: str) -> str:
    """``/v1/sessions/(?P<session_id>[^/]+)/?`` -> ``/v1/sessions/{session_id}``."""
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", regex)
    return path.removesuffix("/?").replace("\\.", ".")


def _implemented(handler: type) -> set[str]:
    base = tornado.web.RequestHandler
    if issubclass(handler, tornado.websocket.WebSocketHandler):
        return {"GET"}
    return {m.upper() for m in METHODS if getattr(handler, m) is not getattr(base, m)}


def routes() -> list[tuple[str, type]]:
    """(path template, handler) of every route the handler modules export, as app.py gets them."""
    found = []
    for info in pkgutil.iter_modules(gateway.api.__path__):
        if info.name == "e2b":
            continue  # E2B's API, to E2B's contract: docs/e2b.md and tests/test_e2b*.py
        module = importlib.import_module(f"gateway.api.{info.name}")
        found += [(_template(regex), handler) for regex, handler in getattr(module, "routes", [])]
    return [(template, handler) for template, handler in found if template not in NOT_DOCUMENTED]


def test_document_is_valid_openapi():
    validate(DOC)
    assert DOC["openapi"].startswith("3.1")


def test_every_route_is_documented_and_every_documented_route_exists():
    served = {(method, t) for t, handler in routes() for method in _implemented(handler)}
    documented = operations()
    assert not served - documented, (
        f"routes missing from gateway/openapi.json: {served - documented}"
    )
    assert not documented - served, f"documented but not served: {documented - served}"


def test_error_codes_are_the_ones_the_code_raises():
    def codes(cls: type) -> set[str]:
        # The SDK's own classes (gateway.client) are never sent by the server.
        own = set() if cls.__module__.startswith("gateway.client") else {cls.code}
        return own.union(*(codes(sub) for sub in cls.__subclasses__()))

    importlib.import_module("gateway.app")  # every module that may subclass GatewayError
    raised = codes(errors.GatewayError) - {"config_error"}  # only ever raised at start
    raised -= E2B_ONLY
    # Tornado's own refusals, turned into the same body by the base handler.
    raised |= {"not_found", "method_not_allowed", "http_error"}
    documented = set(DOC["components"]["schemas"]["ErrorCode"]["enum"])
    assert documented == raised, (
        f"error codes not in gateway/openapi.json (ErrorCode, and the responses that can carry "
        f"them): {raised - documented}; documented but never raised: {documented - raised}"
    )


def test_operations_without_a_token_are_the_handlers_marked_public():
    documented = {
        template
        for template, item in DOC["paths"].items()
        for method in METHODS
        if item.get(method, {}).get("security") == []
    }
    assert documented == {template for template, handler in routes() if handler.public}
