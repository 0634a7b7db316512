"""The output collector: what a kernel's messages become as nbformat outputs, under a byte cap."""

from __future__ import annotations

import json

import pytest

from gateway.execution.outputs import OutputCollector


def msg(kind: str, **content) -> dict:
    return {"header": {"msg_type": kind}, "parent_header": {}, "metadata": {}, "content": content}


def test_collector_merges_streams_and_keeps_rich_outputs():
    c = OutputCollector(cap_bytes=10_000)
    c.add_message(msg("execute_input", code="x", execution_count=3))
    c.add_message(msg("stream", name="stdout", text="a"))
    c.add_message(msg("stream", name="stdout", text="b"))
    c.add_message(msg("display_data", data={"text/plain": "fig"}, metadata={}))
    c.add_message(msg("execute_result", data={"text/plain": "1"}, metadata={}, execution_count=3))
    outputs = c.finish()
    assert outputs[0] == {"output_type": "stream", "name": "stdout", "text": "ab"}
    assert [o["output_type"] for o in outputs] == ["stream", "display_data", "execute_result"]
    assert c.execution_count == 3 and not c.truncated


def test_collector_cuts_at_the_cap_with_a_marker_but_keeps_errors():
    c = OutputCollector(cap_bytes=100)
    for _ in range(50):
        c.add_message(msg("stream", name="stdout", text="x" * 10))
    c.add_message(msg("display_data", data={"text/plain": "y" * 500}, metadata={}))
    c.add_message(msg("error", ename="ValueError", evalue="bad", traceback=["tb"]))
    outputs = c.finish()
    assert outputs[0]["text"] == "x" * 100
    assert outputs[1]["output_type"] == "error" and c.error["ename"] == "ValueError"
    assert "output truncated" in outputs[-1]["text"] and c.truncated


def test_collector_honours_clear_output_and_display_updates():
    c = OutputCollector(cap_bytes=10_000)
    c.add_message(msg("stream", name="stdout", text="old"))
    c.add_message(msg("clear_output", wait=True))
    c.add_message(
        msg("display_data", data={"text/plain": "1"}, metadata={}, transient={"display_id": "d"})
    )
    c.add_message(
        msg(
            "update_display_data",
            data={"text/plain": "2"},
            metadata={},
            transient={"display_id": "d"},
        )
    )
    outputs = c.finish()
    assert len(outputs) == 1 and outputs[0]["data"] == {"text/plain": "2"}


def test_collector_charges_every_payload_even_what_it_does_not_keep():
    """Clears, display updates, comm messages and input requests once cost nothing."""
    c = OutputCollector(cap_bytes=1000)
    for _ in range(5):  # a clear gives no bytes back
        c.add_message(msg("stream", name="stdout", text="x" * 150))
        c.add_message(msg("clear_output", wait=False))
    assert c.used == 750 and not c.truncated
    shown = {"data": {"text/plain": "1"}, "metadata": {}, "transient": {"display_id": "d"}}
    c.add_message(msg("display_data", **shown))
    c.add_message(msg("update_display_data", **{**shown, "data": {"text/plain": "2" * 500}}))
    c.add_message(msg("comm_msg", comm_id="c", data={"blob": "z" * 500}))
    c.add_message(msg("input_request", prompt="p" * 500, password=False))
    outputs = c.finish()
    assert outputs[0]["data"] == {"text/plain": "1"}, "an update past the cap is dropped"
    assert c.dropped > 1500 and "output truncated" in outputs[-1]["text"]


def test_collector_cuts_a_huge_error_to_its_budget():
    c = OutputCollector(cap_bytes=100)
    c.add_message(msg("error", ename="E", evalue="v" * 10**7, traceback=["t" * 10**6] * 50))
    outputs = c.finish()
    assert len(json.dumps(outputs)) < 64 * 1024 and c.truncated
    assert c.error["evalue"].endswith(" cut]") and len(c.error["traceback"]) == 20


def test_collector_keeps_outputs_nbformat_refuses_instead_of_failing():
    """A kernel's non-text MIME value once made the execute a 500 and left the session busy."""
    c = OutputCollector(cap_bytes=10_000)
    c.add_message(msg("display_data", data={"x": 1, "application/json": {"a": 1}}, metadata={}))
    c.add_message(msg("execute_result", data={"text/plain": "1"}, metadata=7, execution_count=1))
    c.add_message(msg("stream", name="stdout", text=["not", "a", "string"]))
    c.add_message(msg("display_data", data=[], metadata={}))
    outputs = c.finish()
    assert outputs[0]["data"] == {"x": "1", "application/json": {"a": 1}}
    assert outputs[1]["metadata"] == {} and outputs[1]["data"] == {"text/plain": "1"}
    assert all(o["output_type"] == "stream" for o in outputs[2:])
    assert "cannot hold" in outputs[-1]["text"]


def test_collector_drops_messages_of_the_wrong_shape_without_raising():
    """A kernel signs with its own key: each of these raised in the gateway, failing the execute."""
    c = OutputCollector(cap_bytes=10_000)
    shown = {"display_id": "d"}
    kept = msg("display_data", data={"text/plain": "kept"}, metadata={}, transient=shown)
    c.add_message(kept)
    hostile = [
        msg("error", ename=5, evalue="x", traceback=[]),
        msg("error"),
        msg("stream", text="no name"),
        msg("display_data", data={"text/plain": "x"}, metadata={}, transient=[1]),
        msg("update_display_data", data=[1], metadata={}, transient={"display_id": "d"}),
        msg("update_display_data", data={}, metadata={}, transient="d"),
        msg("update_display_data", data={"text/plain": "new"}, metadata=[1], transient=shown),
        msg("execute_result", data={"text/plain": "x"}, metadata={}),
        msg("execute_input", execution_count="7; DROP TABLE"),
        msg("execute_input", execution_count=True),
    ]
    for message in hostile:
        c.add_message(message)
    outputs = c.finish()
    assert outputs[0]["data"] == {"text/plain": "new"}, outputs
    assert outputs[0]["metadata"] == {"sbx_display_id": "d"}
    assert c.execution_count is None and c.error is None
    assert all(o["output_type"] != "error" for o in outputs)


def test_a_flood_of_clears_with_nothing_to_clear_costs_no_writes():
    """Each clear the listener hears is a row written; a clear carries no payload to charge."""
    heard: list = []
    c = OutputCollector(cap_bytes=10_000, listener=heard.append)
    for _ in range(1000):
        c.add_message(msg("clear_output", wait=False))
    c.add_message(msg("stream", name="stdout", text="x"))
    for _ in range(1000):
        c.add_message(msg("clear_output", wait=False))
    assert heard == [{"output_type": "stream", "name": "stdout", "text": "x"}, None]
    assert c.finish() == []


def test_empty_streams_cost_no_writes():
    """An empty stream is charged nothing, so each one stored was a free row in the store."""
    heard: list = []
    c = OutputCollector(cap_bytes=10_000, listener=heard.append)
    for _ in range(1000):
        c.add_message(msg("stream", name="stdout", text=""))
    c.add_message(msg("stream", name="stdout", text="x"))
    assert heard == [{"output_type": "stream", "name": "stdout", "text": "x"}]
    assert c.finish() == heard


def test_display_updates_do_not_scan_every_output():
    """Updates for ids never shown cost little each, and each one scanned every output kept."""
    import time

    c = OutputCollector(cap_bytes=4 * 1024 * 1024)
    for _ in range(10_000):
        c.add_message(msg("display_data", data={"text/plain": "x"}, metadata={}))
    shown = {"display_id": "d"}
    c.add_message(msg("display_data", data={"text/plain": "old"}, transient=shown))
    started = time.process_time()
    for n in range(20_000):
        c.add_message(msg("update_display_data", data={}, transient={"display_id": str(n)}))
    took = time.process_time() - started
    c.add_message(msg("update_display_data", data={"text/plain": "new"}, transient=shown))
    assert c.outputs[-1]["data"] == {"text/plain": "new"} and not c.truncated
    assert took < 2.0, f"20,000 updates of unknown displays took {took:.1f} s of CPU"


def test_plain_outputs_match_nbformat_and_odd_ones_still_validate():
    import nbformat
    from nbformat.v4 import output_from_msg

    from gateway.execution.outputs import _output

    messages = [
        msg("stream", name="stdout", text="hi\n"),
        msg("display_data", data={"image/png": "iVBOR", "text/plain": "<fig>"}, metadata={}),
        msg("display_data", data={"application/json": {"a": [1, 2]}}, metadata={"x": 1}),
        msg("execute_result", data={"text/plain": "42"}, metadata={}, execution_count=7),
        msg("error", ename="ValueError", evalue="bad", traceback=["tb 1", "tb 2"]),
    ]
    for message in messages:
        assert _output(message) == output_from_msg(message), message["header"]["msg_type"]
    odd = msg("display_data", data={"text/plain": {"not": "text"}}, metadata=[])
    nbformat.validate(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[_output(odd)])])
    )


@pytest.mark.parametrize(
    ("sent", "kept"), [(7, 7), (2**31 - 1, 2**31 - 1), (2**31, None), (2**63, None), (-1, None),
                       (True, None), (1.0, None), ("7", None)],
)  # fmt: skip
def test_an_execution_count_is_kept_only_if_a_store_column_holds_it(sent, kept):
    """A kernel chooses the number: 2**63 once cost its execution the record."""
    from gateway.execution.outputs import execution_count

    assert execution_count({"execution_count": sent}) == kept
