"""What the package gate accepts from a sandbox: one strict HTTP/1.x request head, no body.

pip and npm fetch packages with GET (or HEAD), an origin-form target and no
body, so anything else is refused before the cache sees it (405, 400, 413,
431). The target is decoded once, strictly, into its segments, and the
request sent on is rebuilt from what was decided, never the bytes as sent:
a tenant's lists and the cache read the same path however it was written.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse

MAX_HEAD = 16 * 1024  # bytes, the request line and headers (pip's and npm's are under 1 KiB)
MAX_HEADERS = 100
METHODS = ("GET", "HEAD")

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(r"/[!$&'()*+,\-./0-9:;=?@A-Z_a-z~%]*")  # origin-form, no fragment
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_SEGMENT_BAD = re.compile(r"[\x00-\x20\x7f%\\]")  # after decoding: no second round, no controls
# Not sent on: hop-by-hop, a body's, and those the cache reads as the caller's rights
# or its own address (devpi's X-Devpi-* and X-Outside-Url).
_DROPPED = frozenset({
    "connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "trailer",
    "upgrade", "expect", "content-length", "authorization", "cookie", "forwarded",
    "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-outside-url",
})  # fmt: skip


class Refused(Exception):
    """Ends a request with ``status`` and ``reason`` (pip and npm print the reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Request:
    """A request the gate accepted: its method, decoded path segments and headers sent on."""

    method: str
    segments: tuple[str, ...]  # a trailing slash is a last empty segment
    headers: tuple[tuple[str, str], ...]

    @property
    def path(self) -> str:
        return "/" + "/".join(self.segments)

    def head(self, target: str) -> bytes:
        """The request sent to the cache for ``target``: one request, then the connection ends."""
        lines = [f"{self.method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in self.headers)]
        return "\r\n".join([*lines, "Connection: close", "", ""]).encode("latin-1")


def parse(head: bytes) -> Request:
    """The request in ``head`` (ending in a blank line), or ``Refused`` saying what is wrong."""
    if len(head) > MAX_HEAD:
        raise Refused(431, f"request head over {MAX_HEAD} bytes")
    lines = head.decode("latin-1").split("\r\n")[:-2]
    if any("\r" in line or "\n" in line for line in lines):
        raise Refused(400, "bare CR or LF in the request head")
    if len(lines) - 1 > MAX_HEADERS:
        raise Refused(431, f"more than {MAX_HEADERS} headers")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise Refused(400, "not an HTTP/1.x request line")
    method, target, _ = parts
    if method not in METHODS:
        raise Refused(405, f"{method[:20]} is not accepted: package downloads use GET and HEAD")
    if not _TARGET.fullmatch(target):
        raise Refused(400, "only a path is accepted as the target (no scheme, host or fragment)")
    return Request(method, _segments(target), _headers(lines[1:]))


def _headers(lines: list[str]) -> tuple[tuple[str, str], ...]:
    kept, lengths = [], set()
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
            raise Refused(400, f"malformed header line {line[:40]!r}")
        value, lower = value.strip(" \t"), name.lower()
        if lower == "transfer-encoding":
            raise Refused(413, "request bodies are not accepted (Transfer-Encoding)")
        if lower == "content-length":
            lengths.add(value)
        elif lower not in _DROPPED and not lower.startswith("x-devpi-"):
            kept.append((name, value))
    if lengths - {"0"}:
        raise Refused(413, "request bodies are not accepted (Content-Length)")
    return tuple(kept)


def _segments(target: str) -> tuple[str, ...]:
    """The path's segments, percent-decoded once; refused unless in its one plain form."""
    raw, query, _ = target.partition("?")
    if query or target.endswith("?"):
        raise Refused(400, "query strings are not accepted")
    try:
        path = urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise Refused(400, "the path is not UTF-8") from None
    segments = tuple(path.split("/")[1:])
    if any(seg in ("", ".", "..") for seg in segments[:-1]) or segments[-1] in (".", ".."):
        raise Refused(400, "empty, . or .. segments are not accepted in the path")
    if any(_SEGMENT_BAD.search(seg) for seg in segments):
        raise Refused(400, "the path has %, \\, spaces or control characters once decoded")
    return segments


def encode(segments: tuple[str, ...], separator: str = "/") -> str:
    """A decided path as sent to the cache: each segment percent-encoded as pip and npm do."""
    quoted = (urllib.parse.quote(seg, safe="@+!$&'()*,;=:~") for seg in segments)
    return "/" + separator.join(quoted)
