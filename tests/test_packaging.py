"""The distributions as a user installs them: wheels, not the checkout.

Both wheels are built from this tree (``pip wheel --no-deps``) and installed
into fresh virtual environments outside it, so nothing of the checkout or the
test's own environment can stand in for what the wheel lacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import venv
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from helpers import ROOT, short_tmpdir, wait_for

SERVER_PACKAGES = ["docker", "tornado", "jupyter_client", "zmq", "mcp", "ipykernel"]


# Without the test's PYTHONPATH: the checkout (and its egg-info) must not stand in for a wheel.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def sh(*cmd: str | Path, cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=CLEAN_ENV,
    )  # fmt: skip
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """The full and the slim client wheel, built from this checkout."""
    out = tmp_path_factory.mktemp("wheels")
    for project in (ROOT, ROOT / "clients" / "python"):
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, project]
        sh(*pip, cwd=out)
    found = {w.name.split("-")[0]: w for w in out.glob("*.whl")}
    assert set(found) == {"sandbox_gateway", "sandbox_gateway_client"}, found
    return found


def fresh_venv(where: Path, *wheels: Path) -> Path:
    """A new virtual environment with ``wheels`` (and their dependencies) installed, one
    after the other; its bin/."""
    venv.EnvBuilder(with_pip=True).create(where)
    for wheel in wheels:
        sh(where / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=where)
    return where / "bin"


@pytest.fixture(scope="module")
def server_venv(wheels, tmp_path_factory) -> Path:
    """One environment with the full wheel (and its dependencies): installing them is most of
    these tests' time. The serving test reads it; the side-by-side test, after it, changes it."""
    return fresh_venv(tmp_path_factory.mktemp("server") / "venv", wheels["sandbox_gateway"])


def test_the_slim_client_installs_and_imports_without_the_server(wheels, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv", wheels["sandbox_gateway_client"])
    probe = (
        "import json, sys, importlib.util\n"
        "import sbx_client\n"
        "from sbx_client import AsyncClient, Client, Session, GatewayError\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'version': sbx_client.__version__,\n"
        f"  'installed': [n for n in {[*SERVER_PACKAGES, 'gateway']!r}\n"
        "                if importlib.util.find_spec(n)]}))\n"
    )
    seen = json.loads(sh(bin_dir / "python", "-c", probe, cwd=tmp_path))
    assert seen["installed"] == [], f"the slim client brought {seen['installed']} along"
    loaded = {m.split(".")[0] for m in seen["modules"]} & set(SERVER_PACKAGES)
    assert not loaded, loaded
    ours = {m for m in seen["modules"] if m.startswith("sbx_client.")}
    sdk = {m for m in ours if m.startswith("sbx_client.client")}
    assert ours <= {"sbx_client.errors", "sbx_client.version"} | sdk, ours
    import gateway

    assert seen["version"] == gateway.__version__


@pytest.fixture
def health_url() -> Iterator[str]:
    """A stand-in gateway answering ``GET /healthz``, for an SDK to call without Docker."""

    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": "ok", "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# Each SDK, imported by its own name, calls the stand-in gateway; the server's CLI loads too.
SERVER_PROBE = (
    "import sys, gateway.app, gateway.cli.main\n"
    "from gateway.client import Client\n"
    "print(Client(sys.argv[1], 'token').health()['status'])\n"
)
SLIM_PROBE = (
    "import sys\n"
    "from sbx_client import Client, GatewayError\n"
    "from sbx_client.client import Session\n"
    "print(Client(sys.argv[1], 'token').health()['status'])\n"
)
OWNED_PROBE = (
    "import json, sys\n"
    "from importlib.metadata import distribution\n"
    "files = {str(f) for f in distribution(sys.argv[1]).files or ()}\n"
    "print(json.dumps(sorted(f for f in files if not ('.dist-info' in f or '__pycache__' in f))))\n"
)


@pytest.mark.docker
def test_the_wheel_serves_kernels_from_its_package_data(server_venv, tmp_path):
    bin_dir = server_venv
    import gateway

    version = sh(bin_dir / "sbx", "--version", cwd=tmp_path).strip()
    assert version == f"sbx {gateway.__version__}", version
    typed = sh(
        bin_dir / "python", "-c", "import gateway, pathlib; print(gateway.__file__)", cwd=tmp_path
    )
    assert (Path(typed).parent / "py.typed").is_file(), "the wheel carries no py.typed"

    # Outside the checkout, the gateway finds kernels/ and images/ inside the installed package.
    data_dir = short_tmpdir()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen(
            [bin_dir / "sbx", "serve", "--port", "0", "--data-dir", data_dir, "--pool", "",
             "--end-sessions-on-stop", "--admin-token", "packaged-token-0123456789"],
            cwd=tmp_path, stderr=out, env=CLEAN_ENV,
        )  # fmt: skip
    try:

        def listening() -> str | None:
            for line in log.read_text().splitlines():
                if "listening on http://" in line:
                    return line.split("listening on ")[1].split()[0]
            return None

        url = wait_for(listening, 60)
        assert url, "the installed gateway did not start:\n" + log.read_text()[-3000:]
        headers = {"Authorization": "Bearer packaged-token-0123456789"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as api:
            kernels = {k["name"]: k for k in api.get("/v1/kernels").json()["kernels"]}
            assert "python3" in kernels, kernels
            sid = api.post("/v1/sessions", json={}).json()["id"]
            reply = api.post(f"/v1/sessions/{sid}/execute", json={"code": "6 * 7"}).json()
            assert reply["outputs"][0]["data"]["text/plain"] == "42", reply
            assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    finally:
        serve.terminate()
        serve.wait(60)


def test_the_slim_client_installs_next_to_the_server(server_venv, wheels, tmp_path, health_url):
    """Both distributions in one environment: no file belongs to both, so each imports and
    works, and removing either leaves the other whole."""
    bin_dir = server_venv
    python, pip = bin_dir / "python", [bin_dir / "python", "-m", "pip"]
    sh(*pip, "install", "-q", wheels["sandbox_gateway_client"], cwd=tmp_path)
    server_files = set(json.loads(sh(python, "-c", OWNED_PROBE, "sandbox-gateway", cwd=tmp_path)))
    slim_files = json.loads(sh(python, "-c", OWNED_PROBE, "sandbox-gateway-client", cwd=tmp_path))
    shared = sorted(server_files.intersection(slim_files))
    assert not shared, f"the slim client overwrites the server's files: {shared}"
    assert {f.split("/")[0] for f in slim_files} == {"sbx_client"}, slim_files

    for probe in (SERVER_PROBE, SLIM_PROBE):
        assert sh(python, "-c", probe, health_url, cwd=tmp_path).strip() == "ok"
    sh(bin_dir / "sbx", "--version", cwd=tmp_path)

    sh(*pip, "uninstall", "-y", "-q", "sandbox-gateway-client", cwd=tmp_path)
    assert sh(python, "-c", SERVER_PROBE, health_url, cwd=tmp_path).strip() == "ok"
    sh(*pip, "install", "-q", "--no-deps", wheels["sandbox_gateway_client"], cwd=tmp_path)
    sh(*pip, "uninstall", "-y", "-q", "sandbox-gateway", cwd=tmp_path)
    assert sh(python, "-c", SLIM_PROBE, health_url, cwd=tmp_path).strip() == "ok"
