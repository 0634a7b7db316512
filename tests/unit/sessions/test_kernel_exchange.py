"""A saved namespace crossing a kernel's run directory: nothing left there is followed or kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import file_facts, host_file

from gateway.errors import StateNotSaved
from gateway.sessions.state import _hand_over, _take


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """The kernel's run directory and the session's state directory beside it."""
    run, state = tmp_path / "run", tmp_path / "state"
    run.mkdir()
    return run, state


def test_a_directory_left_as_the_state_is_refused_and_nothing_of_it_is_kept(dirs):
    run, state = dirs
    (run / "saved" / "deep" / "er").mkdir(parents=True)
    (run / "saved" / "deep" / "file").write_bytes(b"x" * 1000)
    with pytest.raises(StateNotSaved):
        _take(run / "saved", state / "namespace.pkl")
    assert os.listdir(state) == [], "the kernel's directory was kept in the state directory"


def test_a_link_left_as_the_state_is_refused_never_followed(dirs, tmp_path):
    victim = host_file(tmp_path)
    run, state = dirs
    before = file_facts(victim)
    (run / "saved").symlink_to(victim)
    with pytest.raises(StateNotSaved):
        _take(run / "saved", state / "namespace.pkl")
    assert os.listdir(state) == [] and file_facts(victim) == before


def test_the_state_is_handed_over_in_place_of_a_planted_link(dirs, tmp_path):
    victim = host_file(tmp_path)
    run, state = dirs
    before = file_facts(victim)
    state.mkdir()
    (state / "namespace.pkl").write_bytes(b"pickle")
    (run / "exchanged").symlink_to(victim)
    _hand_over(state / "namespace.pkl", run / "exchanged")
    assert file_facts(run / "exchanged")[0::3] == (0o644, b"pickle")
    assert file_facts(victim) == before
