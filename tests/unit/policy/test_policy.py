"""Policies and the code scanner, as plain objects: findings, decisions, files, tightening."""

from __future__ import annotations

import asyncio

import pytest

from gateway.access.auth import Principal
from gateway.errors import PolicyInvalid
from gateway.policy import scan
from gateway.policy.approvals import ApprovalDesk
from gateway.policy.book import PolicyBook
from gateway.policy.gate import Gate
from gateway.policy.model import Policy, default_policy, session_policy
from gateway.policy.scan import Scanner
from gateway.store.sqlite import SQLiteStore as Store

SCANNER = Scanner()


def rules_found(code: str, language: str = "python") -> set[tuple[str, int]]:
    patterns = default_policy().patterns
    return {(f.rule, f.line) for f in SCANNER.scan(code, language, patterns)}


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("x = 1\nprint(x)", set()),
        ("import subprocess\nsubprocess.run(['ls'])", {("shell", 1), ("shell", 2)}),
        ("import os\nos.system('ls')", {("shell", 2)}),
        ("x = 1\n!ls /", {("shell", 2)}),
        ("%%bash\nls /\n", {("shell", 1)}),
        ("import requests\nrequests.get('https://a.example')", {("network", 1)}),
        ("import socket", {("network", 1)}),
        ("from urllib.request import urlopen", {("network", 1)}),
        ("import shutil\nshutil.rmtree('/etc')", {("delete", 2)}),
        ("import os\nos.remove('../../x')", {("delete", 2)}),
        ("import os\nos.remove('out/data.csv')\nos.remove('/workspace/x')", set()),
        ("%pip install numpy", {("install", 1)}),
        ("!pip install numpy", {("install", 1), ("shell", 1)}),
        ("open('/root/.ssh/id_rsa').read()", {("secrets", 1)}),
        ("import os\nos.environ['API_TOKEN']", {("secrets", 2)}),
        ("import os\nos.getenv('HOME')", set()),
        ("x = (", set()),  # the kernel refuses it too: nothing runs
    ],
)
def test_python_code_is_scanned_by_its_ast(code: str, expected: set) -> None:
    assert rules_found(code) == expected, f"scanning {code!r}"


def test_a_nosec_comment_does_not_silence_a_check() -> None:
    assert rules_found("import os\nos.system('ls')  # nosec") == {("shell", 2)}


def test_other_kernels_use_the_policys_patterns() -> None:
    assert rules_found("curl https://a.example\nrm -rf /etc", "bash") == {
        ("network", 1),
        ("delete", 2),
    }
    assert rules_found('install.packages("x")', "R") == {("install", 1)}
    assert rules_found("echo hello", "bash") == set()


def test_findings_name_their_check_and_line() -> None:
    findings = SCANNER.scan("y = 2\nimport os\nos.system('id')", "python")
    (finding,) = [f for f in findings if f.check == "B605"]
    assert finding.to_json() == {
        "rule": "shell",
        "check": "B605",
        "line": 3,
        "message": finding.message,
        "severity": finding.severity,
    }


def test_decisions_take_the_strictest_rule_and_report_mode_holds_nothing() -> None:
    text = 'mode = "enforce"\n[rules]\nshell = "hold"\nsecrets = "deny"\n'
    policy = Policy.parse(text, "toml")
    shell = SCANNER.scan("import os\nos.system('ls')", "python")
    secrets = SCANNER.scan("open('/etc/shadow')", "python")
    assert policy.decide([]).action == "allow"
    assert policy.decide(shell).action == "hold"
    decision = policy.decide(shell + secrets)
    assert decision.action == "deny"
    assert any("line 2: shell" in r for r in decision.reasons)
    report = Policy.parse(text.replace("enforce", "report"), "toml").decide(shell + secrets)
    assert (report.action, report.verdict) == ("allow", "deny")


@pytest.mark.parametrize(
    ("text", "fmt", "line", "words"),
    [
        ('mode = "enforce"\n[rules]\nshell = "maybe"\n', "toml", 3, "shell must be one of"),
        ('mode = "enforce"\n[rules]\nshell = \n', "toml", 3, "not valid TOML"),
        ("mode: enforce\nrules:\n  shel: hold\n", "yaml", 3, "unknown rule 'shel'"),
        ("mode: enforce\nrules: [\n", "yaml", 3, "not valid YAML"),
        ("mode: strict\n", "yaml", 1, "mode must be one of"),
        ("patterns:\n  - rule: shell\n    regex: '(('\n", "yaml", 3, "not valid"),
        ("colour = 1\n", "toml", 1, "unknown key 'colour'"),
    ],
)
def test_a_malformed_policy_is_refused_with_the_line_at_fault(text, fmt, line, words) -> None:
    with pytest.raises(PolicyInvalid) as e:
        Policy.parse(text, fmt, "p")
    assert f"line {line}" in e.value.message and words in e.value.message, e.value.message


def test_a_session_can_tighten_its_tenants_policy_but_never_loosen_it() -> None:
    tenant = Policy.parse('mode = "enforce"\n[rules]\nshell = "deny"\n', "toml")
    asked = session_policy({"mode": "report", "rules": {"shell": "allow", "network": "hold"}})
    merged = tenant.tighten(asked)
    assert merged.mode == "enforce"
    assert merged.action("shell") == "deny" and merged.action("network") == "hold"
    with pytest.raises(PolicyInvalid, match="network must be one of"):
        session_policy({"rules": {"network": "sometimes"}})


def test_the_book_reads_files_per_tenant_and_keeps_the_old_on_a_bad_reload(tmp_path) -> None:
    (tmp_path / "acme.yaml").write_text("mode: enforce\nrules:\n  shell: deny\n")
    (tmp_path / "default.toml").write_text('mode = "enforce"\n[rules]\nnetwork = "hold"\n')
    book = PolicyBook(tmp_path)
    book.load()
    assert book.policy("acme").action("shell") == "deny"
    assert book.policy("other").action("network") == "hold"
    (tmp_path / "acme.yaml").write_text("mode: enforce\nrules:\n  shell: never\n")
    with pytest.raises(PolicyInvalid, match=r"acme.yaml at line 3"):
        book.load()
    assert book.policy("acme").action("shell") == "deny", "a bad reload changed the policies"
    empty = PolicyBook(tmp_path / "none")
    empty.load()
    assert empty.policy("x") == default_policy()


def test_replacing_a_policy_writes_its_file(tmp_path) -> None:
    book = PolicyBook(tmp_path)
    asyncio.run(book.replace("acme", "mode: enforce\n", "yaml"))
    asyncio.run(book.replace("acme", 'mode = "report"\n', "toml"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acme.toml"]
    fresh = PolicyBook(tmp_path)
    fresh.load()
    assert fresh.policy("acme").mode == "report"


def test_a_scanner_crash_fails_closed_under_an_enforcing_policy(tmp_path, monkeypatch, caplog):
    (tmp_path / "default.toml").write_text('mode = "enforce"\n')
    book = PolicyBook(tmp_path)
    book.load()

    def broken(context):
        raise RuntimeError("boom")

    broken._checks = ["Call"]
    monkeypatch.setitem(scan._OWN_CHECKS, "SBX999", ("shell", broken))
    gate = Gate(book, Scanner(), desk=None)  # type: ignore[arg-type]
    decision = asyncio.run(gate.review("t", None, "python", "print(1)"))
    assert decision.action == "deny" and "could not be scanned" in decision.reasons[0]
    assert "refused (fail closed)" in caplog.text
    report = Gate(PolicyBook(tmp_path / "none"), gate.scanner, desk=None)  # type: ignore[arg-type]
    assert asyncio.run(report.review("t", None, "python", "print(1)")).action == "allow"


def test_a_policy_that_is_off_scans_nothing(tmp_path, monkeypatch) -> None:
    (tmp_path / "default.yaml").write_text("mode: off\n")
    book = PolicyBook(tmp_path)
    book.load()
    gate = Gate(book, Scanner(), desk=None)  # type: ignore[arg-type]
    monkeypatch.setattr(gate.scanner, "scan", lambda *a: pytest.fail("an off policy scanned"))
    decision = asyncio.run(gate.review("t", None, "python", "import os\nos.system('ls')"))
    assert (decision.action, decision.mode, decision.findings) == ("allow", "off", ())
    monkeypatch.undo()
    tightened = asyncio.run(gate.review("t", session_policy({"mode": "report"}), "python", "1"))
    assert tightened.mode == "report", "a session could not turn scanning on for itself"


def test_file_rules_are_read_checked_and_only_tightened() -> None:
    text = 'mode = "enforce"\n[files]\nmax_upload = "10m"\ndelete = "deny"\n'
    policy = Policy.parse(text, "toml")
    assert policy.files.refusal("upload", 11 * 2**20) and not policy.files.refusal("upload", 5)
    assert policy.files.refusal("delete", 0) and not policy.files.refusal("download", 2**40)
    tighter = policy.tighten(session_policy({"files": {"max_upload": "1m", "max_download": "5m"}}))
    assert (tighter.files.max_upload, tighter.files.max_download) == (2**20, 5 * 2**20)
    looser = policy.tighten(session_policy({"files": {"max_upload": "1g", "delete": "allow"}}))
    assert looser.files.max_upload == 10 * 2**20 and looser.files.delete == "deny"
    with pytest.raises(PolicyInvalid, match=r"line 3.*max_upload"):
        Policy.parse('mode = "enforce"\n[files]\nmax_upload = "lots"\n', "toml")


def test_egress_hold_waits_for_an_approver_and_report_mode_lets_hosts_through(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "default.toml").write_text(
        'mode = "enforce"\n[rules]\negress = "hold"\n'
    )

    async def scenario():
        store = Store(tmp_path / "gateway.sqlite3")
        await store.open()
        book = PolicyBook(tmp_path / "policies")
        book.load()
        desk = ApprovalDesk(store, 5, live=lambda session_id: True)
        gate = Gate(book, SCANNER, desk)
        owner, ended = Principal("t", token_id="gateway"), asyncio.Event()
        approver = Principal("t", approver=True, token_id="approver")
        answers = []
        for approve in (True, False):
            asking = asyncio.create_task(
                gate.approve_host("s1", "t", None, owner, ended, "pypi.org:443")
            )
            await asyncio.sleep(0.05)
            assert not asking.done(), "the first connection did not wait for an approver"
            (pending,) = desk.pending.values()
            assert pending.code == "CONNECT pypi.org:443" and pending.language == "egress"
            await desk.decide(pending.id, approver, approve, None)
            answers.append(await asking)
        report = Gate(PolicyBook(tmp_path / "none"), SCANNER, desk)
        answers.append(await report.approve_host("s1", "t", None, owner, ended, "x.org:443"))
        await store.close()
        return answers

    assert asyncio.run(scenario()) == [True, False, True]
