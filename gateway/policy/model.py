"""A policy: what each rule's findings lead to (allow, hold, deny), enforced or only reported.

Written as TOML or YAML::

    mode = "enforce"        # "report": record findings and decisions, hold nothing; "off": no scan
    [rules]                 # one action per rule: allow | hold | deny
    shell = "hold"
    network = "hold"
    delete = "hold"
    install = "hold"
    secrets = "deny"
    [[patterns]]            # for kernels other than Python (RE2 regular expressions)
    rule = "network"
    regex = '\\b(curl|wget)\\b'
    message = "fetches from the network"
    kernels = ["bash"]      # languages it applies to; omitted: all but Python
    [files]                 # the files API (deny only: a transfer does not wait for a person)
    max_upload = "100m"     # larger uploads are refused; omitted: no limit beyond the disk's
    max_download = "1g"     # larger downloads (and directory archives) are refused
    delete = "deny"         # allow | deny
    [tools]                 # tools sessions' code calls: the least each is held to
    "drop_*" = "deny"       # shell-style patterns of tool names; a session's rules only tighten
    "post_result" = "hold"
    [network]               # the most a session's network rules may allow (create and changes)
    allow = ["*.example.org", "203.0.113.0/24"]
    deny = ["secret.example.org"]   # added to every session's deny list

A malformed policy is refused with the line at fault. A session may send a
policy of its own at create; it can only tighten its tenant's (``tighten``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import GatewayError, PolicyInvalid
from ..hosts import NetworkPolicy
from ..limits import format_size, parse_size
from .scan import MAX_PATTERNS, RULES, Finding, Pattern

DEFAULT_FILE = Path(__file__).with_name("default.toml")
ACTIONS = ("allow", "hold", "deny")  # weakest first
MODES = ("off", "report", "enforce")  # weakest first; off: not even scanned
_KEYS = {"mode", "rules", "patterns", "files", "network", "tools"}
MAX_TOOL_RULES = 256
_FILE_KEYS = {"max_upload", "max_download", "delete"}
_PATTERN_KEYS = {"rule", "regex", "message", "kernels"}


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a policy says about one execute, and why."""

    action: str  # allow | hold | deny: what happens
    verdict: str  # what the rules say, even in report mode
    mode: str
    reasons: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "verdict": self.verdict,
            "mode": self.mode,
            "reasons": list(self.reasons),
            "findings": [f.to_json() for f in self.findings],
        }


@dataclasses.dataclass(frozen=True)
class FileRules:
    """What the files API may move: sizes in bytes (0: no limit), and deletions."""

    max_upload: int = 0
    max_download: int = 0
    delete: str = "allow"  # allow | deny

    def refusal(self, op: str, size: int) -> str | None:
        """Why ``op`` (upload, download, delete) of ``size`` bytes is refused, or None."""
        if op == "delete":
            return "the policy refuses deleting files" if self.delete == "deny" else None
        limit = self.max_upload if op == "upload" else self.max_download
        if limit and size > limit:
            return f"the policy refuses {op}s over {format_size(limit)} ({format_size(size)})"
        return None

    def tighten(self, other: FileRules) -> FileRules:
        def smaller(a: int, b: int) -> int:
            return min(a, b) if a and b else a or b

        return FileRules(
            smaller(self.max_upload, other.max_upload),
            smaller(self.max_download, other.max_download),
            "deny" if "deny" in (self.delete, other.delete) else "allow",
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Policy:
    mode: str = "report"
    rules: Mapping[str, str] = dataclasses.field(default_factory=dict)
    patterns: tuple[Pattern, ...] = ()
    source: str = ""  # the text it was read from, given back by the API as it was written
    files: FileRules = dataclasses.field(default_factory=FileRules)
    # Ceilings on sessions' network rules: each must cover them (a tightened policy has more).
    network: tuple[NetworkPolicy, ...] = ()
    # Tools sessions' code calls: a pattern of tool names -> the least action their calls get.
    tools: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def action(self, rule: str) -> str:
        return self.rules.get(rule, "allow")

    def tool_action(self, tool: str) -> tuple[str, str | None]:
        """The strictest action the ``tools`` table gives ``tool``, and the pattern that did."""
        found, by = "allow", None
        for pattern, action in self.tools.items():
            if fnmatch.fnmatchcase(tool, pattern) and ACTIONS.index(action) > ACTIONS.index(found):
                found, by = action, pattern
        return found, by

    @property
    def enforcing(self) -> bool:
        return self.mode == "enforce"

    @property
    def scans(self) -> bool:
        return self.mode != "off"

    def decide(self, findings: Iterable[Finding]) -> Decision:
        """The strictest action any finding calls for; in report mode, nothing is held."""
        findings = tuple(findings)
        verdict, reasons = "allow", []
        for finding in findings:
            action = self.action(finding.rule)
            if action != "allow":
                reasons.append(f"line {finding.line}: {finding.rule}: {finding.message}")
                verdict = max(verdict, action, key=ACTIONS.index)
        action = verdict if self.enforcing else "allow"
        return Decision(action, verdict, self.mode, tuple(dict.fromkeys(reasons)), findings)

    def failed_scan(self, error: str) -> Decision:
        """A broken scan: an enforcing policy refuses the code (fail closed); a report notes it."""
        reason = f"the code could not be scanned ({error}), so it may not run unscanned"
        return Decision("deny" if self.enforcing else "allow", "deny", self.mode, (reason,))

    def tighten(self, other: Policy | None) -> Policy:
        """This policy made at least as strict as ``other`` on every point; never looser."""
        if other is None:
            return self
        rules = {
            rule: max(self.action(rule), other.action(rule), key=ACTIONS.index) for rule in RULES
        }
        mode = max(self.mode, other.mode, key=MODES.index)
        files = self.files.tighten(other.files)
        patterns, network = self.patterns + other.patterns, self.network + other.network
        tools = dict(self.tools)
        for pattern, action in other.tools.items():
            tools[pattern] = max(tools.get(pattern, "allow"), action, key=ACTIONS.index)
        return Policy(mode, rules, patterns, self.source, files, network, tools)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "rules": {rule: self.action(rule) for rule in RULES},
            "patterns": [
                {
                    "rule": p.rule,
                    "regex": p.regex,
                    "message": p.message,
                    "kernels": list(p.kernels),
                }
                for p in self.patterns
            ],
            "files": self.files.to_json(),
            **({"network": [c.to_json() for c in self.network]} if self.network else {}),
            **({"tools": dict(self.tools)} if self.tools else {}),
        }

    # -- reading ----------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str, fmt: str, name: str = "policy") -> Policy:
        """Read a policy from TOML or YAML text; errors name ``name`` and the line at fault."""
        if fmt == "toml":
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise PolicyInvalid(f"{name}: not valid TOML: {e}") from None
        elif fmt == "yaml":
            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" at line {mark.line + 1}" if mark is not None else ""
                problem = getattr(e, "problem", None) or str(e)
                raise PolicyInvalid(f"{name}: not valid YAML{where}: {problem}") from None
        else:
            raise PolicyInvalid(f"{name}: a policy is TOML or YAML, not {fmt!r}")
        try:
            policy = cls.from_mapping(data)
        except _Fault as e:
            line = _line_of(text, e.key, e.value)
            where = f" at line {line}" if line else ""
            raise PolicyInvalid(f"{name}{where}: {e.message}") from None
        return dataclasses.replace(policy, source=text)

    @classmethod
    def from_mapping(cls, data: Any) -> Policy:
        """A policy from parsed data (a file's, or a session's JSON); raises _Fault."""
        if not isinstance(data, Mapping):
            raise _Fault("", None, "a policy is a table of mode, rules and patterns")
        for key in data:
            if key not in _KEYS:
                raise _Fault(key, None, f"unknown key {key!r}; a policy has {sorted(_KEYS)}")
        mode = data.get("mode", "report")
        if mode is False:  # YAML 1.1 reads a bare `off` as false
            mode = "off"
        if mode not in MODES:
            raise _Fault("mode", mode, f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        rules = data.get("rules", {})
        if not isinstance(rules, Mapping):
            raise _Fault("rules", None, "rules is a table of rule = action")
        for rule, action in rules.items():
            if rule not in RULES:
                raise _Fault(rule, None, f"unknown rule {rule!r}; rules are {', '.join(RULES)}")
            if action not in ACTIONS:
                raise _Fault(
                    rule, action, f"{rule} must be one of {', '.join(ACTIONS)}, not {action!r}"
                )
        patterns = data.get("patterns", [])
        if not isinstance(patterns, list):
            raise _Fault("patterns", None, "patterns is a list of tables")
        if len(patterns) > MAX_PATTERNS:
            raise _Fault(
                "patterns",
                None,
                f"a policy has at most {MAX_PATTERNS} patterns, not {len(patterns)}",
            )
        files = _file_rules(data.get("files", {}))
        network = () if "network" not in data else (_network(data["network"]),)
        patterns = tuple(_pattern(p) for p in patterns)
        tools = _tool_rules(data.get("tools", {}))
        return cls(mode, dict(rules), patterns, files=files, network=network, tools=tools)


def session_policy(data: Any) -> Policy | None:
    """A policy a session asks for at create (JSON); it can only tighten its tenant's."""
    if data is None:
        return None
    try:
        return Policy.from_mapping(data)
    except _Fault as e:
        raise PolicyInvalid(f"policy: {e.message}") from None


class _Fault(Exception):
    """A policy is wrong at ``key`` (with ``value``); the text is searched for its line."""

    def __init__(self, key: str, value: Any, message: str) -> None:
        super().__init__(message)
        self.key, self.value, self.message = key, value, message


def _network(entry: Any) -> NetworkPolicy:
    if not isinstance(entry, Mapping) or "allow" not in entry:
        raise _Fault("network", None, "network is a table of allow (and deny) lists")
    try:
        return NetworkPolicy.parse(dict(entry))
    except GatewayError as e:
        bad = next(
            (k for k in ("deny", "allow") if k in entry and repr(entry[k]) in e.message), "allow"
        )
        raise _Fault(bad, None, e.message) from None


def _tool_rules(entry: Any) -> dict[str, str]:
    if not isinstance(entry, Mapping) or len(entry) > MAX_TOOL_RULES:
        raise _Fault("tools", None, f"tools is a table of at most {MAX_TOOL_RULES} tool = action")
    for pattern, action in entry.items():
        if not isinstance(pattern, str) or not 0 < len(pattern) <= 128:
            raise _Fault("tools", None, "a tool pattern is a name of 1 to 128 characters")
        if action not in ACTIONS:
            raise _Fault(
                pattern,
                action,
                f"tool {pattern} must be one of {', '.join(ACTIONS)}, not {action!r}",
            )
    return dict(entry)


def _file_rules(entry: Any) -> FileRules:
    if not isinstance(entry, Mapping):
        raise _Fault("files", None, "files is a table of max_upload, max_download, delete")
    for key in entry:
        if key not in _FILE_KEYS:
            raise _Fault(key, None, f"unknown files key {key!r}; use {sorted(_FILE_KEYS)}")
    sizes = {}
    for key in ("max_upload", "max_download"):
        try:
            sizes[key] = parse_size(entry.get(key, 0), key)
        except GatewayError as e:
            raise _Fault(key, entry.get(key), e.message) from None
    delete = entry.get("delete", "allow")
    if delete not in ("allow", "deny"):
        raise _Fault("delete", delete, f"delete must be allow or deny, not {delete!r}")
    return FileRules(sizes["max_upload"], sizes["max_download"], delete)


def _pattern(entry: Any) -> Pattern:
    if not isinstance(entry, Mapping):
        raise _Fault("patterns", None, "a pattern is a table of rule, regex, message, kernels")
    for key in entry:
        if key not in _PATTERN_KEYS:
            raise _Fault(key, None, f"unknown pattern key {key!r}; use {sorted(_PATTERN_KEYS)}")
    rule = entry.get("rule")
    if rule not in RULES:
        raise _Fault("rule", rule, f"a pattern's rule must be one of {', '.join(RULES)}")
    regex = entry.get("regex")
    if not isinstance(regex, str):
        raise _Fault("regex", None, "a pattern needs a regex (a string)")
    kernels = entry.get("kernels", [])
    if not isinstance(kernels, list) or not all(isinstance(k, str) for k in kernels):
        raise _Fault("kernels", None, "kernels is a list of language names such as 'bash'")
    message = str(entry.get("message") or f"matches {regex!r}")
    try:
        return Pattern(rule, regex, message, tuple(kernels))
    except ValueError as e:
        raise _Fault("regex", regex, str(e)) from None


def _line_of(text: str, key: str, value: Any) -> int | None:
    """The line where ``key`` (best: with ``value``) is written, counting from 1."""
    if not key:
        return None
    written = re.compile(rf"(^|[\s{{,-])[\"']?{re.escape(key)}[\"']?\s*[=:]")
    candidates = [n for n, line in enumerate(text.splitlines(), 1) if written.search(line)]
    if value is not None:
        lines = text.splitlines()
        exact = [n for n in candidates if str(value) in lines[n - 1]]
        candidates = exact or candidates
    return candidates[0] if candidates else None


def default_policy() -> Policy:
    """The built-in policy: every rule judged, nothing held (report mode); docs/approvals.md."""
    return Policy.parse(DEFAULT_FILE.read_text(), "toml", str(DEFAULT_FILE))
