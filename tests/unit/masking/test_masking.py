"""Masking a session's secrets out of outputs: every encoding, every shape, no cost without."""

from __future__ import annotations

import base64
import urllib.parse

import pytest

from gateway.execution.outputs import OutputCollector
from gateway.masking import NO_SECRETS, Masker

VALUE = "k3y/with+odd=chars&more"


def stream(text: str, msg_type: str = "stream") -> dict:
    return {"header": {"msg_type": msg_type}, "content": {"name": "stdout", "text": text}}


@pytest.mark.parametrize("prefix", [b"", b"a", b"ab", b"abc"])
def test_base64_is_masked_at_every_alignment(prefix):
    masker = Masker({"KEY": VALUE})
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode(prefix + VALUE.encode() + b"tail").decode()
        masked = masker.text(encoded)
        assert "***KEY***" in masked, f"{encoded} was not masked"
        # What is left around the mark encodes the neighbours, and at most a byte of the value.
        assert len(masked.replace("***KEY***", "")) <= len(encoded) - len(VALUE) * 4 // 3 + 4


def test_plain_url_and_hex_forms_are_masked():
    masker = Masker({"KEY": VALUE, "OTHER": "second-secret"})
    for form in (
        VALUE,
        urllib.parse.quote(VALUE),
        urllib.parse.quote(VALUE, safe=""),
        urllib.parse.quote_plus(VALUE),
        VALUE.encode().hex(),
        VALUE.encode().hex().upper(),
    ):
        assert masker.text(f"<{form}>") == "<***KEY***>", form
    assert masker.text("a second-secret b") == "a ***OTHER*** b"


def test_trees_are_masked_without_recursion():
    masker = Masker({"KEY": VALUE})
    deep: list = [VALUE]
    for _ in range(50_000):  # far deeper than Python's recursion limit
        deep = [deep]
    masked = masker.tree({"data": {"text/html": f"<b>{VALUE}</b>", VALUE: deep}})
    assert masked["data"]["text/html"] == "<b>***KEY***</b>"
    assert "***KEY***" in masked["data"]
    assert NO_SECRETS.tree(deep) is deep, "without secrets nothing is copied"


def test_a_secret_split_across_stream_chunks_is_masked_in_the_stored_output():
    collector = OutputCollector(1 << 20, mask=Masker({"KEY": VALUE}))
    collector.add_message(stream(VALUE[:6]))
    collector.add_message(stream(VALUE[6:] + "\n"))
    collector.add_message(
        {
            "header": {"msg_type": "error"},
            "content": {"ename": "ValueError", "evalue": VALUE, "traceback": [VALUE]},
        }
    )
    outputs = collector.finish()
    assert outputs[0]["text"] == "***KEY***\n"
    assert collector.error == {
        "ename": "ValueError", "evalue": "***KEY***", "traceback": ["***KEY***"]
    }  # fmt: skip


def test_short_values_are_masked_only_as_they_are():
    masker = Masker({"PIN": "42"})
    assert masker.text("pin 42, hex 3432") == "pin ***PIN***, hex 3432"
