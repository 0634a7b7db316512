"""Templates built from a Dockerfile on a real engine, and sessions started from them.

One gateway for the module, with small build bounds so the hostile builds end
in seconds; the images are tiny layers over the local sbx/python.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from uuid import UUID

import httpx
import pytest
from helpers import Canary, GatewayProcess, e2b_env, run, short_tmpdir, wait_for

pytestmark = pytest.mark.docker

HARDENED = (
    "FROM sbx/python\n"
    "USER root\n"
    "RUN cp /bin/bash /usr/local/bin/rootsh && chmod u+s /usr/local/bin/rootsh "
    "&& echo baked > /opt/baked.txt\n"
    "ENV BAKED=yes\n"
)


BETA = "beta-pool-token-0123456789"  # a second tenant's, beside the admin's (tenant "default")


@pytest.fixture(scope="module")
def gw(start_gateway) -> GatewayProcess:
    data_dir = short_tmpdir()
    (data_dir / "tokens.toml").write_text(f'[[tokens]]\ntenant = "beta"\ntoken = "{BETA}"\n')
    # Builds' time bound: wide enough for a loaded CI host's pip step and the gateway's layer
    # (one failed past 8 s at a load of 8), short enough for the build that runs forever.
    return start_gateway(
        "--template-build-timeout", "20", "--template-build-disk", "100m",
        "--tokens-file", str(data_dir / "tokens.toml"), data_dir=data_dir,
    )  # fmt: skip


def _build(gw: GatewayProcess, name: str, dockerfile: str, api: httpx.Client | None = None) -> dict:
    """Build (as ``api``'s tenant, the admin's by default) and wait until the build ends."""
    api = api or gw.client
    r = api.post("/v1/templates", json={"name": name, "dockerfile": dockerfile})
    assert r.status_code == 202, r.text
    version = r.json()["version"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = api.get(f"/v1/templates/{name}").json()["versions"]
        doc = next(d for d in found if d["version"] == version)
        if doc["status"] != "building":
            return doc
        time.sleep(0.3)
    raise AssertionError(f"build of {name} did not end")


def test_a_session_from_a_template_runs_hardened_whatever_the_dockerfile_asked(gw):
    built = _build(gw, "hardened", HARDENED)
    assert built["status"] == "ready", built
    assert built["kernel"] == "python3" and built["version"] == 1
    r = gw.client.post("/v1/sessions", json={"template": "hardened"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        reply = run(
            gw.client,
            sid,
            "import os, subprocess\n"
            "print(os.getuid(), open('/opt/baked.txt').read().strip(), os.environ['BAKED'])\n"
            "print(subprocess.run(['/usr/local/bin/rootsh', '-p', '-c', 'id -u'],"
            " capture_output=True, text=True).stdout.strip())\n"
            "print(oct(os.stat('/usr/local/bin/rootsh').st_mode & 0o7777))",
        )
        assert reply["status"] == "ok", reply
        text = "".join(o.get("text", "") for o in reply["outputs"])
        assert text.split("\n")[:3] == ["1000 baked yes", "1000", "0o755"], text
    finally:
        gw.client.delete(f"/v1/sessions/{sid}")
    listed = gw.client.get("/v1/templates").json()["templates"]
    assert [(d["name"], d["status"]) for d in listed] == [("hardened", "ready")]
    assert "logs" not in listed[0]
    assert gw.client.delete("/v1/templates/hardened").status_code == 204
    assert gw.client.get("/v1/templates/hardened").status_code == 404
    assert gw.client.post("/v1/sessions", json={"template": "hardened"}).status_code == 404


@pytest.mark.parametrize(
    ("dockerfile", "step", "reason"),
    [
        (
            'FROM sbx/python\nRUN python -c "import urllib.request as u; '
            "u.urlopen('http://172.17.0.1:%d/healthz', timeout=3)\"\n",
            "step 2 (RUN python",
            "Network is unreachable",
        ),
        ("FROM sbx/python\nRUN sleep 600\n", "step 2 (RUN sleep 600)", "time bound of 20 s"),
        (
            "FROM sbx/python\nUSER root\nRUN dd if=/dev/zero of=/fill bs=1M count=4000\n",
            "step 3 (RUN dd",
            "disk bound of 100 MiB",
        ),
    ],
    ids=["reaches-for-the-gateway", "runs-forever", "fills-the-disk"],
)
def test_a_hostile_build_fails_at_its_step_saying_why_while_a_canary_answers(
    gw, canary, dockerfile, step, reason
):
    if "%d" in dockerfile:
        dockerfile %= int(gw.url.rsplit(":", 1)[1])
    with Canary(gw, canary):
        doc = _build(gw, "hostile", dockerfile)
    assert doc["status"] == "failed", doc
    assert doc["error"]["step"].startswith(step), doc["error"]
    assert reason in doc["error"]["reason"], doc["error"]
    r = gw.client.post("/v1/sessions", json={"template": f"hostile:{doc['version']}"})
    assert r.status_code == 409 and "failed" in r.json()["error"]["message"]


def test_a_dockerfile_that_sabotages_the_gateways_layer_leaves_no_setuid_file(gw):
    """A SHELL that does nothing and a find that finds nothing: the layer's own tools."""
    doc = _build(
        gw,
        "sabotage",
        "FROM sbx/python\nUSER root\n"
        "RUN cp /bin/bash /usr/local/bin/rootsh && chmod u+s /usr/local/bin/rootsh\n"
        'RUN ln -sf /bin/true /usr/bin/find\nSHELL ["/bin/true"]\n',
    )
    if doc["status"] == "ready":  # then nothing may be left setuid in the image
        r = gw.client.post("/v1/sessions", json={"template": f"sabotage:{doc['version']}"})
        assert r.status_code == 201, r.text
        try:
            reply = run(
                gw.client,
                r.json()["id"],
                "import os; print(oct(os.stat('/usr/local/bin/rootsh').st_mode))",
            )
            assert "".join(o.get("text", "") for o in reply["outputs"]).strip() == "0o100755"
        finally:
            gw.client.delete(f"/v1/sessions/{r.json()['id']}")
    else:
        assert "setuid" in doc["error"]["reason"], doc


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"name": "..", "dockerfile": "FROM sbx/python\n"}, "not valid"),
        ({"name": "a\x00b", "dockerfile": "FROM sbx/python\n"}, "not valid"),
        ({"name": "x" * 10_000, "dockerfile": "FROM sbx/python\n"}, "not valid"),
        ({"name": "ok", "dockerfile": "FROM python:3.12\n"}, "build from one of"),
    ],
    ids=["dots", "nul", "10k", "pulled-base"],
)
def test_bad_builds_get_a_clear_400(gw, body, says):
    r = gw.client.post("/v1/templates", json=body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]
    assert len(r.text) < 2000


def test_the_cli_builds_from_a_context_and_the_sdk_starts_a_session_from_it(gw, tmp_path):
    import os
    import subprocess

    from gateway.client import Client

    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "greeting.txt").write_text("from the context\n")
    (tmp_path / "Dockerfile").write_text("FROM sbx/python\nCOPY greeting.txt /opt/greeting.txt\n")
    env = {**os.environ, "SBX_URL": gw.url, "SBX_TOKEN": gw.token}
    sbx = [str(Path(sys.executable).parent / "sbx"), "templates"]
    done = subprocess.run(
        [*sbx, "build", "cli-geo", "-f", str(tmp_path / "Dockerfile"), str(tmp_path / "ctx")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cli-geo:1 ready" and ": COPY greeting.txt" in done.stderr
    with Client(gw.url, gw.token) as client:
        assert "cli-geo" in {b["name"] for b in client.templates()}
        with client.create_session(template="cli-geo") as session:
            ran = session.run("print(open('/opt/greeting.txt').read(), end='')")
            assert ran.stdout == "from the context\n"
    gone = subprocess.run([*sbx, "rm", "cli-geo"], env=env, capture_output=True, text=True)
    assert gone.returncode == 0 and "deleted cli-geo" in gone.stderr


def test_the_stock_e2b_sdk_builds_a_template_and_a_sandbox_starts_from_it(gw, tmp_path):
    from e2b import Template
    from e2b.exceptions import BuildException, TemplateException
    from e2b_code_interpreter import Sandbox

    (tmp_path / "data.txt").write_text("copied\n")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_env(gw, gw.token).items():
            mp.setenv(name, value)
        template = (
            Template(file_context_path=str(tmp_path))
            .from_base_image()
            .run_cmd("echo built > /tmp/built.txt")
            .copy("data.txt", "/opt/data.txt")
            .set_envs({"STACK": "geo"})
        )
        logs: list = []
        built = Template.build(template, "e2b-geo:v1", tags=["stable"], on_build_logs=logs.append)
        assert any("COPY" in entry.message for entry in logs)
        assert sorted(built.tags) == ["stable", "v1"]
        assert Template.exists("e2b-geo") and not Template.exists("e2b-nobody")
        assert Template.exists("e2b-geo:stable") and not Template.exists("e2b-geo:nope")
        _e2b_tags_move_and_go(gw, built.build_id)
        sandbox = Sandbox.create("e2b-geo:prod")
        try:
            ran = sandbox.run_code(
                "import os; print(open('/opt/data.txt').read().strip(), os.environ['STACK'],"
                " os.getuid())"
            )
            assert ran.logs.stdout == ["copied geo 1000\n"], ran
        finally:
            sandbox.kill()
            # E2B's raw API deletes a template as it does a snapshot: its every version goes
            gone = httpx.delete(f"{gw.url}/templates/e2b-geo", headers={"X-API-Key": gw.token})
            assert gone.status_code == 204, gone.text
        assert not Template.exists("e2b-geo")
        with pytest.raises(TemplateException, match="404"):
            Template.get_tags("e2b-geo")  # its tags went with it
        with pytest.raises(BuildException, match="non-zero code: 3"):
            Template.build(Template().from_base_image().run_cmd("exit 3"), "e2b-broken")


def _e2b_tags_move_and_go(gw: GatewayProcess, build_id: str) -> None:
    """E2B's tag calls on a built template, and /v1's view and calls of the same tags."""
    from e2b import AsyncTemplate, Template
    from e2b.exceptions import TemplateException

    assigned = Template.assign_tags("e2b-geo:v1", "prod")
    assert assigned.tags == ["prod"] and UUID(assigned.build_id) == UUID(build_id)
    tags = {t.tag: UUID(t.build_id) for t in Template.get_tags("e2b-geo")}
    assert tags == dict.fromkeys(["prod", "stable", "v1"], UUID(build_id))
    Template.remove_tags("e2b-geo", ["stable"])
    assert not Template.exists("e2b-geo:stable")

    async def the_async_half() -> list[str]:  # the same calls, from AsyncTemplate
        await AsyncTemplate.assign_tags("e2b-geo:prod", ["canary"])
        await AsyncTemplate.remove_tags("e2b-geo", "canary")
        return [t.tag for t in await AsyncTemplate.get_tags("e2b-geo")]

    assert asyncio.run(the_async_half()) == ["prod", "v1"]
    with pytest.raises(TemplateException, match="404: template 'e2b-geo' has no version 9"):
        Template.assign_tags("e2b-geo:9", "x")
    view = gw.client.get("/v1/templates/e2b-geo").json()["versions"]
    assert [v["tags"] for v in view] == [["prod", "v1"]]
    r = gw.client.post("/v1/templates/e2b-geo/tags", json={"version": "v1", "tags": ["latest"]})
    assert r.status_code == 200 and r.json() == {
        "name": "e2b-geo",
        "version": 1,
        "tags": ["latest"],
    }
    bad = gw.client.post("/v1/templates/e2b-geo/tags", json={"version": 1, "tags": ["a\x00.."]})
    assert bad.status_code == 400 and "\\u0000" not in bad.text and "\x00" not in bad.text
    r = gw.client.request("DELETE", "/v1/templates/e2b-geo/tags", json={"tags": ["latest"]})
    assert r.status_code == 204
    assert [t["tag"] for t in gw.client.get("/v1/templates/e2b-geo/tags").json()["tags"]] == [
        "prod", "v1"
    ]  # fmt: skip


def test_a_build_that_forks_without_end_is_stopped_by_a_pids_bound(gw):
    """A fork bomb in a RUN step would take the host's pids from every session."""
    doc = _build(
        gw,
        "forks",
        "FROM sbx/python\n"
        "RUN i=0; while [ $i -lt 3000 ]; do sleep 5 & i=$((i+1)); done; echo forked $i\n",
    )
    assert doc["status"] == "failed", doc
    assert "Cannot fork" in doc["error"]["reason"], doc["error"]


def test_e2b_pip_install_builds_from_the_hosts_wheels_without_a_network(gw):
    """The build fetches no package itself: the gateway hands it the wheels (sbx-pip)."""
    from e2b import Template
    from e2b.exceptions import BuildException
    from e2b_code_interpreter import Sandbox

    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_env(gw, gw.token).items():
            mp.setenv(name, value)
        Template.build(Template().from_base_image().pip_install(["six"]), "e2b-pip")
        sandbox = Sandbox.create("e2b-pip")
        try:
            ran = sandbox.run_code("import six, os; print(six.__name__, os.getuid())")
            assert ran.logs.stdout == ["six 1000\n"], ran
        finally:
            sandbox.kill()
            assert gw.client.delete("/v1/templates/e2b-pip").status_code == 204
        with pytest.raises(BuildException, match="no wheel"):
            Template.build(Template().from_base_image().pip_install(["sbx-no-such-pkg"]), "e2b-pip")


def test_a_create_from_a_pooled_template_is_served_from_its_tenants_pool_alone(gw):
    beta = httpx.Client(base_url=gw.url, timeout=120, headers={"Authorization": f"Bearer {BETA}"})
    ours = lambda: gw.client.get("/v1/templates/pooled").json()["pool"]  # noqa: E731
    made: list[tuple[httpx.Client, str]] = []
    try:
        assert _build(gw, "pooled", "FROM sbx/python\nENV BAKED=yes\n")["status"] == "ready"
        assert _build(gw, "pooled", "FROM sbx/python\n", api=beta)["status"] == "ready"
        r = gw.client.put("/v1/templates/pooled/pool", json={"size": 1})
        assert r.status_code == 200 and r.json()["size"] == 1 and r.json()["version"] == 1, r.text
        assert wait_for(lambda: ours()["ready"] == 1, timeout=60), ours()
        # beta's same name is its own template (no BAKED), never a sandbox of our pool
        for api, baked in ((beta, "None\n"), (gw.client, "yes\n")):
            r = api.post("/v1/sessions", json={"template": "pooled"})
            assert r.status_code == 201, r.text
            made.append((api, r.json()["id"]))
            reply = run(api, made[-1][1], "import os; print(os.environ.get('BAKED'))")
            assert "".join(o.get("text", "") for o in reply["outputs"]) == baked, reply
        assert ours()["served"] == 1, "the tenant's create did not come from its pool"
        assert beta.get("/v1/templates/pooled").json()["pool"]["size"] == 0
        r = gw.client.put("/v1/templates/pooled/pool", json={"size": 5})
        assert r.status_code == 422 and "over the 4 a tenant may keep" in r.text, r.text
    finally:
        for api, sid in made:
            api.delete(f"/v1/sessions/{sid}")
        for api in (gw.client, beta):
            api.delete("/v1/templates/pooled")
        beta.close()
    r = gw.client.put("/v1/templates/pooled/pool", json={"size": 1})
    assert r.status_code == 404, "a deleted template keeps a pool"
