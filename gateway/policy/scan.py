"""Code scanned before its kernel sees it: bandit's checks for Python, patterns for the rest.

Python is read as an AST by bandit (its plugins and blacklists, plus the
gateway's own checks written as bandit plugins), so a finding names a line
and what was recognised, not a guess from text. IPython syntax (``!cmd``,
``%pip``, ``%%bash``) is first turned into the Python the kernel would run.
Comments such as ``# nosec`` are ignored: the code's author is the one being
checked. Other kernels' code is matched against the policy's patterns, with
RE2: a linear-time matcher (no backtracking), which leaves Python's lock while
it runs. Patterns are bounded in length and program size when a policy is read,
and a scan in the product of cell size and program size, so a tenant's pattern
costs a bounded scan, never a stalled gateway.

Every finding belongs to one *rule* (``shell``, ``network``, ``delete``,
``install``, ``secrets``), and policies decide per rule.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import posixpath
from collections.abc import Iterable
from typing import Any

import re2
from bandit.blacklists.utils import build_conf_dict
from bandit.core import config as bandit_config
from bandit.core import issue, meta_ast, metrics, node_visitor, test_set, tester
from bandit.core.test_properties import checks, test_id
from IPython.core.inputtransformer2 import TransformerManager

log = logging.getLogger(__name__)
# bandit logs every AST node it visits at debug level: far too much for a gateway's debug log.
logging.getLogger("bandit").setLevel(logging.WARNING)

RULES = ("shell", "network", "delete", "install", "secrets", "egress")  # egress: at the proxy
WORKSPACE = "/workspace"  # the kernel's working directory in every image

# bandit's own checks, by the rule they serve.
_BANDIT = {
    "B404": "shell",  # import subprocess
    "B602": "shell",  # subprocess with shell=True
    "B603": "shell",  # subprocess without a shell
    "B604": "shell",  # any call with shell=True
    "B605": "shell",  # os.system, os.popen, ...
    "B606": "shell",  # os.exec*, os.spawn*
    "B607": "shell",  # a process started by a partial path
    "B401": "network",  # import telnetlib
    "B402": "network",  # import ftplib
    "B310": "network",  # urllib.request.urlopen and friends
    "B321": "network",  # ftplib calls
}

_NETWORK_MODULES = (
    "socket", "ssl", "requests", "httpx", "urllib.request", "urllib3", "http.client",
    "aiohttp", "smtplib", "poplib", "imaplib", "paramiko", "websocket", "websockets",
    "asyncssh", "pycurl", "xmlrpc.client",
)  # fmt: skip
_SHELL_MODULES = ("pty", "pexpect", "plumbum")  # prefixes: "sh" would match shutil
_INSTALL_MODULES = ("pip.", "conda", "ensurepip")  # "pip" alone would match pipes

# The gateway's blacklist entries (bandit's blacklist mechanism: imports by prefix).
_BLACKLIST = {
    "Import": [
        build_conf_dict("network_module", "SBX101", None, list(_NETWORK_MODULES),
                        "imports the network library {name}"),
        build_conf_dict("shell_module", "SBX102", None, list(_SHELL_MODULES),
                        "imports {name}, which runs shell commands"),
        build_conf_dict("install_module", "SBX103", None, list(_INSTALL_MODULES),
                        "imports {name}, a package installer"),
    ],
}  # fmt: skip
_BLACKLIST["ImportFrom"] = _BLACKLIST["Import"]
_BLACKLIST_RULES = {"SBX101": "network", "SBX102": "shell", "SBX103": "install"}

_DELETERS = frozenset(
    ("os.remove", "os.unlink", "os.rmdir", "os.removedirs", "shutil.rmtree", "shutil.move")
)
_OPENERS = frozenset(("open", "io.open", "builtins.open", "os.open", "pathlib.Path", "Path"))
_SECRET_PATHS = (
    "/.ssh/", "/.aws/", "/.config/gcloud", "/.kube/", "/.docker/config.json", "/.netrc",
    "/.git-credentials", "/.pgpass", "/etc/shadow", "/etc/gshadow", "/run/secrets",
    "/var/run/secrets", "/proc/self/environ", "id_rsa", "id_ed25519", ".pem",
)  # fmt: skip
_SECRET_NAMES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "CREDENTIAL", "PRIVATE_KEY")
_INSTALL_WORDS = (("pip", "install"), ("pip3", "install"), ("conda", "install"),
                  ("mamba", "install"), ("apt-get", "install"), ("apt", "install"),
                  ("npm", "install"), ("uv", "pip"))  # fmt: skip
_SHELL_MAGICS = frozenset(("bash", "sh", "script", "system", "sx", "perl", "ruby"))
_INSTALL_MAGICS = frozenset(("pip", "conda", "mamba", "uv"))

# Bounds on a policy's patterns, so matching them costs a bounded time whoever wrote them.
MAX_PATTERNS = 32  # per policy (a session's add up with its tenant's)
MAX_PATTERN_CHARS = 1000
MAX_PATTERN_PROGRAM = 300  # RE2 instructions; the built-in patterns take 43 to 106
# bytes x instructions the first search of each pattern may take in one scan (about 1.5 s
# at RE2's slowest, its NFA, without Python's lock); as much again for later lines' matches.
MATCH_BUDGET = 2**28
MAX_FINDINGS = 20  # per pattern: the first match on each line, up to this many
_RE2 = re2.Options()
_RE2.log_errors = False  # a refused pattern is the caller's error, not a line on stderr


class ScanFailed(Exception):
    """The scanner itself broke: under an enforcing policy the code must not run."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing a check recognised, at a line of the cell."""

    rule: str
    check: str  # bandit's test id (B602) or the gateway's (SBX2xx), or the pattern's name
    line: int
    message: str
    severity: str = "MEDIUM"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A policy's pattern for a non-Python kernel: a regular expression (RE2) and its rule.

    Raises ValueError, saying why, for a regex RE2 refuses or one past the bounds.
    """

    rule: str
    regex: str  # as written; matched per line (^ and $ at line ends)
    message: str
    kernels: tuple[str, ...] = ()  # kernel languages it applies to; empty: every one
    compiled: Any = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.regex) > MAX_PATTERN_CHARS:
            raise ValueError(
                f"the regex {self.regex[:60]!r}... is longer than {MAX_PATTERN_CHARS} characters"
            )
        try:
            compiled = re2.compile(f"(?m){self.regex}", _RE2)
        except re2.error as e:
            why = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
            raise ValueError(
                f"the regex {self.regex!r} is not valid RE2 syntax ({why}); patterns are matched "
                "in linear time, so backreferences and lookaround are not available"
            ) from None
        if compiled.programsize > MAX_PATTERN_PROGRAM:
            raise ValueError(
                f"the regex {self.regex!r} is too complex ({compiled.programsize} RE2 "
                f"instructions, at most {MAX_PATTERN_PROGRAM}): use fewer or smaller repetitions"
            )
        object.__setattr__(self, "compiled", compiled)

    def applies(self, language: str) -> bool:
        return not self.kernels or language in self.kernels


# -- the gateway's own checks, as bandit plugins ------------------------------------------


def _literal_strings(node: ast.AST) -> Iterable[str]:
    """Every string constant in an expression (a command list, a joined path)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


def _issue(text: str, severity: str = "HIGH") -> issue.Issue:
    return issue.Issue(severity=severity, confidence="HIGH", text=text)


def _outside_workspace(path: str) -> bool:
    if not path.startswith("/") and not path.startswith("~"):
        path = posixpath.join(WORKSPACE, path)
    normal = posixpath.normpath(path)
    return normal != WORKSPACE and not normal.startswith(WORKSPACE + "/")


@checks("Call")
@test_id("SBX201")
def delete_outside_workspace(context: Any) -> issue.Issue | None:
    """os.remove / shutil.rmtree and the like on a literal path outside the workspace."""
    if context.call_function_name_qual not in _DELETERS or not context.node.args:
        return None
    first = context.node.args[0]
    for path in _literal_strings(first):
        if _outside_workspace(path):
            name = context.call_function_name_qual
            return _issue(f"{name} deletes {path!r}, outside {WORKSPACE}")
    return None


@checks("Call")
@test_id("SBX202")
def package_install(context: Any) -> issue.Issue | None:
    """A package installer run as a command, a magic, or a module."""
    name = context.call_function_name_qual or ""
    node = context.node
    words = [w for s in (s for a in node.args for s in _literal_strings(a)) for w in s.split()]
    if name.endswith("run_line_magic") or name.endswith("run_cell_magic"):
        magic = words[0].lstrip("%") if words else ""
        if magic in _INSTALL_MAGICS:
            return _issue(f"installs packages with %{magic}")
        return None
    if name in ("pip.main", "pip._internal.main", "runpy.run_module"):
        if name != "runpy.run_module" or words[:1] == ["pip"]:
            return _issue("runs pip from Python to install packages")
    for tool, verb in _INSTALL_WORDS:
        for i, word in enumerate(words[:-1]):
            if posixpath.basename(word) == tool and verb in words[i + 1 : i + 3]:
                return _issue(f"runs '{tool} {verb}' to install packages")
    return None


@checks("Call")
@test_id("SBX203")
def shell_magic(context: Any) -> issue.Issue | None:
    """IPython's ``!cmd``, ``%%bash`` and ``%system``: a shell, through the kernel."""
    node = context.node
    if not isinstance(node.func, ast.Attribute):
        return None
    attr = node.func.attr
    if attr in ("system", "getoutput") and "get_ipython" in ast.unparse(node.func.value):
        return _issue("runs a shell command (IPython '!')")
    if attr in ("run_line_magic", "run_cell_magic") and node.args:
        magic = next(iter(_literal_strings(node.args[0])), "").lstrip("%")
        if magic in _SHELL_MAGICS:
            return _issue(f"runs a shell through the %{magic} magic")
    return None


@checks("Call", "Subscript")
@test_id("SBX204")
def secrets_access(context: Any) -> issue.Issue | None:
    """Reading a credentials file, or an environment variable named like a secret."""
    node = context.node
    if isinstance(node, ast.Subscript):
        target = ast.unparse(node.value)
        if target in ("os.environ", "environ"):
            return _secret_name(node.slice)
        return None
    name = context.call_function_name_qual or ""
    if name in ("os.getenv", "os.environ.get", "environ.get", "os.environ.pop") and node.args:
        return _secret_name(node.args[0])
    if name in _OPENERS or name.endswith((".read_text", ".read_bytes", ".open")):
        for text in (s for a in [*node.args, node.func] for s in _literal_strings(a)):
            if any(marker in posixpath.expanduser(text) or marker in text
                   for marker in _SECRET_PATHS):  # fmt: skip
                return _issue(f"reads {text!r}, a credentials file")
    return None


def _secret_name(node: ast.AST) -> issue.Issue | None:
    for text in _literal_strings(node):
        if any(word in text.upper() for word in _SECRET_NAMES):
            return _issue(f"reads the environment variable {text!r}, named like a secret")
    return None


_OWN_CHECKS = {
    "SBX201": ("delete", delete_outside_workspace),
    "SBX202": ("install", package_install),
    "SBX203": ("shell", shell_magic),
    "SBX204": ("secrets", secrets_access),
}
_RULE_OF = {**_BANDIT, **_BLACKLIST_RULES, **{k: v[0] for k, v in _OWN_CHECKS.items()}}


# -- running bandit on one cell -----------------------------------------------------------


class _Tester(tester.BanditTester):
    """bandit's tester, except that a check that breaks breaks the scan (fail closed)."""

    @staticmethod
    def report_error(test: Any, context: Any, error: Exception) -> None:
        raise ScanFailed(f"the check {test} failed: {error}") from error


class _Visitor(node_visitor.BanditNodeVisitor):
    def __init__(self, tests: test_set.BanditTestSet) -> None:
        # No nosec lines: a '# nosec' in the cell must not silence a check.
        super().__init__("cell/cell.py", None, meta_ast.BanditMetaAst(), tests, False, {},
                         metrics.Metrics())  # fmt: skip
        self.tester = _Tester(tests, False, {}, self.metrics)


class Scanner:
    """Scans a cell of code; built once, used for every execute (scanning is ~50 µs)."""

    def __init__(self) -> None:
        profile = {"include": sorted(_BANDIT), "blacklist": {}}
        self._tests = test_set.BanditTestSet(bandit_config.BanditConfig(), profile)
        blacklist = {**_BLACKLIST, "Call": []}
        for node in ("Import", "ImportFrom"):
            self._tests.tests.setdefault(node, [])
        own_blacklist = _blacklist_plugin(blacklist)
        for node in blacklist:
            if node != "Call":
                self._tests.tests[node].append(own_blacklist)
        for _, check in _OWN_CHECKS.values():
            for node in check._checks:
                self._tests.tests.setdefault(node, []).append(check)
        self._ipython = TransformerManager()
        # The node types some check looks at; a cell with none of them has no findings.
        self._tested = tuple(getattr(ast, node) for node in self._tests.tests)

    def scan(self, code: str, language: str, patterns: Iterable[Pattern] = ()) -> list[Finding]:
        """Findings in ``code`` for a kernel of ``language``; raise ScanFailed if a check broke."""
        try:
            if language == "python":
                return self._scan_python(code)
            return _match(code, language, patterns)
        except ScanFailed:
            raise
        except Exception as e:  # a scanner fault is never a reason to let code through
            raise ScanFailed(f"{type(e).__name__}: {e}") from e

    @staticmethod
    def matches(language: str, patterns: Iterable[Pattern]) -> bool:
        """Whether ``scan`` matches any of ``patterns`` (never for Python) on ``language``."""
        return language != "python" and any(p.applies(language) for p in patterns)

    def _scan_python(self, code: str) -> list[Finding]:
        try:
            tree_source = code
            tree = ast.parse(code)
        except SyntaxError:
            tree_source = self._ipython.transform_cell(code)  # IPython syntax, as the kernel does
            try:
                tree = ast.parse(tree_source)
            except SyntaxError:
                return []  # the kernel refuses it too: nothing of it runs
        if not any(isinstance(node, self._tested) for node in ast.walk(tree)):
            return []  # bandit would visit it all and find nothing (`1 + 1`, `df`)
        visitor = _Visitor(self._tests)
        visitor.process(tree_source)
        findings = {
            Finding(_RULE_OF[r.test_id], r.test_id, r.lineno, r.text, r.severity)
            for r in visitor.tester.results
            if r.test_id in _RULE_OF
        }
        return sorted(findings, key=lambda f: (f.line, f.check))


def _blacklist_plugin(data: dict[str, list[dict[str, Any]]]) -> Any:
    """bandit's generic blacklist check, carrying the gateway's entries as its config."""
    from bandit.core import blacklisting

    def blacklist(context: Any, config: Any = data) -> issue.Issue | None:
        return blacklisting.blacklist(context, config)

    blacklist._test_id = "SBX100"  # type: ignore[attr-defined]
    blacklist._checks = list(data)  # type: ignore[attr-defined]
    return blacklist


def _match(code: str, language: str, patterns: Iterable[Pattern]) -> list[Finding]:
    """The first match of each pattern on each line, up to MAX_FINDINGS a pattern.

    A search costs at most the rest of the cell times the pattern's program: each
    pattern's first search together within MATCH_BUDGET or the scan is refused
    before it starts; the searches for more lines within another MATCH_BUDGET.
    """
    applying = [p for p in patterns if p.applies(language)]
    data = code.encode("utf-8", "surrogatepass")
    if len(data) * sum(p.compiled.programsize for p in applying) > MATCH_BUDGET:
        raise ScanFailed(
            f"the cell ({len(data)} bytes) is too large to match against the policy's "
            f"{len(applying)} patterns in bounded time; split it into smaller cells"
        )
    findings, more = [], MATCH_BUDGET  # what searches past each pattern's first may cost
    for pattern in applying:
        start = line = counted = 0
        for n in range(MAX_FINDINGS):
            if n:
                more -= (len(data) - start) * pattern.compiled.programsize
                if more < 0:
                    break
            found = pattern.compiled.search(data, start)
            if found is None:
                break
            line += data.count(b"\n", counted, found.start())
            counted = found.start()
            findings.append(Finding(pattern.rule, "pattern", line + 1, pattern.message))
            start = data.find(b"\n", found.start()) + 1
            if not start:
                break
    return sorted(findings, key=lambda f: f.line)
