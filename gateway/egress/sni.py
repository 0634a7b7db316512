"""The server name a TLS client asks for, read from its ClientHello (RFC 8446, 6066).

The proxy tunnels ``CONNECT`` bytes unchanged; the first bytes a client sends
through an HTTPS tunnel are its ClientHello, whose ``server_name`` extension
says which host it means. Read for the connection record only, never to
decide anything: the bytes are the sandbox's, so every length is checked and
anything malformed is simply no name.
"""

from __future__ import annotations

_HANDSHAKE, _CLIENT_HELLO, _SERVER_NAME, _HOST_NAME = 0x16, 1, 0, 0


def _u16(data: memoryview, at: int) -> int:
    if at + 2 > len(data):
        raise IndexError(at)
    return int.from_bytes(data[at : at + 2], "big")


def server_name(first: bytes) -> str | None:
    """The SNI host name in the first TLS record of a connection, or None."""
    if len(first) < 9 or first[0] != _HANDSHAKE:
        return None
    hello = memoryview(first)[5 : 5 + _u16(memoryview(first), 3)]
    try:
        if hello[0] != _CLIENT_HELLO:
            return None
        at = 4 + 2 + 32  # handshake header, legacy version, random
        at += 1 + hello[at]  # session id
        at += 2 + _u16(hello, at)  # cipher suites
        at += 1 + hello[at]  # compression methods
        end = at + 2 + _u16(hello, at)
        at += 2
        while at + 4 <= min(end, len(hello)):
            kind, size = _u16(hello, at), _u16(hello, at + 2)
            at += 4
            if kind == _SERVER_NAME:
                if hello[at + 2] != _HOST_NAME:
                    return None
                length = _u16(hello, at + 3)
                name = bytes(hello[at + 5 : at + 5 + length]).decode("ascii")
                return name if len(name) == length and name.isprintable() else None
            at += size
    except (IndexError, UnicodeDecodeError):
        return None
    return None
