"""The SDK's errors with no gateway to answer: typed by code or by status, retries that give up."""

from __future__ import annotations

import socket
import time

import pytest

from gateway.client import (
    Client,
    GatewayError,
    GatewayUnreachable,
    NotFound,
    Retry,
    SessionNotFound,
)
from gateway.client.errors import error_class, error_from_body


def test_unknown_codes_fall_back_by_status():
    assert error_class("session_not_found", 404) is SessionNotFound
    assert error_class("some_future_code", 404) is NotFound
    assert error_class(None, 418) is GatewayError
    error = error_from_body(409, b'{"error": {"code": "brand_new", "message": "later"}}')
    assert (type(error).__name__, error.code, error.message) == ("Conflict", "brand_new", "later")
    plain = error_from_body(502, b"<html>bad gateway</html>", "Bad Gateway")
    assert plain.status == 502 and "bad gateway" in plain.message


def test_unreachable_gateway_gives_up_after_the_retries():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # nothing listens once closed
    started = time.monotonic()
    with Client(url, "", retry=Retry(retries=2, backoff=0.05)) as c:
        with pytest.raises(GatewayUnreachable, match=url):
            c.health()
        with pytest.raises(GatewayUnreachable):
            c.create_session()
    assert time.monotonic() - started < 5
