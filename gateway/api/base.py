"""What every handler shares: JSON in and out, and one mapping of errors."""

from __future__ import annotations

import json
import logging
from typing import Any

import tornado.web

from ..errors import BadRequest, GatewayError, NotFound
from ..sessions import SessionManager

log = logging.getLogger(__name__)


class JSONHandler(tornado.web.RequestHandler):
    """Base handler: parses JSON bodies and renders errors as ``{"error": {...}}``."""

    @property
    def manager(self) -> SessionManager:
        return self.settings["sbx_manager"]

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")

    def json_body(self) -> dict[str, Any]:
        """The request body as a JSON object; an empty body is an empty object."""
        if not self.request.body:
            return {}
        try:
            body = json.loads(self.request.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadRequest(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    def send(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(payload))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(error, GatewayError):
            status, code, message = error.status, error.code, error.message
        elif isinstance(error, tornado.web.HTTPError):
            status = error.status_code
            code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
            message = error.log_message or self._reason
        else:
            status, code = 500, "internal_error"
            message = "the gateway hit an unexpected error; it has been logged"
        self.set_status(status)
        self.finish(json.dumps({"error": {"code": code, "message": message}}))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # User-caused errors are answers, not server faults: keep tracebacks out of the log.
        if isinstance(value, GatewayError | tornado.web.HTTPError):
            log.info("%s %s -> %s", self.request.method, self.request.path, value)
        else:
            super().log_exception(typ, value, tb)


class NotFoundHandler(JSONHandler):
    """Answers unknown paths with the JSON error shape instead of an HTML page."""

    def prepare(self) -> None:
        raise NotFound(f"no such endpoint: {self.request.method} {self.request.path}")
