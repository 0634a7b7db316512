"""The ZMTP 3 wire format as the gateway reads it: frame flags, bounds, and a frame counter.

Both ends of the gateway's kernel transport read frames: the guard (bytes it
relays) and the gateway's own ZMTP links (bytes they parse). One definition
of a frame's header and of the bounds a message must keep serves both.
"""

from __future__ import annotations

_GREETING = 64  # ZMTP 3: signature (10), version (2), mechanism (20), as-server, filler
MORE, LONG, COMMAND = 1, 2, 4
# Frames in one message. An empty frame is 2 bytes on the wire but a libzmq message
# and a Python object in the gateway, read one call each with the loop held: three
# million of them held every session for 5 s. A Jupyter message has about ten.
MAX_FRAMES = 10_000
# Frame headers read in one turn of the loop, commands and empty frames too: each is
# Python work however few bytes it has (one 256 KiB read holds 128K empty ones).
HEADERS_PER_TURN = 2048


class FrameCounter:
    """Reads the ZMTP 3 frame headers in a byte stream; finds the first message over ``limit``.

    Over ``limit`` bytes, or over ``MAX_FRAMES`` frames.

    A header is held back until it is whole (at most 9 bytes), so the stream
    can be cut exactly before the frame that crosses the limit; bodies pass
    through as views of the data, uncopied.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._greeting = bytearray()
        self._head = bytearray()
        self._body = 0  # bytes of the current frame's body still to come
        self._message = 0  # bytes of the current message's frames so far
        self._frames = 0  # and how many of them

    def feed(
        self, data: bytes | memoryview, budget: int = 1 << 62
    ) -> tuple[list[bytes | memoryview], bool, int]:
        """What of ``data`` may pass on, whether the stream must be cut after it, and how
        much of ``data`` was read: all of it, unless ``budget`` frame headers came first
        (the rest is for another turn of the loop).

        At most two parts: a header held from the last read, made whole, then
        one view of ``data`` up to a cut or a header this read cuts short.
        """
        view, out, i, n = memoryview(data), [], 0, len(data)
        run = 0  # where the part of data passing on unchanged begins
        while i < n:
            if not self._body and not self._head and self.greeted:
                if budget <= 0:
                    break
                budget -= 1
            if len(self._greeting) < _GREETING:
                take = min(_GREETING - len(self._greeting), n - i)
                self._greeting += data[i : i + take]
                i += take
                if not self._greeting_ok():
                    out.append(view[run:i])
                    return out, True, i
            elif self._body:
                take = min(self._body, n - i)
                self._body -= take
                i += take
            elif self._head:  # a header the last read cut short: a byte at a time
                self._head.append(data[i])
                i += 1
                run = i  # held, not passed on as it is: a read may end before it is whole
                if len(self._head) < (9 if self._head[0] & LONG else 2):
                    continue
                if not self._frame(self._head[0], int.from_bytes(self._head[1:], "big")):
                    return out, True, i
                out.append(bytes(self._head))
                self._head.clear()
                run = i
            else:
                end = i + (9 if data[i] & LONG else 2)
                if end > n:  # held back until its last byte comes
                    out.append(view[run:i])
                    self._head += data[i:]
                    return out, False, n
                if not self._frame(data[i], int.from_bytes(data[i + 1 : end], "big")):
                    out.append(view[run:i])
                    return out, True, i
                i = end
        out.append(view[run:i])
        return out, False, i

    def _frame(self, flags: int, size: int) -> bool:
        """Count a frame whose header just passed; False if it takes its message over the limit."""
        if flags & COMMAND:
            if size > self.limit:
                return False
        else:
            total, frames = self._message + size, self._frames + 1
            if total > self.limit or frames > MAX_FRAMES:
                return False
            self._message, self._frames = (total, frames) if flags & MORE else (0, 0)
        self._body = size
        return True

    @property
    def greeted(self) -> bool:
        """The greeting is through: what follows is frames."""
        return len(self._greeting) == _GREETING

    def _greeting_ok(self) -> bool:
        """A ZMTP 3 signature and version, as far as they have come."""
        g = self._greeting
        return g[0] == 0xFF and (len(g) < 10 or g[9] & 1 == 1) and (len(g) < 11 or g[10] >= 3)

    def oversized_header(self) -> bytes:
        """A frame header libzmq's ``MAXMSGSIZE`` (the same limit) refuses unread."""
        return bytes([LONG]) + (self.limit + 1).to_bytes(8, "big")
