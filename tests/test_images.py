"""Kernel images: content-hashed tags, no needless rebuilds, a runnable sandbox image."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gateway.config import PACKAGE_DIR
from gateway.sandbox.images import ImageBuilder


def test_tag_changes_with_content_and_base_only(tmp_path, engine):
    image_dir = tmp_path / "demo"
    image_dir.mkdir()
    (image_dir / "Dockerfile").write_text("FROM scratch\n")
    builder = ImageBuilder(engine, tmp_path, base="debian:bookworm-slim")
    first = builder.tag_for("demo")
    assert first.startswith("sbx/demo:") and first == builder.tag_for("demo")
    (image_dir / "extra.txt").write_text("x")
    assert builder.tag_for("demo") != first
    (image_dir / "extra.txt").unlink()
    assert builder.tag_for("demo") == first
    other_base = ImageBuilder(engine, tmp_path, base="debian:trixie-slim")
    assert other_base.tag_for("demo") != first


@pytest.mark.docker
def test_unchanged_image_is_not_rebuilt(engine, tmp_path):
    lines: list[str] = []
    builder = ImageBuilder(engine, PACKAGE_DIR / "images", progress=lines.append)
    tag = builder.build("python")  # built by scripts/setup already
    lines.clear()
    assert builder.build("python") == tag
    assert lines == [f"python: up to date ({tag})"], "an unchanged image was rebuilt"
    assert next(row for row in builder.list() if row["name"] == "python")["built"]


@pytest.mark.docker
def test_python_image_runs_locked_down(engine):
    tag = ImageBuilder(engine, PACKAGE_DIR / "images").tag_for("python")
    out = engine.containers.run(
        tag,
        [
            "sh",
            "-c",
            "id -u && python -W error -c 'import ipykernel, numpy, pandas, "
            'matplotlib.pyplot; print("imports ok")\'',
        ],
        read_only=True,
        user="1000:1000",
        network_mode="none",
        tmpfs={"/tmp": ""},
        remove=True,
        stderr=True,
    ).decode()
    assert out.split() == ["1000", "imports", "ok"], out


def test_missing_image_directory_is_a_clear_error(engine, tmp_path):
    from gateway.sandbox.images import ImageBuildError

    with pytest.raises(ImageBuildError, match="Dockerfile is missing"):
        ImageBuilder(engine, tmp_path).tag_for("nope")


@pytest.mark.docker
@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--default-images", "bash, r"], ["bash", "r"]), (["--all"], None)],
    ids=["default-set", "all"],
)
def test_build_picks_the_default_set_or_all(args, expected):
    """Images build only when asked for: no names means the configured default set."""
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "images", "build", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    built = [line.split(":")[0] for line in out.splitlines() if re.match(r"\w+: sbx/", line)]
    assert built == (expected or ImageBuilder(None, PACKAGE_DIR / "images").names()), out
