"""E2B's Template builder steps as a Dockerfile: one instruction a line, users mapped, no more."""

from __future__ import annotations

import pytest

from gateway.api.e2b.builds import build_status, dockerfile_of
from gateway.errors import BadRequest

HASH = "a" * 64


def test_steps_become_a_dockerfile_that_copies_each_upload_from_its_own_directory():
    dockerfile, hashes = dockerfile_of(
        {
            "fromImage": "e2bdev/base",
            "steps": [
                {"type": "RUN", "args": ["echo a\necho b"]},
                {"type": "RUN", "args": ["pip install six", "root"]},
                {"type": "COPY", "args": ["data.txt", "/opt/d", "user", "0600"], "filesHash": HASH},
                {"type": "ENV", "args": ["A", "1 2", "B", 'q"uote']},
                {"type": "WORKDIR", "args": ["/opt"]},
                {"type": "USER", "args": ["root"]},
            ],
        }
    )
    assert hashes == [HASH]
    assert dockerfile.splitlines() == [
        "FROM e2bdev/base",
        'RUN ["/bin/sh", "-c", "echo a\\necho b"]',
        "USER root",
        "# sbx: pip install six",  # its wheels fetched by the gateway (sandbox/wheels.py)
        "USER 1000:1000",
        f'COPY --chown=1000:1000 ["{HASH}/data.txt", "/opt/d"]',
        "USER root",
        'RUN ["chmod", "0600", "/opt/d"]',
        "USER 1000:1000",
        'ENV A="1 2" B="q\\"uote"',
        "WORKDIR /opt",
        "USER root",
    ]


def test_a_template_from_a_template_names_it_as_its_base():
    assert dockerfile_of({"fromTemplate": "geo", "steps": []})[0] == "FROM geo\n"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"startCmd": "python server.py"}, "start and ready commands"),
        ({"steps": [{"type": "WORKDIR", "args": ["/x\nRUN id"]}]}, "one line"),
        ({"steps": [{"type": "USER", "args": ["a\x00"]}]}, "one line"),
        ({"fromImage": "base\nADD http://x /y"}, "one line"),
        ({"steps": [{"type": "HEALTHCHECK", "args": []}]}, "not supported"),
        ({"steps": "RUN id"}, "must be a list"),
    ],
)
def test_what_cannot_be_a_line_of_a_dockerfile_is_refused(body, says):
    with pytest.raises(BadRequest) as refused:
        dockerfile_of(body)
    assert says in refused.value.message


def test_a_failed_build_reads_as_e2bs_reason_and_its_log_from_an_offset():
    doc = {
        "id": "x",
        "name": "geo",
        "status": "failed",
        "logs": ["one", "two", "three"],
        "error": {"step": "step 2 (RUN exit 3)", "reason": "returned a non-zero code: 3"},
    }
    shown = build_status(doc, "b" * 32, 1)
    assert shown["status"] == "error" and shown["buildID"] == "b" * 32
    assert shown["logs"] == ["two", "three"]
    assert [e["message"] for e in shown["logEntries"]] == ["two", "three"]
    assert shown["reason"] == {"message": "step 2 (RUN exit 3): returned a non-zero code: 3"}
