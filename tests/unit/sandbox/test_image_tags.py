"""An image's tag is the hash of its definition, and only of that."""

from __future__ import annotations

from gateway.sandbox.images import ImageBuilder


def test_bytecode_an_installer_writes_beside_an_images_files_leaves_its_tag(tmp_path):
    """pip compiles the image directory's .py files when it installs the wheel: the
    installed gateway then named an image the checkout never built ("not built")."""
    image = tmp_path / "images" / "python"
    image.mkdir(parents=True)
    (image / "Dockerfile").write_text("FROM scratch\nCOPY helper.py /\n")
    (image / "helper.py").write_text("print('hi')\n")
    images = ImageBuilder(None, tmp_path / "images")  # type: ignore[arg-type]
    before = images.tag_for("python")
    (image / "__pycache__").mkdir()
    (image / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"\x00bytecode")
    assert images.tag_for("python") == before
    (image / "helper.py").write_text("print('changed')\n")
    assert images.tag_for("python") != before, "a change to the definition keeps its tag"
