"""What clients ask of sessions, read at the edge: each body becomes its typed request or a
400 that names the field at fault and what it should be."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest, PolicyInvalid
from gateway.sessions.kernel_env import kernel_start
from gateway.sessions.requests import (
    BuildTemplate,
    CreateSession,
    ExecuteCode,
    PauseSession,
    StartCommand,
    TakeSnapshot,
    UpdateSession,
)


def test_an_empty_create_is_a_python_session_on_the_servers_defaults():
    request = CreateSession.from_json({})
    assert (request.kernel, request.session_id, request.image, request.runtime) == (
        "python3", None, None, None,
    )  # fmt: skip
    assert (request.limits, request.env, request.secrets, request.metadata) == ({}, {}, (), {})
    assert (request.ttl, request.idle_timeout, request.idle_action) == (None, None, None)
    assert request.network.rules is None and request.secrets_as == "env"


def test_a_create_reads_every_field_into_its_type():
    request = CreateSession.from_json(
        {
            "kernel": "ir", "id": "ABCDEF00-0000-4000-8000-000000000001",
            "limits": {"memory": "512m", "pids": 64}, "ttl": 60, "idle_timeout": 5.5,
            "idle_action": "pause", "start_timeout": 30, "runtime": "gvisor",
            "network": {"allow": ["pypi.example:443"]}, "env": {"MODE": "fast"},
            "secrets": ["WAREHOUSE_KEY"], "secrets_as": "files", "metadata": {"team": "a", "n": 2},
        }
    )  # fmt: skip
    assert request.kernel == "ir"
    assert request.session_id == "abcdef00-0000-4000-8000-000000000001"
    assert request.limits == {"memory": 512 * 2**20, "pids": 64}
    assert (request.ttl, request.idle_timeout, request.start_timeout) == (60.0, 5.5, 30.0)
    assert (request.idle_action, request.runtime, request.secrets_as) == (
        "pause",
        "gvisor",
        "files",
    )
    assert [(r.name, r.port) for r in request.network.rules] == [("pypi.example", 443)]
    assert (request.env, request.secrets) == ({"MODE": "fast"}, ("WAREHOUSE_KEY",))
    assert request.metadata == {"team": "a", "n": 2}


def test_a_fork_takes_its_kernel_from_the_snapshot():
    request = CreateSession.from_json({"from_snapshot": "snap-1"})
    assert (request.from_snapshot, request.kernel) == ("snap-1", "")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "the request body must be a JSON object"),
        ({"kernel": 3}, "kernel must be a kernelspec name"),
        ({"kernel": 0}, "kernel must be a kernelspec name"),  # falsy: was read as the default
        ({"kernel": False}, "kernel must be a kernelspec name"),
        ({"kernel": []}, "kernel must be a kernelspec name"),
        ({"id": "not-a-uuid"}, "id must be a UUID"),
        ({"runtime": ["runc"]}, "runtime must be one of"),
        ({"from_snapshot": 7}, "from_snapshot must be a snapshot id"),
        ({"ttl": True}, "ttl must be a number of seconds"),
        ({"ttl": "60"}, "ttl must be a number of seconds"),
        ({"idle_timeout": float("nan")}, "idle_timeout must be a number of seconds"),
        ({"idle_action": "sleep"}, "idle_action must be 'end' or 'pause', not 'sleep'"),
        ({"secrets_as": "disk"}, "secrets_as must be 'env' or 'files', not 'disk'"),
        ({"secrets_as": 0}, "secrets_as must be 'env' or 'files', not 0"),
        ({"env": {"A": 1}}, "env must be an object of string values"),
        ({"env": {"1A": "x"}}, "invalid environment variable name(s): ['1A']"),
        ({"secrets": "KEY"}, "secrets must be a list of secret names"),
        ({"secrets": ["A"], "env": {"A": "x"}}, "A named in both env and secrets; name each once"),
        ({"network": "all"}, 'network must be "none" or {"allow"'),
        ({"metadata": [1]}, "metadata must be an object of strings, numbers or booleans"),
        ({"image": 5}, "image must name an image the gateway built"),
        ({"limits": {"gpu": 1}}, "unknown limit(s) ['gpu']; known limits:"),
    ],
)
def test_a_bad_create_is_a_400_naming_the_field(body, says):
    with pytest.raises(BadRequest) as refused:
        CreateSession.from_json(body)
    assert refused.value.status == 400 and says in refused.value.message


def test_a_session_policy_that_is_not_a_table_is_refused_as_a_policy():
    with pytest.raises(PolicyInvalid, match="a policy is a table of mode, rules and patterns"):
        CreateSession.from_json({"policy": "strict"})


def test_an_update_changes_only_the_lifetime_and_idle_timeout():
    assert UpdateSession.from_json({"ttl": 120}) == UpdateSession(ttl=120.0)
    assert UpdateSession.from_json({"expires_in": 30, "idle_timeout": 10}) == UpdateSession(
        idle_timeout=10.0, expires_in=30.0
    )
    with pytest.raises(BadRequest, match=r"only ttl, expires_in and idle_timeout .* \['kernel'\]"):
        UpdateSession.from_json({"kernel": "ir", "ttl": 1})
    with pytest.raises(BadRequest, match=r"give ttl .* or expires_in .*, not both"):
        UpdateSession.from_json({"ttl": 1, "expires_in": 1})


def test_an_execute_needs_code_and_may_bring_a_timeout_description_and_env():
    request = ExecuteCode.from_json(
        {"code": "1 + 1", "timeout": 5, "description": "# adds", "env": {"A": "b"}}
    )
    assert request == ExecuteCode("1 + 1", 5.0, "# adds", {"A": "b"})
    assert ExecuteCode.from_json({"code": ""}) == ExecuteCode("")
    for body, says in [
        ({}, "code must be a string of source code"),
        ({"code": ["print(1)"]}, "code must be a string of source code"),
        ({"code": "x", "description": 1}, "description must be a markdown string"),
        ({"code": "x", "timeout": "soon"}, "timeout must be a number of seconds"),
        ({"code": "x", "env": {"A": None}}, "env must be an object of string values"),
    ]:
        with pytest.raises(BadRequest) as refused:
            ExecuteCode.from_json(body)
        assert says in refused.value.message, body


def test_a_pause_and_a_snapshot_take_an_optional_strategy_and_name():
    assert PauseSession.from_json({}) == PauseSession(None)
    assert PauseSession.from_json({"strategy": "replay"}) == PauseSession("replay")
    assert TakeSnapshot.from_json({"name": "before", "strategy": "namespace"}) == TakeSnapshot(
        "before", "namespace"
    )
    assert PauseSession.from_json({"strategy": "freeze"}) == PauseSession("freeze")
    with pytest.raises(BadRequest, match="one of freeze, checkpoint, namespace, replay, not 1"):
        PauseSession.from_json({"strategy": 1})
    with pytest.raises(BadRequest, match="one of checkpoint, namespace, replay, not 'freeze'"):
        TakeSnapshot.from_json({"strategy": "freeze"})  # a snapshot is kept on disk


def test_a_strategy_outside_the_documented_ones_is_refused_before_any_session_is_touched():
    """Pausing a paused session answers as the pause did, so the name is checked on the way in."""
    for strategy in ["", "Replay", "snapshot", "namespace\x00"]:
        for request in (PauseSession, TakeSnapshot):
            with pytest.raises(BadRequest, match="strategy must be one of") as refused:
                request.from_json({"strategy": strategy})
            assert repr(strategy) in refused.value.message
    with pytest.raises(BadRequest, match="name must be a string of at most 200 characters"):
        TakeSnapshot.from_json({"name": "x" * 201})


def test_a_command_is_a_shell_line_run_in_the_workspace():
    request = StartCommand.from_json({"command": "ls -l", "cwd": "data", "timeout": 9})
    assert request.argv == ["/bin/sh", "-c", "ls -l"]
    assert (request.cwd, request.timeout, request.env) == ("data", 9.0, {})
    assert StartCommand.from_json({"command": "pwd"}).cwd == ""
    for body, says in [
        ({"command": "   "}, "command must be a shell command line"),
        ({"command": ["ls"]}, "command must be a shell command line"),
        ({"command": "ls", "cwd": 5}, "cwd must be a directory path relative to the workspace"),
        ({"command": "ls", "cwd": "../x"}, "contains '..'; paths must stay inside the workspace"),
        ({"command": "ls", "cwd": "/etc"}, "is absolute; paths are relative to the workspace"),
    ]:
        with pytest.raises(BadRequest) as refused:
            StartCommand.from_json(body)
        assert says in refused.value.message, body


@pytest.mark.parametrize("falsy", [0, False, {}])
def test_a_falsy_value_of_the_wrong_type_is_refused_not_read_as_the_default(falsy):
    """``value or default`` read a kernel of 0 as python3 (schemathesis: 201 for kernel 0)."""
    with pytest.raises(BadRequest, match="tags must be a list"):
        BuildTemplate.from_json({"name": "t", "dockerfile": "FROM python", "tags": falsy})
    with pytest.raises(BadRequest, match="name must be a kernelspec name"):
        kernel_start({"name": falsy}, "created")
