"""`# sbx: pip install` in a template build: read strictly, fetched as wheels by the host."""

from __future__ import annotations

import io
import json
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.api.e2b.builds import dockerfile_of
from gateway.errors import BadRequest
from gateway.sandbox.dockerfiles import DockerfileRefused, resolve
from gateway.sandbox.templates import BuildFailed, BuildLimits, TemplateEngine, context_tar
from gateway.sandbox.wheels import (
    PipRefused,
    PipStep,
    Target,
    WheelLimits,
    Wheels,
    install_lines,
    parse_pip,
)

TARGET = Target("3.11", "cp311", "x86_64", "2.36")


def _resolve(text: str) -> str:
    return resolve(text, {"sbx/python": "img"}.get, ["sbx/python"])[0]


def test_requirements_are_read_and_normalised():
    step = parse_pip("six attrs>=23  requests[socks]>=2.31,<3")
    assert step == PipStep(("six", "attrs>=23", "requests[socks]<3,>=2.31"))
    assert step.line == "# sbx: pip install six attrs>=23 requests[socks]<3,>=2.31"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ("", "at least one package"),
        ("--user six", "the workspace, which each session mounts"),
        ("--index-url=http://10.0.0.1/simple six", "option '--index-url"),
        ("-i http://10.0.0.1/simple six", "option '-i'"),
        ("--extra-index-url x six", "option"),
        ("-r requirements.txt", "option"),
        ("file:///etc/passwd", "no URL, path"),
        ("git+https://example.invalid/x.git", "no URL, path"),
        ("six@https://example.invalid/six.whl", "no URL, path"),
        ("/tmp/evil.whl", "no URL, path"),
        ("../evil", "no URL, path"),
        (".", "no URL, path"),
        ("six;python_version>'3'", "no URL, path"),
        ("six && curl", "no URL, path"),
        ("x" * 300, "no URL, path"),
        (" ".join(["six"] * 40), "at most 32"),
    ],
)
def test_anything_but_a_plain_requirement_is_refused(args, says):
    with pytest.raises(PipRefused) as found:
        parse_pip(args)
    assert says in found.value.message and len(found.value.message) < 400
    assert isinstance(found.value, BadRequest)


def test_the_dockerfile_directive_is_kept_normalised_and_a_bad_one_names_its_line():
    text = _resolve("FROM sbx/python\n# a comment\n# sbx: pip install six  attrs>=23\n")
    assert text == "FROM img\n# sbx: pip install six attrs>=23\n"
    with pytest.raises(DockerfileRefused, match=r"line 2: .*option '--index-url"):
        _resolve("FROM sbx/python\n# sbx: pip install --index-url=http://x/ six\n")
    with pytest.raises(DockerfileRefused, match=r"line 2: .*at least one"):
        _resolve("FROM sbx/python\n# sbx: pip install\n")


def test_e2b_pip_install_becomes_the_directive_and_other_runs_stay_runs():
    steps = [
        {"type": "USER", "args": ["root"]},
        {"type": "RUN", "args": ["pip install six attrs", "root"]},
        {"type": "RUN", "args": ["echo pip install six"]},
    ]
    text, _ = dockerfile_of({"steps": steps})
    lines = text.splitlines()
    assert "# sbx: pip install six attrs" in lines
    assert lines[-1] == f"RUN {json.dumps(['/bin/sh', '-c', 'echo pip install six'])}"
    with pytest.raises(BadRequest, match="option '--index-url"):
        dockerfile_of({"steps": [{"type": "RUN", "args": ["pip install --index-url=x six"]}]})
    with pytest.raises(BadRequest, match="no URL, path"):
        dockerfile_of({"steps": [{"type": "RUN", "args": ["pip install ."]}]})


def test_the_install_lines_quote_every_spec_and_drop_the_wheels():
    copy, run = install_lines(PipStep(("attrs>=23",)), 0)
    assert copy == 'COPY [".sbx-wheels/0/", "/tmp/.sbx-wheels-0/"]'
    argv = json.loads(run[len("RUN ") :])
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[2] == (
        "pip install --no-index --find-links /tmp/.sbx-wheels-0 -- 'attrs>=23'; "
        "s=$?; rm -rf /tmp/.sbx-wheels-0 2>/dev/null; exit $s"
    )


def test_pip_download_is_binary_only_for_the_images_python():
    args = TARGET.pip_args()
    assert args[:4] == ["--python-version", "3.11", "--implementation", "cp"]
    assert "manylinux_2_36_x86_64" in args and "manylinux_2_17_x86_64" in args
    assert "manylinux_2_37_x86_64" not in args and "cp311" in args


class FakeWheels(Wheels):
    """The download boundary: writes a wheel per spec, or refuses."""

    def __init__(self, refuse: str | None = None) -> None:
        super().__init__()
        self.refuse = refuse
        self.asked: list[tuple[PipStep, Target]] = []

    def fetch(self, step: PipStep, target: Target, dest: Path, *bounds) -> list[Path]:
        self.asked.append((step, target))
        if self.refuse:
            raise PipRefused(self.refuse)
        for spec in step.specs:
            (dest / f"{spec}-1.0-py3-none-any.whl").write_bytes(b"wheel")
        return sorted(dest.glob("*.whl"))


def _engine(wheels: Wheels, image: list[str] | None = None, said: list[bytes] | None = None):
    """An engine whose client knows one kernel image (its id ``image[0]``), probed as ``said``."""
    image, said = image or ["sha256:k"], said or []
    client = SimpleNamespace(
        api=None,
        images=SimpleNamespace(get=lambda ref: SimpleNamespace(id=image[0])),
        containers=SimpleNamespace(run=lambda *a, **kw: said.pop(0)),
    )
    engine = TemplateEngine(client, BuildLimits(), wheels=wheels)
    if not said:
        engine.targets[image[0]] = TARGET
    return engine


def test_each_directive_becomes_a_copy_and_an_offline_install_of_its_fetched_wheels(tmp_path):
    fake, logged = FakeWheels(), []
    engine = _engine(fake)
    text, wheels = engine._pip_steps(
        "FROM img\n# sbx: pip install six\nRUN true\n# sbx: pip install attrs\n",
        "kernel",
        tmp_path,
        logged.append,
        time.monotonic() + 60,
    )
    lines = text.splitlines()
    assert lines[0] == "FROM img" and lines[3] == "RUN true"
    assert lines[1].startswith("COPY") and "--no-index" in lines[2] and "attrs" in lines[5]
    assert sorted(wheels) == [".sbx-wheels/0/six-1.0-py3-none-any.whl",
                              ".sbx-wheels/1/attrs-1.0-py3-none-any.whl"]  # fmt: skip
    assert [t for _, t in fake.asked] == [TARGET, TARGET]
    assert any("six-1.0-py3-none-any.whl (5 bytes)" in line for line in logged)
    tar = tarfile.open(fileobj=io.BytesIO(context_tar(None, text, BuildLimits(), wheels)))
    assert ".sbx-wheels/0/six-1.0-py3-none-any.whl" in tar.getnames()


def test_a_package_with_no_wheel_fails_the_build_at_its_step(tmp_path):
    engine = _engine(FakeWheels(refuse="six has no wheel for Python 3.11"))
    with pytest.raises(BuildFailed) as failed:
        text = "FROM img\n# sbx: pip install six\n"
        engine._pip_steps(text, "kernel", tmp_path, print, time.monotonic() + 60)
    assert failed.value.step == "pip install six" and "no wheel" in failed.value.reason


def test_the_tenants_own_files_under_the_wheels_directory_are_dropped():
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(".sbx-wheels/0/six-9-py3-none-any.whl")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    out = tarfile.open(fileobj=io.BytesIO(context_tar(raw.getvalue(), "FROM x\n", BuildLimits())))
    assert not [n for n in out.getnames() if n.startswith(".sbx-wheels")]


def test_a_download_past_its_byte_or_time_bound_is_stopped(tmp_path, monkeypatch):
    """The boundary itself: pip replaced by a program that writes without end."""
    fill = (
        "import sys, time, pathlib\n"
        "d = pathlib.Path(sys.argv[sys.argv.index('--dest') + 1])\n"
        "f = open(d / 'huge-1-py3-none-any.whl', 'wb')\n"
        "while True:\n    f.write(b'x' * (1 << 20)); f.flush(); time.sleep(0.01)\n"
    )
    fake_pip = tmp_path / "fakepip.py"
    fake_pip.write_text(fill)
    wheels = Wheels(WheelLimits(bytes=4 << 20, timeout=20))
    real_popen = __import__("subprocess").Popen

    def popen(argv, **kw):  # run the filler with pip's arguments
        return real_popen([sys.executable, str(fake_pip), *argv[3:]], **kw)

    monkeypatch.setattr("gateway.sandbox.wheels.subprocess.Popen", popen)
    (tmp_path / "dest").mkdir()
    with pytest.raises(PipRefused, match="larger than the 4 MiB"):
        wheels.fetch(PipStep(("huge",)), TARGET, tmp_path / "dest")
    slow = Wheels(WheelLimits(bytes=1 << 40, timeout=0.5))
    fill_slow = fill.replace("1 << 20", "1")
    fake_pip.write_text(fill_slow)
    with pytest.raises(PipRefused, match=r"longer than the 0\.5 s"):
        slow.fetch(PipStep(("huge",)), TARGET, tmp_path / "dest")


class BoundWheels(FakeWheels):
    """Records the bounds each fetch is given."""

    def __init__(self) -> None:
        super().__init__()
        self.bounds: list[tuple[int, float]] = []

    def fetch(self, step, target, dest, most_bytes=None, seconds=None):
        self.bounds.append((most_bytes, seconds))
        return super().fetch(step, target, dest)


def test_every_step_of_a_build_shares_one_byte_bound_and_the_builds_time(tmp_path):
    """Thirty-two steps would each have had the whole bound (and its own time) before."""
    fake = BoundWheels()
    engine = _engine(fake)
    text = "FROM img\n# sbx: pip install six\n# sbx: pip install attrs\n"
    engine._pip_steps(text, "kernel", tmp_path, print, deadline=time.monotonic() + 10)
    (first, t1), (second, t2) = fake.bounds
    assert first == fake.limits.bytes and second == first - len(b"wheel")
    assert t1 <= 10 and t2 <= 10


def test_a_run_pip_install_that_fails_points_to_the_supported_form():
    engine = _engine(FakeWheels())
    chunks = [
        {"stream": 'Step 2/2 : RUN ["/bin/sh", "-c", "pip install six"]\n'},
        {"stream": "ERROR: Network is unreachable\n"},
        {"error": "The command returned a non-zero code: 1"},
    ]
    engine.api = SimpleNamespace(build=lambda **kw: iter(chunks))
    watch = SimpleNamespace(verdict=None, container=None, awaiting=False, layers=[])
    with pytest.raises(BuildFailed) as failed:
        engine._stream("t", b"", print, "", [""], watch)
    assert "Network is unreachable" in failed.value.reason
    assert "'# sbx: pip install NAME...'" in failed.value.reason
    assert "pip_install" in failed.value.reason


def test_a_wheel_the_tenants_package_policy_refuses_fails_the_build(tmp_path):
    """The deny list that holds for a session's pip holds for its template's (a dependency too)."""
    engine = _engine(FakeWheels())
    refusal = {"attrs": "attrs is on the deny list"}.get
    text = "FROM img\n# sbx: pip install six attrs\n"
    with pytest.raises(BuildFailed) as failed:
        engine._pip_steps(text, "kernel", tmp_path, print, time.monotonic() + 60, refusal)
    assert failed.value.step == "pip install six attrs"
    assert "attrs is on the deny list" in failed.value.reason


def test_a_directive_before_from_is_named_as_written():
    with pytest.raises(DockerfileRefused) as refused:
        _resolve("# sbx: pip install six\nFROM sbx/python\n")
    assert refused.value.message == "line 1: # sbx: pip install before the first FROM"


def test_a_gateway_that_stops_stops_the_download_under_way(tmp_path, monkeypatch):
    """Else pip would run on past the gateway's exit, up to the wheels' time bound."""
    import subprocess
    import threading

    slow = tmp_path / "slowpip.py"
    slow.write_text("import time\ntime.sleep(60)\n")
    real_popen = subprocess.Popen
    monkeypatch.setattr(
        "gateway.sandbox.wheels.subprocess.Popen",
        lambda argv, **kw: real_popen([sys.executable, str(slow)], **kw),
    )
    engine = _engine(Wheels(WheelLimits(timeout=60)))
    failed: list[BuildFailed] = []

    def build() -> None:
        try:
            text = "FROM img\n# sbx: pip install six\n"
            engine._pip_steps(text, "kernel", tmp_path, print, time.monotonic() + 60)
        except BuildFailed as e:
            failed.append(e)

    thread = threading.Thread(target=build)
    thread.start()
    time.sleep(0.5)
    began = time.monotonic()
    engine.cancel()
    thread.join(10)
    assert time.monotonic() - began < 3 and failed, failed
    assert "the gateway stopped" in failed[0].reason


def test_the_probe_names_the_images_abi_as_pip_spells_it():
    """Run here (the same code runs in the kernel image): cp311, not the cache tag."""
    import subprocess

    from gateway.sandbox.wheels import PROBE

    said = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    target = Target.parse(said.stdout)
    v = sys.version_info
    assert (target.python, target.abi) == (f"{v[0]}.{v[1]}", f"cp{v[0]}{v[1]}")


def test_a_download_that_ends_past_its_byte_bound_between_looks_is_refused(tmp_path, monkeypatch):
    """A local index copies a big wheel faster than the watch looks: the end is checked too."""
    import subprocess

    quick = tmp_path / "quickpip.py"
    quick.write_text(
        "import sys, pathlib\n"
        "d = pathlib.Path(sys.argv[sys.argv.index('--dest') + 1])\n"
        "(d / 'huge-1-py3-none-any.whl').write_bytes(b'x' * (8 << 20))\n"
    )
    real_popen = subprocess.Popen
    monkeypatch.setattr(
        "gateway.sandbox.wheels.subprocess.Popen",
        lambda argv, **kw: real_popen([sys.executable, str(quick), *argv[3:]], **kw),
    )
    (tmp_path / "dest").mkdir()
    with pytest.raises(PipRefused, match="larger than the 4 MiB"):
        Wheels(WheelLimits(bytes=4 << 20)).fetch(PipStep(("huge",)), TARGET, tmp_path / "dest")


def test_the_images_python_is_asked_again_once_the_kernel_image_is_rebuilt():
    image = ["sha256:a"]
    engine = _engine(
        FakeWheels(), image, [b"3.11 cp311 x86_64 2.36\n", b"3.12 cp312 x86_64 2.36\n"]
    )
    assert engine._target("kernel").python == "3.11"
    assert engine._target("kernel").python == "3.11"  # asked once
    image[0] = "sha256:b"  # the kernel image built again, with another Python
    assert engine._target("kernel").python == "3.12"
