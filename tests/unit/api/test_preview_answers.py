"""What a preview's answer may set in a viewer's browser: cookies kept to that preview."""

from __future__ import annotations

from tornado import httputil

from gateway.api.previews import _answer_headers

PREFIX = "/v1/sessions/s1/ports/8000"


def cookies(prefix: str, *set_cookies: str) -> list[str]:
    headers = httputil.HTTPHeaders()
    for value in set_cookies:
        headers.add("Set-Cookie", value)
    return headers_of(_answer_headers(headers, prefix))


def headers_of(headers: httputil.HTTPHeaders) -> list[str]:
    return headers.get_list("Set-Cookie")


def test_a_path_form_cookie_is_kept_under_its_preview_whatever_path_or_domain_it_names():
    """An attacker's review: a preview's Path=/ cookie reached every other session's preview
    (another tenant's app read it), and a Domain one every sibling's."""
    assert cookies(PREFIX, "app_session=x; Path=/; HttpOnly", "b=1; Domain=gw.test; path=/v1") == [
        f"app_session=x; HttpOnly; Path={PREFIX}/",
        f"b=1; Path={PREFIX}/",
    ]


def test_a_host_form_cookie_stays_with_its_host():
    assert cookies("", "a=1; Domain=gw.test; Path=/x", "b=2") == ["a=1; Path=/x", "b=2"]


def test_the_gateways_own_link_cookies_never_come_from_a_sandbox():
    assert cookies(PREFIX, "sbx_preview_s1_8000=forged; Path=/") == []
