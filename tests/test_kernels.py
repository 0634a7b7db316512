"""Every kernel a session can ask for, on the real engine.

Each language keeps state between executes, reports errors as error outputs
and stdout as a stream, runs under the same hardening and limits, and exports
a notebook with its own kernelspec and language_info that replays.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest
from helpers import execute_in_background, run, text_of, wait_for

from gateway.config import PACKAGE_DIR

pytestmark = pytest.mark.docker


@dataclass(frozen=True)
class Language:
    kernel: str
    language: str  # language_info.name the kernel reports
    assign: str  # stores 41 in x
    print_next: str  # prints x + 1 to stdout
    fail: str  # raises an error
    sleep: str  # stores 5 in y, then sleeps 30 s


PY_SLEEP = "y = 5; import time; time.sleep(30)"
LANGUAGES = [
    Language("python3", "python", "x = 41", "print(x + 1)", "1 / 0", PY_SLEEP),
    Language("xpython", "python", "x = 41", "print(x + 1)", "1 / 0", PY_SLEEP),
    Language("bash", "bash", "x=41", "echo $((x + 1))", "ls /no/such/dir", "y=5; sleep 30"),
    Language("ir", "R", "x <- 41", 'cat(x + 1, "\\n")', 'stop("boom")', "y <- 5; Sys.sleep(30)"),
    Language(
        "javascript", "javascript", "var x = 41", "console.log(x + 1)", "noSuchFunction()",
        "var y = 5; const end = Date.now() + 30000; while (Date.now() < end) {}",
    ),
]  # fmt: skip
BY_KERNEL = {lang.kernel: lang for lang in LANGUAGES}


@pytest.fixture(scope="module", autouse=True)
def images_built(gateway) -> None:
    """Fail early, saying what to do, when a kernel's image is missing."""
    kernels = gateway.client.get("/v1/kernels").json()["kernels"]
    missing = [k["image"] for k in kernels if not k["built"]]
    if missing:
        pytest.fail(
            f"kernel images not built: {', '.join(missing)}; run `sbx images build --all` "
            "(scripts/test does)"
        )


@pytest.mark.parametrize("lang", LANGUAGES, ids=lambda lang: lang.kernel)
def test_language_keeps_state_reports_errors_and_replays(api, new_session, engine, lang):
    session = new_session(kernel=lang.kernel, limits={"memory": "384m", "pids": 128})
    sid = session["id"]
    assert session["kernel"] == lang.kernel and session["language_info"]["name"] == lang.language

    assert run(api, sid, lang.assign)["status"] == "ok"
    printed = run(api, sid, lang.print_next)
    assert printed["status"] == "ok", printed
    assert printed["outputs"][0]["output_type"] == "stream", f"stdout was not a stream: {printed}"
    assert text_of(printed).strip() == "42", f"x did not survive between executes: {printed}"

    failed = run(api, sid, lang.fail)
    assert failed["status"] == "error" and failed["error"] is not None, failed
    assert [o for o in failed["outputs"] if o["output_type"] == "error"], (
        f"a {lang.kernel} error came back without an error output: {failed}"
    )

    # The same hardening and limits as every session.
    host = engine.api.inspect_container(session["container_id"])["HostConfig"]
    assert host["ReadonlyRootfs"] and host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"]
    assert host["Memory"] == 384 * 2**20 and host["PidsLimit"] == 128
    user = engine.api.inspect_container(session["container_id"])["Config"]["User"]
    assert user == "1000:1000"

    nb = api.get(f"/v1/sessions/{sid}/notebook").json()
    kernelspec = nb["metadata"]["kernelspec"]
    assert kernelspec["name"] == lang.kernel and kernelspec["language"] == lang.language
    assert kernelspec["display_name"] == session["display_name"]
    assert nb["metadata"]["language_info"]["name"] == lang.language
    assert [c["source"] for c in nb["cells"]] == [lang.assign, lang.print_next, lang.fail]

    report = api.post("/v1/notebooks/replay", json=nb).json()
    assert report["reproduced"], f"the {lang.kernel} notebook did not replay: {report['cells']}"
    assert report["summary"] == {"same": 3, "different": 0, "error": 0, "skipped": 0}


def test_r_base_plot_is_a_png(api, new_session):
    sid = new_session(kernel="ir")["id"]
    reply = run(api, sid, "plot(1:10, main = 'squares')")
    assert reply["status"] == "ok", reply
    images = [o for o in reply["outputs"] if "image/png" in o.get("data", {})]
    assert images, f"a base R plot did not come back as image/png: {reply['outputs']}"
    assert images[0]["data"]["image/png"].replace("\n", "").startswith("iVBORw0KGgo")


def test_r_has_the_common_packages(api, new_session):
    sid = new_session(kernel="ir")["id"]
    code = 'for (p in c("ggplot2", "dplyr", "tidyr", "readr", "data.table", "jsonlite")) ' \
        "library(p, character.only = TRUE); cat('loaded\\n')"  # fmt: skip
    reply = run(api, sid, code)
    assert reply["status"] == "ok" and text_of(reply) == "loaded\n", reply


def test_r_install_packages_fails_fast_saying_why(api, new_session):
    """No CRAN cache (CRAN is unreachable from here): a clear refusal, not a misleading miss."""
    sid = new_session(kernel="ir")["id"]
    reply = run(api, sid, 'install.packages("glue")', timeout=30)
    assert reply["status"] == "error", reply
    said = str(reply["error"]) + text_of(reply)
    assert "no CRAN cache" in said and "installed.packages()" in said, reply
    assert reply["duration_ms"] < 5_000, reply


@pytest.mark.parametrize("kernel", ["python3", "bash", "ir"])
def test_interrupt_stops_the_cell_and_keeps_state(api, new_session, kernel):
    """ipykernel, bash_kernel and IRkernel each say 'interrupted' their own way.

    The interrupt comes once the cell runs (it made a file): IRkernel says it is busy before
    it catches interrupts, and one in between ends R (seen on a loaded machine).
    """
    sid = new_session(kernel=kernel)["id"]
    code = {
        "python3": "y = 5; open('began', 'w').close(); import time; time.sleep(30)",
        "bash": "y=5; touch began; sleep 30",
        "ir": "y <- 5; invisible(file.create('began')); Sys.sleep(30)",
    }[kernel]
    thread, box = execute_in_background(api, sid, code, timeout=60)
    assert wait_for(lambda: api.get(f"/v1/sessions/{sid}/files/began").status_code == 200)
    assert wait_for(lambda: api.post(f"/v1/sessions/{sid}/interrupt").status_code < 300)
    thread.join(30)
    assert box["reply"]["status"] == "interrupted", box["reply"]
    assert box["reply"]["duration_ms"] < 20_000, "the interrupt did not stop the cell"
    after = {"python3": "print(y)", "bash": "echo $y", "ir": "cat(y, '\\n')"}[kernel]
    assert text_of(run(api, sid, after)).strip() == "5", "the interrupt lost the session's state"


@pytest.mark.parametrize("kernel", ["xpython", "javascript"])
def test_uninterruptible_kernel_is_restarted_on_timeout(api, new_session, kernel):
    """These kernels cannot stop a running cell; the session survives with a fresh kernel."""
    sid = new_session(kernel=kernel)["id"]
    reply = run(api, sid, BY_KERNEL[kernel].sleep, timeout=1)
    assert reply["status"] == "timeout" and reply["error"]["kernel_restarted"], reply
    assert api.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
    assert text_of(run(api, sid, BY_KERNEL[kernel].print_next.replace("x + 1", "42"))) == "42\n"


def test_kernel_catalog_lists_languages_and_images(api):
    body = api.get("/v1/kernels").json()
    assert body["default"] == "python3"
    kernels = {k["name"]: k for k in body["kernels"]}
    assert set(kernels) >= set(BY_KERNEL)
    for lang in LANGUAGES:
        entry = kernels[lang.kernel]
        assert entry["built"] and entry["image_tag"].startswith(f"sbx/{entry['image']}:")
        assert entry["language"].lower() == lang.language.lower() and entry["display_name"]
    assert kernels["ir"]["display_name"] == "R (sandboxed)"
    # The Jupyter kernelspecs endpoint offers the same kernels, with their logos.
    specs = api.get("/api/kernelspecs").json()["kernelspecs"]
    assert set(specs) == set(kernels)
    for name in ("ir", "javascript", "xpython"):
        logo = api.get(specs[name]["resources"]["logo-64x64"])
        assert logo.status_code == 200 and logo.content.startswith(b"\x89PNG"), name


def test_kernel_without_a_built_image_says_how_to_build_it(start_gateway, tmp_path):
    kernels_dir, images_dir = tmp_path / "kernels", tmp_path / "images"
    shutil.copytree(PACKAGE_DIR / "kernels" / "bash", kernels_dir / "bash")
    (images_dir / "bash").mkdir(parents=True)
    (images_dir / "bash" / "Dockerfile").write_text("FROM scratch\n# never built\n")
    gw = start_gateway("--kernels-dir", str(kernels_dir), "--images-dir", str(images_dir))
    catalog = gw.client.get("/v1/kernels").json()
    assert catalog["default"] == "bash"
    assert [(k["name"], k["built"]) for k in catalog["kernels"]] == [("bash", False)]
    r = gw.client.post("/v1/sessions", json={"kernel": "bash"})
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "image_not_built" and "sbx images build bash" in error["message"]
