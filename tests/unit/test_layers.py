"""The bottom of the picture imports nothing above it (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway
from gateway import config
from gateway.sandbox.isolation import runtimes

PACKAGE = Path(gateway.__file__).parent
# Modules every room may import; each imports only others of this list.
BOTTOM = {"errors", "limits", "validation", "timestamps", "hosts", "masking", "config", "tasks"}


def imports_of(module: str) -> set[str]:
    """The gateway modules ``module`` imports (relative imports, resolved to their top name)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.add((node.module or "").split(".")[0] or node.names[0].name)
    return found


def test_the_bottom_modules_import_only_each_other():
    for module in sorted(BOTTOM):
        above = imports_of(module) - BOTTOM
        assert not above, f"{module}.py imports {sorted(above)}, above it in the picture"


def test_config_names_the_runtimes_the_sandbox_offers():
    assert set(config.RUNTIMES) == set(runtimes.RUNTIMES)
