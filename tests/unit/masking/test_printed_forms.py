"""A secret is masked in the forms printing gives it: repr, JSON, escapes, lines, pieces."""

from __future__ import annotations

import json

import pytest

from gateway.masking import Masker, MaskingStream

VALUE = "k3y/with+odd=chars&more\"it's\\é"  # quotes, a backslash, a non-ASCII letter
PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n"
    "NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ\n"
    "-----END PRIVATE KEY-----\n"
)


@pytest.mark.parametrize(
    "show",
    [
        repr,
        json.dumps,
        lambda v: json.dumps(v, ensure_ascii=False),
        lambda v: repr(v.encode()),
        lambda v: repr({"key": v, "other": "x'\""}),  # repr escapes both quotes here
        lambda v: json.dumps({"log": json.dumps({"key": v})}),  # JSON inside JSON
        lambda v: repr([v]),
    ],
    ids=["repr", "json", "json-utf8", "bytes-repr", "dict-repr", "json-in-json", "list-repr"],
)
@pytest.mark.parametrize("value", [VALUE, PEM], ids=["odd", "pem"])
def test_a_value_is_masked_as_printing_shows_it(show, value):
    masker = Masker({"KEY": value})
    shown = show(value)
    masked = masker.text(shown)
    assert "***KEY***" in masked, f"not masked in {shown!r}"
    for line in value.splitlines():
        if len(line) >= 16 and not line.startswith("-----"):
            assert line not in masked, f"{line!r} shows in {masked!r}"


def test_a_multi_line_value_is_masked_with_other_line_ends_and_line_by_line():
    masker = Masker({"KEY": PEM})
    assert masker.text(PEM.replace("\n", "\r\n")).count("***KEY***") == 1  # a terminal's
    body = PEM.splitlines()[2]
    assert masker.text(f"line 2 is {body}!") == "line 2 is ***KEY***!"
    assert masker.text("-----BEGIN PRIVATE KEY-----") == "-----BEGIN PRIVATE KEY-----"


def test_a_value_split_between_pieces_is_masked_whole():
    masker = Masker({"KEY": VALUE})
    text = f"before {VALUE} between {VALUE.encode().hex()} after\n"
    for cut in range(1, len(text)):
        stream = MaskingStream(masker)
        out = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.flush()
        assert out == "before ***KEY*** between ***KEY*** after\n", cut


def test_a_stream_holds_back_only_what_may_begin_a_secret():
    stream = MaskingStream(Masker({"KEY": "sk-0123456789abcdef"}))
    assert stream.feed("ready> ") == "ready> ", "a prompt is let out at once"
    assert stream.feed("key sk-0123") == "key "
    assert stream.held == "sk-0123"
    assert stream.flush() == "sk-0123" and stream.held == ""
