"""``sbx gc`` finds a stdio tool server's container left behind with its session's other
leftovers (the engine is faked: tests/faults/test_gc.py runs the real one)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.cli.gc import find_orphans
from gateway.sandbox.docker.provisioner import CONTAINER_RUN_DIR


class Engine:
    """``docker.APIClient.containers`` as gc asks it: every container with a label."""

    def __init__(self, containers: list[dict], images: dict[str, dict] | None = None) -> None:
        self.api = self
        self.listed = containers
        self.images = images or {}  # image id -> its labels

    def inspect_image(self, image: str) -> dict:
        return {"Config": {"Labels": self.images.get(image)}}

    def containers(self, all: bool, filters: dict) -> list[dict]:
        assert all and filters == {"label": "sbx.gateway"}
        return [c for c in self.listed if "sbx.gateway" in c["Labels"]]


def kernel(data: Path, gateway: str, session: str) -> dict:
    run = {"Destination": CONTAINER_RUN_DIR, "Type": "bind",
           "Source": str(data / "sessions" / session / "run")}  # fmt: skip
    labels = {"sbx.gateway": gateway, "sbx.session": session}
    return {"Id": f"k-{session}", "Names": [f"/sbx-{session}"], "Labels": labels, "Mounts": [run]}


def tool_server(data: Path | None, gateway: str, session: str) -> dict:
    labels = {"sbx.gateway": gateway, "sbx.tool-server": session}
    if data is not None:
        labels["sbx.run-dir"] = str(data / "sessions" / session / "run")
    return {"Id": f"t-{session}", "Names": [f"/sbxtool-{session}-notes-0a1b2c3d"],
            "Labels": labels, "Mounts": []}  # fmt: skip


def stopped_gateway(data: Path, gateway: str, open_sessions: list[str]) -> None:
    """The two things gc reads of a stopped gateway's store."""
    data.mkdir(parents=True)
    with sqlite3.connect(data / "gateway.sqlite3") as db:
        db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        db.execute("CREATE TABLE sessions (id TEXT, ended_at REAL)")
        db.execute("INSERT INTO meta VALUES ('gateway_id', ?)", (gateway,))
        db.executemany("INSERT INTO sessions VALUES (?, NULL)", [(s,) for s in open_sessions])
    db.close()


def test_stdio_server_containers_are_found_with_their_sessions_leftovers(tmp_path):
    gone, kept = tmp_path / "gone", tmp_path / "kept"  # a deleted data dir; a stopped gateway's
    stopped_gateway(kept, "g-kept", ["s-open"])
    engine = Engine([
        kernel(gone, "g-gone", "s1"),
        tool_server(gone, "g-gone", "s1"),  # beside its session's kernel container
        tool_server(gone, "g-gone", "s2"),  # its session's kernel container went already
        tool_server(None, "g-gone", "s3"),  # labelled before the run dir was: by its gateway
        tool_server(kept, "g-kept", "s-open"),  # a kept session's: it stays
        tool_server(kept, "g-kept", "s-ended"),
        tool_server(None, "g-elsewhere", "s4"),  # a gateway nothing here names: left alone
    ])  # fmt: skip
    orphans = find_orphans(engine, [], under=tmp_path)  # type: ignore[arg-type]
    servers = {o.target: (o.session_id, o.why) for o in orphans if o.target.startswith("t-")}
    assert servers == {
        "t-s1": ("s1", f"its data directory {gone} is gone"),
        "t-s2": ("s2", f"its data directory {gone} is gone"),
        "t-s3": ("s3", f"its data directory {gone} is gone"),
        "t-s-ended": ("s-ended", "its session is not open"),
    }


def test_a_run_dir_label_on_a_container_not_named_as_a_stdio_server_is_not_believed(tmp_path):
    """An image's labels reach its containers (a template's, built before its labels were
    checked): such a label on a kernel container pointed gc, as root, at any directory
    holding ``sessions/``. Only the gateway names a container, and a server's name and
    run directory both name its session."""
    target, data = tmp_path / "elsewhere", tmp_path / "data"
    (target / "sessions" / "precious").mkdir(parents=True)
    forged = kernel(data, "g1", "s1")
    forged["Labels"].update({"sbx.tool-server": "s1",
                             "sbx.run-dir": str(target / "sessions" / "x" / "run")})  # fmt: skip
    other_session = tool_server(target, "g1", "s9")
    other_session["Names"] = ["/sbxtool-s1-notes-0a1b2c3d"]  # named for s1, labelled for s9
    orphans = find_orphans(Engine([forged, other_session]), [], under=tmp_path)  # type: ignore[arg-type]
    assert not [o for o in orphans if str(target) in o.target or str(target) in o.why]
    assert [o.target for o in orphans if o.kind == "container"] == ["k-s1"]  # by its mount


def test_a_run_dir_label_an_old_servers_image_gave_it_is_not_believed(tmp_path):
    """A gateway before the run-dir label set none on its stdio servers: an image's label
    of that name showed through, and pointed gc, as root, at any directory holding
    ``sessions/``. Such a server is judged as one labelled before: by its gateway's
    kernels' data directory."""
    target, data = tmp_path / "elsewhere", tmp_path / "data"
    (target / "sessions" / "precious").mkdir(parents=True)
    old = tool_server(target, "g1", "s1")
    old["ImageID"] = "sha256:tenant"
    image = {"sha256:tenant": {"sbx.run-dir": old["Labels"]["sbx.run-dir"]}}
    alone = find_orphans(Engine([old], image), [], under=tmp_path)  # type: ignore[arg-type]
    assert alone == []  # nothing on this host says whose it is: left alone
    beside = find_orphans(Engine([kernel(data, "g1", "s2"), old], image), [], under=tmp_path)  # type: ignore[arg-type]
    assert not [o for o in beside if str(target) in o.target or str(target) in o.why]
    assert sorted(o.target for o in beside if o.kind == "container") == ["k-s2", "t-s1"]
