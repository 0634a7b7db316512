"""Every request of E2B's templates and contexts that changes state is audited, as /v1's are."""

from __future__ import annotations

import pytest

from gateway.api.e2b import builds, interpreter


@pytest.mark.parametrize(
    ("handler", "method"),
    [
        (interpreter.ContextHandler, "DELETE"),  # /v1's DELETE of a context is audited
        (builds.TemplateFilesHandler, "PUT"),  # a build's files, kept on the gateway's disk
    ],
)
def test_a_state_change_names_its_audited_action(handler, method):
    assert handler.actions.get(method)
