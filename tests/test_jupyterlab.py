"""JupyterLab in a real browser, with the gateway as its kernel gateway."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import httpx
import nbformat
import pytest
from helpers import ROOT, screenshot_path, short_tmpdir, wait_for
from test_jupyter_api import free_port

pytestmark = pytest.mark.docker

CODE = (
    "import matplotlib.pyplot as plt\n"
    "print('hello from the sandbox')\n"
    "plt.plot([1, 4, 2, 5]); plt.title('sandboxed chart'); plt.show()"
)


def test_jupyterlab_runs_a_cell_in_the_sandbox(gateway, api):
    """With the gateway's token (GatewayClient.auth_token) on REST and channels, no open mode."""
    assert httpx.get(f"{gateway.url}/api/kernels").status_code == 401, "the gateway needs a token"
    root = short_tmpdir()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(CODE)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (sandboxed)"}},
    )
    nbformat.write(nb, root / "demo.ipynb")
    port, token = free_port(), uuid.uuid4().hex
    with open(root / "lab.log", "w") as log:
        lab = subprocess.Popen(
            [
                sys.executable, "-m", "jupyterlab", f"--gateway-url={gateway.url}",
                f"--GatewayClient.auth_token={gateway.token}",
                f"--port={port}", f"--IdentityProvider.token={token}", "--no-browser",
                f"--ServerApp.root_dir={root}", "--allow-root", "--LabApp.news_url=",
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            assert wait_for(lambda: _up(url), timeout=60), (root / "lab.log").read_text()
            shot = screenshot_path("jupyterlab.png", root)
            out = subprocess.run(
                ["node", "lab.mjs", f"{url}/lab/tree/demo.ipynb?token={token}", str(shot)],
                cwd=ROOT / "tests" / "browser",
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode == 0, out.stderr[-3000:] + (root / "lab.log").read_text()[-3000:]
            shown = json.loads(out.stdout.strip().splitlines()[-1])
            ran = wait_for(lambda: _ran_in_gateway(api), timeout=10)
        finally:
            lab.terminate()
            lab.wait(30)
    assert "hello from the sandbox" in shown["text"], f"the page showed: {shown}"
    assert shown["image"][0] > 100 and shown["image"][1] > 100, "the chart is not visible"
    assert ran, "the cell did not run (and get recorded) in a gateway session"


def _ran_in_gateway(api) -> bool:
    """The cell ran in a gateway session: one with a Jupyter kernel's activity-counted ttl."""
    sessions = api.get("/v1/sessions", params={"metadata.client": "jupyter"}).json()["sessions"]
    sessions = [s for s in sessions if s["ttl_from"] == "activity"]
    history = [api.get(f"/v1/sessions/{s['id']}/history").json()["executions"] for s in sessions]
    return any(h and h[0]["code"] == CODE for h in history)


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
