"""Comparing a replayed notebook's outputs with the recorded ones."""

from __future__ import annotations

import pytest

from gateway.notebooks.compare import diff_outputs, float_tolerance


def png(color: tuple[int, int, int], size=(20, 10)) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_compare_normalises_volatile_text():
    from gateway.notebooks.compare import diff_outputs, normalize_text

    assert normalize_text("<object at 0x7f3a1b2c3d4e>") == "<object at 0x…>"
    assert normalize_text("Cell In[12], line 1") == "Cell In[N], line 1"
    assert normalize_text("\x1b[31mError\x1b[0m") == "Error"
    a = [{"output_type": "stream", "name": "stdout", "text": "at 0x7fffaaaa1111\n"}]
    b = [{"output_type": "stream", "name": "stdout", "text": "at 0x7fffbbbb2222\n"}]
    assert diff_outputs(a, b) == ""
    c = [{"output_type": "stream", "name": "stderr", "text": "at 0x7fffbbbb2222\n"}]
    assert "[stderr]" in diff_outputs(a, c)


def test_compare_images_exactly_or_within_tolerance():
    from gateway.notebooks.compare import diff_outputs

    out = lambda data: [{"output_type": "display_data", "data": {"image/png": data}}]  # noqa: E731
    grey, near, far = png((100, 100, 100)), png((102, 100, 100)), png((250, 0, 0))
    assert diff_outputs(out(grey), out(grey)) == ""
    assert "sha256" in diff_outputs(out(grey), out(near)), "exact mode must see any change"
    assert diff_outputs(out(grey), out(near), image_tolerance=0.01) == ""
    assert diff_outputs(out(grey), out(far), image_tolerance=0.01) != ""
    assert diff_outputs(out(grey), out(png((100, 100, 100), (21, 10))), image_tolerance=1) != ""


def stdout(text: str) -> list[dict]:
    return [{"output_type": "stream", "name": "stdout", "text": text}]


def test_floats_compare_within_the_tolerance_and_nothing_else_does():
    assert diff_outputs(stdout("x = 0.3\n"), stdout("x = 0.30000000000000004\n"), None)
    assert not diff_outputs(
        stdout("x = 0.3, n=2\n"), stdout("x = 0.30000000000000004, n=2\n"), None, 1e-9
    )
    assert diff_outputs(stdout("x = 0.3\n"), stdout("x = 0.31\n"), None, 1e-9)
    assert diff_outputs(stdout("x = 0.3 a\n"), stdout("x = 0.3 b\n"), None, 0.5), "text matters"
    result = {"output_type": "execute_result", "data": {"text/plain": "array([1.0000001, 2.])"},
              "metadata": {}, "execution_count": 1}  # fmt: skip
    close = {**result, "data": {"text/plain": "array([1.0000002, 2.])"}}
    assert not diff_outputs([result], [close], None, 1e-6)


def test_the_tolerance_is_read_from_a_cell_tag():
    assert float_tolerance(["sbx-float-tolerance=1e-6"]) == 1e-6
    assert float_tolerance(["nbval-ignore-output"]) is None
    with pytest.raises(ValueError, match="sbx-float-tolerance"):
        float_tolerance(["sbx-float-tolerance=lots"])
