"""Masking secret values, and their common encodings, out of text a session produces.

A session given sealed secrets gets a ``Masker`` of their values; every output
is passed through it before it is streamed, stored, exported or audited. The
forms looked for: the value as is, base64 (standard and URL-safe, at each of
the three byte alignments it can have inside a longer encoded text), URL
quoting, hex (either case), and the value as printing shows it inside quotes
(Python's ``repr`` of a str or bytes, JSON, each once or twice over, with a
multi-line value's lines ended by ``\n`` or ``\r\n``) and each long line of a
multi-line value (a PEM key's body). A base64 match leaves off the characters
that also encode the neighbouring bytes, so a few edge bits of the value's
first and last byte may stay visible; the rest is replaced by ``***NAME***``.

Output that comes in pieces (a command's reads, a kernel's stream messages)
is masked as one text by ``MaskingStream``: the end of a piece that may begin
a secret waits for the next piece.

Masking is a net against showing a secret by accident, not a wall: a kernel
given the value can always print it transformed (reversed, split, XORed). See
docs/secrets.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import json
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

# Encoded forms shorter than this are not masked: they would hit common text, and
# corrupt images (base64 in outputs). The value itself is always masked.
MIN_FORM = 8
# Lines of a multi-line value at least this long are masked on their own (a PEM
# key's body lines); its armour lines (``-----BEGIN ...-----``) are not secret.
MIN_LINE = 16
_ARMOUR = re.compile(r"-----[A-Z0-9 ]+-----")
# Seconds of silence after which output held back (it may begin a secret) is let out.
QUIET = 0.05


def _base64_forms(value: bytes) -> set[str]:
    """The characters of the value's base64 that depend on its bytes alone, at each alignment."""
    forms = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + value).decode()
        skip = (8 * shift + 5) // 6  # characters that also hold the padding bytes' bits
        end = 8 * (shift + len(value)) // 6  # the last whole character of the value's bits
        core = encoded[skip:end]
        forms.add(core)
        forms.add(core.translate(str.maketrans("+/", "-_")))
    return forms


def _escapes(text: str) -> set[str]:
    """``text`` as it reads between quotes: Python's str and bytes ``repr``, JSON.

    ``repr`` escapes ``'`` only in a string that holds both quotes: both ways are kept.
    """
    raw = text.encode(errors="surrogatepass")
    both = "'\""
    return {
        repr(text)[1:-1],
        repr(both + text)[len(repr(both)) - 1 : -1],
        repr(raw)[2:-1],
        repr(both.encode() + raw)[len(repr(both.encode())) - 1 : -1],
        json.dumps(text)[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
    }


def _printed_forms(value: str) -> set[str]:
    """The value as printing shows it: quoted once or twice, its lines as a terminal ends them."""
    plain = {value, value.replace("\r\n", "\n").replace("\n", "\r\n")}
    once = plain.union(*map(_escapes, plain))
    forms = once.union(*map(_escapes, once))
    lines = value.splitlines()
    if len(lines) > 1:
        forms.update(
            line for line in map(str.strip, lines)
            if len(line) >= MIN_LINE and not _ARMOUR.fullmatch(line)
        )  # fmt: skip
    return forms


def encoded_forms(value: str) -> set[str]:
    """The value and every encoding of it that masking replaces."""
    raw = value.encode(errors="surrogatepass")
    forms = {
        *_printed_forms(value),
        urllib.parse.quote(value),
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value),
        binascii.hexlify(raw).decode(),
        binascii.hexlify(raw).decode().upper(),
        *_base64_forms(raw),
    }
    return {value} | {form for form in forms if len(form) >= MIN_FORM}


class Masker:
    """Replaces known secret values (by name) in text and in JSON-like trees."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.names: dict[str, str] = {}  # each form -> the secret's name
        for name, value in secrets.items():
            for form in encoded_forms(value):
                self.names.setdefault(form, name)
        # Longest first: a value that contains another is replaced whole.
        forms = sorted(self.names, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, forms))) if forms else None
        # For pieces of a stream: the forms by their first character, and those characters.
        self._longest = len(forms[0]) if forms else 0
        self._by_first: dict[str, list[str]] = {}
        for form in forms:
            self._by_first.setdefault(form[0], []).append(form)
        self._firsts = re.compile("|".join(map(re.escape, self._by_first)) or "(?!)")

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        """``text`` with every secret form replaced by ``***NAME***``."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: f"***{self.names[m.group()]}***", text)

    def unfinished(self, text: str) -> int:
        """Where the end of ``text`` may begin a form the next piece would finish.

        ``len(text)`` when nowhere. A whole form found there that a longer one
        may extend (a line of a PEM key, the key) is unfinished too.
        """
        if self._pattern is None:
            return len(text)
        cut = len(text)
        for first in self._firsts.finditer(text, max(0, len(text) - self._longest + 1)):
            tail = text[first.start() :]
            if any(len(f) > len(tail) and f.startswith(tail) for f in self._by_first[tail[0]]):
                cut = first.start()
                break
        for match in self._pattern.finditer(text, max(0, cut - self._longest)):
            if match.start() < cut < match.end():  # a whole form the cut would split
                return match.start()
        return cut

    async def pieces(
        self, read: Callable[[], Awaitable[tuple[str, bytes] | None]]
    ) -> AsyncIterator[tuple[str, bytes]]:
        """``read()``'s (kind, bytes) pieces until None, each kind masked as one text.

        What may begin a secret waits for the next piece of its kind, or for
        ``QUIET`` seconds of silence (a prompt is not held for long).
        """
        if not self:
            while (piece := await read()) is not None:
                yield piece
            return
        streams: dict[str, _ByteStream] = {}
        reading: asyncio.Future[tuple[str, bytes] | None] | None = None
        try:
            while True:
                reading = reading or asyncio.ensure_future(read())
                held = any(stream.text.held for stream in streams.values())
                if not (await asyncio.wait({reading}, timeout=QUIET if held else None))[0]:
                    for kind, stream in streams.items():
                        if stream.text.held:
                            yield kind, stream.flush()
                    continue
                piece, reading = reading.result(), None
                if piece is None:
                    break
                kind, data = piece
                stream = streams.setdefault(kind, _ByteStream(self))
                if masked := stream.feed(data):
                    yield kind, masked
            for kind, stream in streams.items():
                if masked := stream.feed(b"", final=True) + stream.flush():
                    yield kind, masked
        finally:
            if reading is not None:
                reading.cancel()

    def tree(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string (keys too) masked.

        Not recursive: a hostile kernel chooses the nesting.
        """
        if self._pattern is None:
            return value
        root: list[Any] = [value]
        pending: list[tuple[Any, Any]] = [(root, 0)]  # (container, key) whose value to mask
        while pending:
            parent, key = pending.pop()
            item = parent[key]
            if isinstance(item, str):
                parent[key] = self.text(item)
            elif isinstance(item, dict):
                copy = {self.text(str(k)): v for k, v in item.items()}
                parent[key] = copy
                pending.extend((copy, k) for k in copy)
            elif isinstance(item, list | tuple):
                copy = list(item)
                parent[key] = copy
                pending.extend((copy, i) for i in range(len(copy)))
        return root[0]


class MaskingStream:
    """Masks a text that comes in pieces as one: a secret split between two is masked whole."""

    def __init__(self, masker: Masker) -> None:
        self.masker = masker
        self.held = ""  # the end of what came, which may begin a secret

    def feed(self, piece: str) -> str:
        """What can be shown of the text so far, masked; the rest waits for the next piece."""
        text = self.held + piece
        cut = self.masker.unfinished(text)
        self.held = text[cut:]
        return self.masker.text(text[:cut])

    def flush(self) -> str:
        """What was held back, masked (the text ended, or went quiet)."""
        text, self.held = self.held, ""
        return self.masker.text(text)


class _ByteStream:
    """A ``MaskingStream`` of bytes: a character split between pieces is decoded whole."""

    def __init__(self, masker: Masker) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.text = MaskingStream(masker)

    def feed(self, data: bytes, final: bool = False) -> bytes:
        return self.text.feed(self.decoder.decode(data, final)).encode("utf-8", "surrogateescape")

    def flush(self) -> bytes:
        return self.text.flush().encode("utf-8", "surrogateescape")


NO_SECRETS = Masker({})
