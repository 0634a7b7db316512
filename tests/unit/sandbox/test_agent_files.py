"""The files shipped to a Swarm sandbox are all its agent needs to start."""

from __future__ import annotations

import subprocess
import sys

from gateway.sandbox.swarm.placement import AGENT_FILES


def test_the_agent_imports_from_nothing_but_the_files_shipped_beside_it(tmp_path):
    """A module the workspace imports and no config ships stops every Swarm sandbox's agent."""
    for target, path in AGENT_FILES.items():
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target).write_bytes(path.read_bytes() if path else b"")
    probe = (
        "import sys; sys.path.insert(0, '.'); import agent, gateway;"
        " assert gateway.__file__.startswith(sys.argv[1]), gateway.__file__"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
