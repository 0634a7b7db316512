"""A kernel's stream is masked as one text: what listeners hear, not only what is stored."""

from __future__ import annotations

from gateway.execution.outputs import OutputCollector
from gateway.masking import Masker

VALUE = "k3y/with+odd=chars&more"


def stream(text: str, name: str = "stdout") -> dict:
    return {"header": {"msg_type": "stream"}, "content": {"name": name, "text": text}}


def display(text: str) -> dict:
    return {
        "header": {"msg_type": "display_data"},
        "content": {"data": {"text/plain": text}, "metadata": {}},
    }


def collect(messages: list[dict]) -> tuple[list, list]:
    heard: list = []
    collector = OutputCollector(1 << 20, heard.append, mask=Masker({"KEY": VALUE}))
    for msg in messages:
        collector.add_message(msg)
    return heard, collector.finish()


def test_listeners_hear_a_secret_split_across_stream_messages_masked() -> None:
    for cut in range(1, len(VALUE)):
        heard, outputs = collect([stream("key " + VALUE[:cut]), stream(VALUE[cut:] + "\n")])
        said = "".join(output["text"] for output in heard)
        assert said == "key ***KEY***\n", cut
        assert outputs == [{"output_type": "stream", "name": "stdout", "text": said}]


def test_what_was_held_back_comes_before_the_next_output_in_order() -> None:
    heard, outputs = collect(
        [stream("a k3y"), display("d"), stream("b k3y", "stderr"), stream("c\n")]
    )
    shown = [(o["output_type"], o.get("name"), o.get("text") or o["data"]) for o in heard]
    assert shown == [
        ("stream", "stdout", "a "),
        ("stream", "stdout", "k3y"),
        ("display_data", None, {"text/plain": "d"}),
        ("stream", "stderr", "b "),
        ("stream", "stderr", "k3y"),
        ("stream", "stdout", "c\n"),
    ]
    assert [o.get("text") for o in outputs] == ["a k3y", None, "b k3y", "c\n"]
