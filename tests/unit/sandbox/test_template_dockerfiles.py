"""A tenant's Dockerfile is read strictly: bases only from this host, nothing the daemon fetches."""

from __future__ import annotations

import io
import tarfile
from types import SimpleNamespace

import pytest

from gateway.sandbox.dockerfiles import DockerfileRefused, instructions, resolve
from gateway.sandbox.templates import (
    DOCKERFILE,
    BuildLimits,
    TemplateContextRefused,
    _gateway_layer,
    context_tar,
)
from gateway.sandbox.wheels import DIR

BASES = {"sbx/python": "sbx/python:abc", "geo": "sbxt/t-geo:2"}


def _resolve(text: str) -> tuple[str, str]:
    return resolve(text, BASES.get, sorted(BASES))


def test_from_is_pinned_to_the_local_image_and_the_root_base_is_followed_through_stages():
    text, root = _resolve(
        "# a comment\nFROM sbx/python AS build\nRUN echo a \\\n  && echo b\n"
        "FROM build\nCOPY --from=build /x /y\n"
    )
    assert text.splitlines() == [
        "FROM sbx/python:abc AS build",
        "RUN echo a && echo b",
        "FROM build",
        "COPY --from=build /x /y",
    ]
    assert root == "sbx/python"


@pytest.mark.parametrize(
    ("dockerfile", "says"),
    [
        ("FROM python:3.11\n", "no base 'python:3.11' on this host"),
        ("FROM ubuntu\nRUN true\n", "build from one of: geo, sbx/python"),
        ("ARG B=sbx/python\nFROM ${B}\n", "ARG before FROM"),
        ("FROM $X\n", "FROM takes no variables"),
        ("RUN true\n", "before the first FROM"),
        ("# nothing\n", "has no FROM"),
        ("FROM sbx/python\nCOPY --from=sbxt/other-secret:1 /etc/shadow /x\n", "earlier stage"),
        ("FROM sbx/python\nADD https://169.254.169.254/latest /x\n", "ADD of a URL"),
        ("FROM sbx/python\nADD [\"http://127.0.0.1:8765/v1\", \"/x\"]\n", "ADD of a URL"),
        ("FROM sbx/python\nONBUILD RUN id\n", "ONBUILD"),
        ("FROM sbx/python\nRUN --network=host curl x\n", "RUN takes no flags"),
        ("FROM --platform=linux/arm64 sbx/python\n", "FROM takes no flags"),
        ("FROM sbx/python\x00\n", "NUL"),
        ("FROM sbx/python\n" + "#" * 300_000, "larger than"),
    ],
)  # fmt: skip
def test_what_the_daemon_would_fetch_or_read_for_the_tenant_is_refused_with_a_reason(
    dockerfile, says
):
    with pytest.raises(DockerfileRefused) as refused:
        _resolve(dockerfile)
    assert says in refused.value.message
    assert refused.value.status == 400


def test_instructions_keep_the_line_they_start_on():
    found = instructions("\n# c\nFROM a\n\nRUN x \\\n# inside\n y\nUSER root\n")
    assert [(i.line, i.keyword, i.text) for i in found] == [
        (3, "FROM", "a"),
        (5, "RUN", "x y"),
        (8, "USER", "root"),
    ]


def _tar(members: dict[str, bytes], mode: str = "w") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_the_context_gets_the_resolved_dockerfile_and_keeps_the_tenants_files():
    built = context_tar(
        _tar({"req.txt": b"x", DOCKERFILE: b"FROM evil"}, "w:gz"), "FROM a\n", BuildLimits()
    )
    with tarfile.open(fileobj=io.BytesIO(built)) as tar:
        names = tar.getnames()
        assert sorted(names) == sorted(["req.txt", DOCKERFILE])
        assert tar.extractfile(DOCKERFILE).read() == b"FROM a\n"


@pytest.mark.parametrize(
    ("members", "says"),
    [
        ({"../etc/passwd": b"x"}, "outside it"),
        ({"/abs": b"x"}, "outside it"),
        ({"big": b"x" * 2048}, "larger than"),
    ],
)
def test_a_context_with_paths_outside_it_or_past_its_bound_is_refused(members, says):
    with pytest.raises(TemplateContextRefused) as refused:
        context_tar(_tar(members), "FROM a\n", BuildLimits(context=1024))
    assert says in refused.value.message


def test_a_context_that_is_no_tar_is_refused():
    with pytest.raises(TemplateContextRefused, match="not a tar"):
        context_tar(b"not a tar at all" * 100, "FROM a\n", BuildLimits())


def test_the_gateway_layer_undoes_user_root_setuid_and_puts_the_kernels_entrypoint_back():
    layer = _gateway_layer(
        "sbxt/t-x:1-user", {"Entrypoint": ["/usr/local/bin/sbx-entrypoint"], "Cmd": ["python"]},
        "1000:1000",
    )  # fmt: skip
    lines = layer.splitlines()
    assert lines[0] == "FROM sbxt/t-x:1-user"
    assert "chmod ug-s" in layer and "security.capability" in layer
    assert lines[-4:] == [
        "USER 1000:1000",
        "WORKDIR /workspace",
        'ENTRYPOINT ["/usr/local/bin/sbx-entrypoint"]',
        'CMD ["python"]',
    ]


def test_a_build_step_printing_one_endless_line_is_kept_cut():
    from gateway.sandbox.templates import TemplateEngine

    class Watch:
        container = None
        awaiting = False
        layers: list[str] = []

    kept: list[str] = []
    TemplateEngine._note("x" * 1_000_000, [""], Watch(), "", kept.append)
    assert len(kept[0]) <= 4200 and kept[0].endswith("[cut]")


def test_the_gateway_layer_runs_in_exec_form_so_a_shell_the_dockerfile_set_cannot_skip_it():
    layer = _gateway_layer("s", {}, "1000:1000")
    run = next(line for line in layer.splitlines() if line.startswith("RUN "))
    assert run.startswith('RUN ["/bin/sh", "-c", "find / -xdev')


def test_builds_run_under_a_pids_bound_or_not_at_all(tmp_path):
    from gateway.sandbox.templates import CGROUP, BuildFailed, TemplateEngine

    (tmp_path / "pids").mkdir()
    engine = TemplateEngine(SimpleNamespace(api=None), BuildLimits(pids=64), tmp_path)
    engine._bound_pids()
    assert (tmp_path / "pids" / CGROUP / "pids.max").read_text() == "64\n"
    missing = TemplateEngine(SimpleNamespace(api=None), BuildLimits(), tmp_path / "none")
    with pytest.raises(BuildFailed, match="pids-limited cgroup"):
        missing._bound_pids()


def test_a_step_printing_running_in_another_container_does_not_point_the_watchdog_at_it():
    """The watchdog kills the step it watches: a RUN's output must not choose another one."""
    from gateway.sandbox.templates import TemplateEngine

    class Watch:
        container = None

    watch, step = Watch(), [""]
    for line in [
        "Step 2/3 : RUN sleep 1000",
        " ---> Running in aaaaaaaaaaaa",
        " ---> Running in bbbbbbbbbbbb",  # printed by the step itself
        "Step 3/3 : ENV A=1",
        " ---> Running in cccccccccccc",
    ]:
        TemplateEngine._note(line, step, watch, "", lambda line: None)
        if "bbbb" in line:
            assert watch.container == "aaaaaaaaaaaa"
    assert watch.container == "cccccccccccc"


def test_the_watchdog_kills_only_a_container_of_the_builds_cgroup():
    from gateway.sandbox.templates import CGROUP, BuildLimits, _Watchdog

    killed = []

    class Api:
        def inspect_container(self, cid):
            parent = f"/{CGROUP}" if cid == "build" else ""
            return {"HostConfig": {"CgroupParent": parent}}

        def kill(self, cid):
            killed.append(cid)

    class Client:
        api = Api()

    watch = _Watchdog(Client(), BuildLimits(), 0.0)
    watch.container = "session-of-another-tenant"
    watch._kill("time")
    watch.container = "build"
    watch._kill("time")
    assert killed == ["build"]


def test_a_stopping_gateway_stops_the_builds_under_way_at_their_step():
    """Else the process waits for a build thread at its exit, up to the build's time bound."""
    from gateway.sandbox.templates import TemplateEngine, _Watchdog

    engine = TemplateEngine(SimpleNamespace(api=None), BuildLimits())
    watch = _Watchdog(None, BuildLimits(), deadline=10**9)
    engine.watching.add(watch)
    engine.cancel()
    assert watch.deadline == 0.0 and watch.verdict == "the gateway stopped during the build"


def test_a_failed_build_removes_the_images_its_steps_committed_and_no_tagged_one():
    from gateway.sandbox.templates import TemplateEngine

    removed = []

    class Api:
        def inspect_image(self, ref):
            return {"RepoTags": ["sbx/python:abc"] if ref == "base00000000" else []}

        def remove_image(self, ref):
            removed.append(ref)

    class Watch:
        container = None
        awaiting = False
        layers: list[str] = []

    watch = Watch()
    lines = ["Step 1/3 : FROM x", " ---> base00000000", "Step 2/3 : RUN a"]
    lines += [" ---> Running in c0c0c0c0c0c0", " ---> 111111111111", "Step 3/3 : RUN b"]
    for line in lines:
        TemplateEngine._note(line, [""], watch, "", lambda line: None)
    engine = TemplateEngine(SimpleNamespace(api=Api()), BuildLimits())
    engine._drop_untagged(watch.layers)
    assert removed == ["111111111111"]


@pytest.mark.parametrize(
    "line",
    [
        "ADD\tx http://169.254.169.254/latest/ /d/",  # the daemon splits words on tabs too
        "ONBUILD\tRUN echo in the gateway's layer",
        "COPY\t--from=sbxt/other /x /y",
    ],
)
def test_a_tab_after_the_keyword_does_not_hide_the_instruction(line):
    with pytest.raises(DockerfileRefused):
        _resolve(f"FROM sbx/python\n{line}\n")


@pytest.mark.parametrize(
    "line",
    [
        "VOLUME /data",  # writable past the read-only root and /tmp's bound, kept after removal
        'volume ["/data"]',
        "HEALTHCHECK --interval=1ms CMD true",  # the daemon would exec it a thousand times a second
        "STOPSIGNAL SIGWINCH",  # a sandbox ignoring its stop until the engine's timeout
        'LABEL sbx.tool-server="x"',  # the gateway finds its own containers by these labels
        "LABEL a=1 SBX.GATEWAY=other",
    ],
)
def test_what_a_session_started_from_the_image_would_get_from_the_daemon_is_refused(line):
    with pytest.raises(DockerfileRefused, match="not supported in templates"):
        _resolve(f"FROM sbx/python\n{line}\n")


@pytest.mark.parametrize(
    "planted", [f"./{DOCKERFILE}", f"./{DIR}/0/six-9.0-py3-none-any.whl", f".//{DIR}/0/x.whl"]
)
def test_the_tenants_files_named_as_the_gateways_through_dot_paths_are_dropped(planted):
    built = context_tar(_tar({planted: b"FROM evil", "keep": b"x"}), "FROM a\n", BuildLimits())
    with tarfile.open(fileobj=io.BytesIO(built)) as tar:
        assert tar.getnames() == ["keep", DOCKERFILE]


@pytest.mark.parametrize(
    "line",
    [
        # NaN is JSON to Python, not to the engine: it reads the words split on blanks
        'ADD [NaN, "a http://169.254.169.254/", "/d/"]',
        'ADD ["a http://169.254.169.254/", "/d/"]',
    ],
)
def test_add_names_no_url_in_any_reading_of_its_words(line):
    with pytest.raises(DockerfileRefused, match="URL"):
        _resolve(f"FROM sbx/python\n{line}\n")


def test_add_of_a_url_spelled_with_json_escapes_is_refused():
    with pytest.raises(DockerfileRefused, match="URL"):
        _resolve('FROM sbx/python\nADD ["\\u0068ttp://169.254.169.254/", "/d/"]\n')


@pytest.mark.parametrize(
    "lines",
    [
        # The engine substitutes variables in ADD's sources, and joins quoted pieces and
        # drops escapes in its words: the URL it fetches (on the host's network) is whole.
        ["ARG U=http://169.254.169.254/latest/", "ADD $U /d/"],
        ["ARG U=http://127.0.0.1:8888/v1/sessions", 'ADD ["${U}", "/d/"]'],
        ["ENV H=169.254.169.254", "ADD http://${H}/latest/ /d/"],
        ['ADD "http:"//169.254.169.254/latest/ /d/'],
        ["ADD http:\\/\\/169.254.169.254/latest/ /d/"],
        ["ADD h'ttp://'169.254.169.254/ /d/"],
    ],
    ids=["arg", "arg-json", "env-host", "split-quote", "escapes", "single-quote"],
)
def test_add_of_a_url_put_together_by_the_engine_is_refused(lines):
    with pytest.raises(DockerfileRefused, match="ADD"):
        _resolve("FROM sbx/python\n" + "\n".join(lines) + "\n")


@pytest.mark.parametrize("line", ["ADD data.tar.gz /opt/", 'ADD ["a b.txt", "/opt/"]'])
def test_add_of_plain_paths_still_builds(line):
    _resolve(f"FROM sbx/python\n{line}\n")


def test_an_image_whose_labels_are_named_as_the_gateways_is_found_out_whatever_made_them():
    """Checked on the built image after the line check (a Dockerfile of the parser before
    9dd5cd5, ``ARG K=sbx.tool-server`` + ``LABEL ${K}=x``, came out ready with them)."""
    from gateway.sandbox.templates import LABEL, gateways_labels

    labels = {LABEL: "sbxt/t-geo:2", "SBX.Gateway": "g", "sbx.run-dir": "/", "team": "geo"}
    assert gateways_labels(labels) == ["SBX.Gateway", "sbx.run-dir"]
    assert gateways_labels({LABEL: "sbxt/t-geo:2", "maintainer": "sbx.dev"}) == []
    assert gateways_labels(None) == []
