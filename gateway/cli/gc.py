"""``sbx gc``: find, and with ``--yes`` remove, what no gateway will reap.

A gateway that stops keeps its sessions running on purpose, and the next
start on its data directory reattaches them and removes whatever no open
session accounts for. Nobody reaps the rest: sandboxes and workspaces of a
gateway that never starts again on its data directory, those whose session
ended while the engine was down, and everything of a data directory that was
deleted (a workspace's loop mount outlives ``rm -rf``).

The host is searched, not one data directory: kernel containers by their
``sbx.gateway`` label (the data directory is where their socket directory
is mounted from) and stdio tool servers' containers beside them (their
session's run directory is a label), loop-mounted workspaces in ``/proc/self/mountinfo``, and
the session directories of every data directory found so. A data directory
whose store a process holds open belongs to a running gateway and is left
alone: its warm pool and sessions still starting are in no store.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sqlite3
from pathlib import Path

import docker

from ..config import Settings
from ..sandbox import volume
from ..sandbox.docker.provisioner import (
    CONTAINER_RUN_DIR,
    LABEL_GATEWAY,
    LABEL_SESSION,
    sandbox_name,
)
from ..sandbox.docker.tool_servers import LABEL_RUN_DIR, LABEL_TOOL_SERVER, NAME_PREFIX
from ..store.postgres import GATEWAY_ID_FILE
from ..store.sqlite import read_open_sessions

STORE = "gateway.sqlite3"
# A workspace mount point: <data dir>/sessions/<session id>/workspace.
_WORKSPACE = re.compile(r"^(?P<data>/.+)/sessions/(?P<session>[^/]+)/workspace$")
# A session's run directory, which its kernel container mounts: <data dir>/sessions/<id>/run.
_RUN_DIR = re.compile(r"^(?P<data>/.+)/sessions/(?P<session>[^/]+)/run$")


@dataclasses.dataclass(frozen=True)
class Orphan:
    """One thing no gateway will remove, and why."""

    kind: str  # "container" or "directory"
    target: str  # a container id, or a session directory
    session_id: str
    why: str


@dataclasses.dataclass(frozen=True)
class DataDir:
    """What a data directory says about its sessions."""

    path: Path
    running: bool  # a gateway holds its store open
    gateway_id: str | None
    open_sessions: frozenset[str]

    @classmethod
    def read(cls, path: Path, busy: set[Path]) -> DataDir:
        store = path / STORE
        if not store.is_file():
            # A store on a shared database says nothing here: touch nothing of it.
            shared = (path / GATEWAY_ID_FILE).is_file()
            return cls(path, shared, None, frozenset())
        try:
            gateway_id, ids = read_open_sessions(store)
        except sqlite3.Error:  # not a store we can read: treat it as in use, touch nothing
            return cls(path, True, None, frozenset())
        return cls(path, store in busy, gateway_id, frozenset(ids))

    def why_orphan(self, session_id: str, gateway_id: str | None = None) -> str | None:
        """Why a session's leftovers here are orphans; None when they are not."""
        if self.running:
            return None
        if self.gateway_id is None:
            return f"its data directory {self.path} is gone"
        if gateway_id is not None and gateway_id != self.gateway_id:
            return f"its gateway {gateway_id} no longer owns {self.path}"
        if session_id not in self.open_sessions:
            return "its session is not open"
        return None


def find_orphans(
    client: docker.DockerClient, data_dirs: list[Path], under: Path | None = None
) -> list[Orphan]:
    """Every container and session directory under ``under`` that no gateway will reap."""
    containers = client.api.containers(all=True, filters={"label": LABEL_GATEWAY})
    for container in containers:  # a run-dir label its image gave it: an old gateway set none
        if _tool_server_of(container) and _image_label(client, container, LABEL_RUN_DIR):
            del container["Labels"][LABEL_RUN_DIR]
    found_dirs = set(data_dirs) | {data for data, _ in _workspace_mounts()}
    owned: list[tuple[dict, Path]] = []
    for container in containers:
        data = _data_dir_of(container)
        if data is not None:
            owned.append((container, data))
            found_dirs.add(data)
    # A stdio server labelled before its run directory was: its gateway's kernels' data dir.
    gateways = {c["Labels"][LABEL_GATEWAY]: data for c, data in owned}
    for container in containers:
        if _tool_server_of(container) and LABEL_RUN_DIR not in container["Labels"]:
            data = gateways.get(container["Labels"][LABEL_GATEWAY])
            if data is not None:  # else nothing on this host says whose it is: left alone
                owned.append((container, data))
    if under is not None:
        found_dirs = {d for d in found_dirs if d.is_relative_to(under)}
    busy = _open_stores()
    dirs = {path: DataDir.read(path, busy) for path in found_dirs}
    orphans = []
    for container, data in owned:
        labels = container["Labels"]
        session_id = _session_of(container)
        why = data in dirs and dirs[data].why_orphan(session_id, labels[LABEL_GATEWAY])
        if why:
            orphans.append(Orphan("container", container["Id"], session_id, why))
    for data_dir in dirs.values():
        sessions = data_dir.path / "sessions"
        entries = sorted(sessions.iterdir()) if sessions.is_dir() else []
        for entry in entries:
            why = data_dir.why_orphan(entry.name)
            if why:
                orphans.append(Orphan("directory", str(entry), entry.name, why))
    return orphans


def _session_of(container: dict) -> str:
    """The session a kernel container serves: the one it is named after, else its label's.

    A resume that took a pooled container renames it after the session; its
    label keeps the pooled id (labels cannot change).
    """
    prefix = "/" + sandbox_name("")
    for name in container.get("Names") or []:
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return container["Labels"].get(LABEL_SESSION) or _tool_server_of(container) or "?"


def _tool_server_of(container: dict) -> str | None:
    """The session of a stdio server's container: its label, if its name says the same."""
    session = container["Labels"].get(LABEL_TOOL_SERVER)
    names = container.get("Names") or []
    if session and any(n.startswith(f"/{NAME_PREFIX}{session}-") for n in names):
        return session
    return None


def _image_label(client: docker.DockerClient, container: dict, key: str) -> bool:
    """Whether ``container``'s image carries the label ``key`` (or cannot be read)."""
    if key not in container["Labels"]:
        return False
    try:
        config = client.api.inspect_image(container.get("ImageID") or container.get("Image", ""))
    except docker.errors.APIError:
        return True
    return key in (config.get("Config", {}).get("Labels") or {})


def remove(client: docker.DockerClient, orphan: Orphan) -> None:
    """Remove one orphan: a container by force, a directory unmounted first."""
    if orphan.kind == "container":
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(orphan.target, force=True)
        return
    session_dir = Path(orphan.target)
    volume.destroy(session_dir)
    # A deleted data directory's last remains: empty once its sessions are gone.
    for parent in (session_dir.parent, session_dir.parent.parent):
        with contextlib.suppress(OSError):
            if not (parent / STORE).exists():
                parent.rmdir()


def _data_dir_of(container: dict) -> Path | None:
    """The data directory a kernel container's socket directory is mounted from (or a
    stdio server's session's run directory is, by its label)."""
    server = _tool_server_of(container)
    if server is not None:
        match = _RUN_DIR.match(container["Labels"].get(LABEL_RUN_DIR) or "")
        return Path(match["data"]) if match and match["session"] == server else None
    for mount in container.get("Mounts", []):
        if mount.get("Destination") == CONTAINER_RUN_DIR and mount.get("Type") == "bind":
            match = _RUN_DIR.match(mount["Source"])
            return Path(match["data"]) if match else None
    return None


def _workspace_mounts() -> list[tuple[Path, str]]:
    """(data directory, session id) of every workspace mounted on this host."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # "\040" is a space
        match = _WORKSPACE.match(point)
        if match:
            found.append((Path(match["data"]), match["session"]))
    return found


def _open_stores() -> set[Path]:
    """Every ``gateway.sqlite3`` a process on this host holds open: a running gateway's."""
    held = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.endswith(f"/{STORE}"):
                        held.add(Path(target))
    return held


def run_gc(settings: Settings, args: argparse.Namespace) -> int:
    """``sbx gc``: print the orphans as a table; remove them with ``--yes``."""
    client = docker.from_env()
    under = Path(args.under).resolve() if args.under else None
    data_dirs = [Path(settings.data_dir)] if settings.data_dir else []
    orphans = find_orphans(client, data_dirs, under)
    if args.yes:
        for orphan in orphans:
            remove(client, orphan)
    if args.json:
        found = [dataclasses.asdict(o) for o in orphans]
        print(json.dumps({"orphans": found, "removed": args.yes}, indent=2))
        return 0
    print(f"{'KIND':<10} {'SESSION':<36}  {'WHY':<40} TARGET")
    for orphan in orphans:
        target = orphan.target[:12] if orphan.kind == "container" else orphan.target
        print(f"{orphan.kind:<10} {orphan.session_id:<36}  {orphan.why:<40} {target}")
    if args.yes:
        print(f"removed {len(orphans)} orphan(s)")
    else:
        print(f"{len(orphans)} orphan(s); run `sbx gc --yes` to remove them")
    return 0
