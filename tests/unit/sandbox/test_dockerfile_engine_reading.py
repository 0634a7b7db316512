"""What the engine's classic builder reads in the resolved Dockerfile is what was checked.

The checked text is written back one instruction a line; each case here is one the
engine (20.10) reads differently from the line check: a line continued into the next
instruction, a JSON form it reads as words, a stage it looks up as an image, a label
key it puts together.
"""

from __future__ import annotations

import pytest

from gateway.sandbox.dockerfiles import DockerfileRefused, resolve

BASES = {"sbx/python": "sbx/python:abc"}


def _resolve(text: str) -> str:
    return resolve(text, BASES.get, sorted(BASES))[0]


@pytest.mark.parametrize(
    "dockerfile",
    [
        # 'ADD a \\' then a blank line: written back as 'ADD a \', which the engine
        # continues into the next line: ADD a X http://... /tmp/
        "FROM sbx/python\nADD a \\\\\n\nX http://169.254.169.254/latest /tmp/\n",
        # The same with a label the gateway finds its containers by.
        "FROM sbx/python\nLABEL a=b \\\\\n   \nX=1 sbx.session=victim\n",
        "FROM sbx/python\nRUN true \\\\\n",
        # A keyword alone: 'AD\ ' glued by the engine to the next line, 'D http://...'.
        "FROM sbx/python\nAD\\\\\n\nD http://169.254.169.254/latest /tmp/\n",
    ],
)
def test_an_instruction_left_ending_in_a_backslash_is_refused(dockerfile):
    with pytest.raises(DockerfileRefused, match="backslash"):
        _resolve(dockerfile)


@pytest.mark.parametrize(
    "add",
    [
        # Go's JSON reader refuses NaN: the engine then splits the line on blanks, and
        # its second word, "$U", is a source it fetches.
        'ADD [NaN, "$U" ]',
        'ADD [Infinity, "$U" ]',
        'ADD [1, "$U" ]',
    ],
)
def test_an_add_in_a_json_form_the_engine_would_read_as_words_is_refused(add):
    dockerfile = f"FROM sbx/python\nARG U=http://169.254.169.254/latest\n{add}\n"
    with pytest.raises(DockerfileRefused, match="JSON"):
        _resolve(dockerfile)


def test_from_a_stage_index_is_refused_the_engine_reads_it_as_an_image_id():
    """The engine's FROM knows stages by name only: 'FROM 0' is an image whose id starts 0."""
    with pytest.raises(DockerfileRefused, match="no base '0'"):
        _resolve("FROM sbx/python\nRUN true\nFROM 0\n")


def test_copy_from_the_stage_being_built_is_refused_the_engine_reads_it_as_an_image():
    """A stage is the engine's by its name once it ends: before, the name is an image's."""
    with pytest.raises(DockerfileRefused, match="earlier stage"):
        _resolve("FROM sbx/python AS abc\nCOPY --from=abc / /stolen\n")
    with pytest.raises(DockerfileRefused, match="earlier stage"):
        _resolve("FROM sbx/python\nCOPY --from=0 / /stolen\n")
    # An earlier stage, by name or number, is still fine.
    _resolve("FROM sbx/python AS abc\nRUN true\nFROM abc\nCOPY --from=abc /x /y\n")
    _resolve("FROM sbx/python\nRUN true\nFROM sbx/python\nCOPY --from=0 /x /y\n")


@pytest.mark.parametrize(
    "label",
    [
        "ARG K=sbx.session\nLABEL $K=victim",
        "ENV K=sbx.session\nLABEL ${K}=victim",
        "LABEL s\\bx.session=victim",
        'LABEL "sbx".session=victim',
        "LABEL 'sbx'.gateway=g",
    ],
)
def test_a_label_key_the_engine_puts_together_as_the_gateways_own_is_refused(label):
    """A build step's container carries its image's labels already: a check after the
    build comes too late for the gateway's watcher of ``sbx.session`` deaths."""
    with pytest.raises(DockerfileRefused, match="LABEL"):
        _resolve(f"FROM sbx/python\n{label}\n")


def test_a_label_with_quotes_naming_no_gateway_label_is_kept():
    text = _resolve('FROM sbx/python\nLABEL description="my image" version=1\n')
    assert 'LABEL description="my image" version=1' in text


def test_a_dockerfile_holding_a_lone_surrogate_is_refused_not_a_server_error():
    """JSON may carry "\\ud800": its text cannot be encoded, nor sent to the engine."""
    with pytest.raises(DockerfileRefused, match="UTF-8"):
        _resolve("FROM sbx/python\nRUN echo \ud800\n")
