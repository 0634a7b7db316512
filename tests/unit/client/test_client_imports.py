"""The SDK stands alone: importing it loads nothing of the server side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER_PACKAGES = {"docker", "tornado", "jupyter_client", "zmq", "mcp", "ipykernel"}
SERVER_PACKAGES |= {"e2b", "connectrpc", "protobuf"}  # the E2B edge's protocol code


@pytest.mark.parametrize(
    "statement",
    [
        "import gateway",
        "import gateway.client",
        "from gateway.client import Client, AsyncClient, Session",
    ],
)
def test_importing_the_sdk_loads_no_server_modules(statement):
    # A fresh interpreter in this tree: the test process has the server loaded already.
    probe = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    modules = json.loads(done.stdout)
    packages = {name.split(".")[0] for name in modules} & SERVER_PACKAGES
    assert not packages, f"`{statement}` loads {sorted(packages)}: SDK users would need them"
    # The error tree is shared; any other server module would bring its imports along.
    ours = [m for m in modules if m.startswith("gateway.") and not m.startswith("gateway.client")]
    assert set(ours) <= {"gateway.errors"}, f"`{statement}` loads server modules {ours}"
