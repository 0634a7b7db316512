"""Masking secret values, and their common encodings, out of text a session produces.

A session given sealed secrets gets a ``Masker`` of their values; every output
is passed through it before it is streamed, stored, exported or audited. The
forms looked for: the value as is, base64 (standard and URL-safe, at each of
the three byte alignments it can have inside a longer encoded text), URL
quoting, and hex (either case). A base64 match leaves off the characters that
also encode the neighbouring bytes, so a few edge bits of the value's first
and last byte may stay visible; the rest is replaced by ``***NAME***``.

Masking is a net against showing a secret by accident, not a wall: a kernel
given the value can always print it transformed (reversed, split, XORed). See
docs/secrets.md.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

# Encoded forms shorter than this are not masked: they would hit common text, and
# corrupt images (base64 in outputs). The value itself is always masked.
MIN_FORM = 8


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


def encoded_forms(value: str) -> set[str]:
    """The value and every encoding of it that masking replaces."""
    raw = value.encode()
    forms = {
        value,
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

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        """``text`` with every secret form replaced by ``***NAME***``."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: f"***{self.names[m.group()]}***", text)

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


NO_SECRETS = Masker({})
