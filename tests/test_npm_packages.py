"""npm installs through the cache: verdaccio beside the gateway, JavaScript sandboxes on no network.

A real ``npm install`` of a small package, in a real JavaScript session, from
the registry npm is configured with on this host; the package required
after; a second install (another session) served from the cache; a package
the tenant's policy denies refused with an npm error that says so; every
install in the audit log with its version and hash.
"""

from __future__ import annotations

import shutil

import httpx
import pytest
from helpers import run, text_of

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(shutil.which("npm") is None, reason="the npm cache needs npm on the host"),
]

TOKENS = {"alpha": "alpha-npm-token-51c7", "beta": "beta-npm-token-a08e"}
PACKAGE = "is-number"  # one small package with no dependencies
TENANT_FLAGS = ("--npm-cache", "true")
TENANTS = f'[tenants.beta]\npackage_deny = ["{PACKAGE}"]\n'

INSTALL = (
    "var done = require('child_process').spawnSync('npm', ['install', '--no-save', "
    "'--prefix', '/workspace', '{package}'], {{encoding: 'utf8'}});\n"
    "console.log(done.status);\n"
    "console.log((done.stdout + done.stderr).slice(-3000));"
)


def install(client: httpx.Client, package: str = PACKAGE, then: str = "") -> tuple[int, str]:
    sid = client.post("/v1/sessions", json={"kernel": "javascript"}).json()["id"]
    try:
        out = text_of(run(client, sid, INSTALL.format(package=package), timeout=240))
        if then:
            out += text_of(run(client, sid, then))
    finally:
        client.delete(f"/v1/sessions/{sid}")
    code, _, log = out.partition("\n")
    return int(code), log


def test_a_network_none_session_npm_installs_from_the_cache_and_a_second_install_hits_it(tenants):
    gw, c = tenants
    code, log = install(c["alpha"], then=f"console.log('works', require('{PACKAGE}')(5))")
    assert code == 0, f"npm install through the npm cache failed: {log}"
    assert "works true" in log, log
    again, log = install(c["alpha"])
    assert again == 0, log
    events = gw.client.get("/v1/audit", params={"action": "package.install"}).json()["events"]
    tarballs = [e for e in reversed(events) if e["detail"]["installer"] == "npm"]
    assert len(tarballs) == 2, events
    first, second = (e["detail"] for e in tarballs)
    assert first["name"] == PACKAGE and first["version"] and len(first["sha256"]) == 64
    assert first["filename"] == f"{PACKAGE}-{first['version']}.tgz"
    assert (first["cached"], second["cached"]) == (False, True), "the second was fetched again"
    assert first["sha256"] == second["sha256"] and first["size"] == second["size"]
    assert {e["tenant"] for e in tarballs} == {"alpha"}


def test_a_package_the_tenants_policy_denies_is_an_npm_error_saying_so(tenants):
    gw, c = tenants
    code, log = install(c["beta"])
    assert code != 0, log
    assert "E403" in log and f"package policy refused {PACKAGE}: {PACKAGE} is on the deny list" in (
        log
    ), log
    refused = gw.client.get("/v1/audit", params={"action": "package.refused"}).json()["events"]
    assert refused and refused[0]["tenant"] == "beta" and refused[0]["outcome"] == "denied"
    assert refused[0]["detail"]["installer"] == "npm"


def test_a_javascript_session_without_a_network_reaches_nothing_but_the_cache(tenants):
    _, c = tenants
    sid = c["alpha"].post("/v1/sessions", json={"kernel": "javascript"}).json()["id"]
    try:
        probe = (
            "require('net').connect(443, '1.1.1.1')"
            ".on('error', (e) => console.log('refused', e.code))"
            ".on('connect', () => console.log('reached'))"
        )
        code = (
            f"console.log(require('child_process').spawnSync(process.execPath, ['-e', "
            f"{probe!r}], {{encoding: 'utf8', timeout: 10000}}).stdout)"
        )
        reply = run(c["alpha"], sid, code)
        assert text_of(reply).startswith("refused")
        assert reply["execution_count"] == 1, "the relay's silent start took a count"
    finally:
        c["alpha"].delete(f"/v1/sessions/{sid}")
