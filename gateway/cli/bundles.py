"""Replay bundles: a notebook and the files its session uploaded, in one zip.

``sbx export --with-inputs`` writes one; ``sbx replay`` reads one, or a notebook
plus ``--inputs DIR``. Which files, and their hashes, come from the export's
``metadata.sbx.inputs``; the gateway checks the hashes again before a replay.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

from ..errors import BadRequest

NOTEBOOK = "notebook.ipynb"
INPUTS = "inputs/"
# What a replay may carry: the gateway parses a multipart request in memory up to this.
MAX_INPUTS = 64 * 2**20


def recorded_inputs(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    """The uploads an export recorded: ``path``, ``size``, ``sha256``."""
    return list(notebook.get("metadata", {}).get("sbx", {}).get("inputs") or [])


def matches(record: dict[str, Any], data: bytes) -> bool:
    return hashlib.sha256(data).hexdigest() == record.get("sha256")


def write_bundle(path: Path, notebook: dict[str, Any], inputs: dict[str, bytes]) -> None:
    """Write the notebook and ``inputs`` (workspace path -> content) as a zip."""
    part = path.with_name(f".{path.name}.sbx-part")
    try:
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as bundle:
            bundle.writestr(NOTEBOOK, json.dumps(notebook, indent=1))
            for name, data in sorted(inputs.items()):
                bundle.writestr(INPUTS + name, data)
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)


def read_bundle(path: Path) -> tuple[bytes, dict[str, bytes]]:
    """A bundle's notebook (bytes) and inputs, refused past ``MAX_INPUTS`` before reading."""
    with zipfile.ZipFile(path) as bundle:
        members = [m for m in bundle.infolist() if not m.is_dir()]
        if sum(m.file_size for m in members) > MAX_INPUTS:
            raise BadRequest(f"{path} holds more than a replay can carry ({MAX_INPUTS} bytes)")
        names = {m.filename for m in members}
        if NOTEBOOK not in names:
            raise BadRequest(f"{path} is a zip without {NOTEBOOK}: not a bundle of sbx export")
        inputs = {
            name.removeprefix(INPUTS): bundle.read(name)
            for name in sorted(names)
            if name.startswith(INPUTS)
        }
        return bundle.read(NOTEBOOK), inputs


def inputs_from(directory: Path, notebook: dict[str, Any]) -> dict[str, bytes]:
    """The recorded inputs found under ``directory`` (all its files if none are recorded)."""
    if not directory.is_dir():
        raise BadRequest(f"--inputs {directory} is not a directory")
    records = recorded_inputs(notebook)
    if records:
        paths = [str(r["path"]) for r in records if (directory / str(r["path"])).is_file()]
    else:
        paths = [
            p.relative_to(directory).as_posix()
            for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.is_symlink()
        ]
    if sum((directory / p).stat().st_size for p in paths) > MAX_INPUTS:
        raise BadRequest(f"the inputs under {directory} are more than a replay can carry")
    return {p: (directory / p).read_bytes() for p in paths}
