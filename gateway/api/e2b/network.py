"""E2B's network options (``allow_internet_access``, ``network.allowOut``/``denyOut``,
``network.rules``) as the gateway's allow and deny lists and brokered credentials, for
create and ``update_network`` (``control``'s handlers).

E2B allows everything unless ``deny_out`` says otherwise, and lets an
``allow_out`` entry win over a ``deny_out`` one; the gateway allows what its
list names and lets deny win. So ``deny_out: [0.0.0.0/0]`` (or
``allow_internet_access: false``) is an allow list of ``allow_out``, anything
else is ``public`` minus ``deny_out``, and an ``allow_out`` entry inside a
``deny_out`` one is refused rather than silently denied.
"""

from __future__ import annotations

import re
from typing import Any

from ...egress.credentials import SECRET_NAME, VALUE, Credential
from ...errors import BadRequest, NotSupported
from ...hosts import PUBLIC, NetworkPolicy, Rule

ALL_TRAFFIC = "0.0.0.0/0"
# What E2B's network object may carry that has no meaning here (the proxy resolves names;
# previews are reached with the session's token or a signed link).
_IGNORED = {"dnsServers", "allowPublicTraffic", "maskRequestHost", "httpsPorts"}
_FILL = re.compile(r"\$\{e2b\.secrets\.([^}]*)\}")  # what E2B's Secret.fill(name) writes


def network_of(network: Any, internet: bool | None) -> NetworkPolicy | None:
    """The policy E2B's options ask for; None when they ask for nothing (the default)."""
    if network is None and internet is None:
        return None
    network = {} if network is None else network
    if not isinstance(network, dict):
        raise BadRequest("network must be an object of allowOut, denyOut and rules")
    if network.get("egressProxy") is not None:
        raise NotSupported("network.egress_proxy is not offered: sandboxes leave through the "
                           "gateway's own egress proxy")  # fmt: skip
    credentials_of(network)  # checked here too, so a bad rule is refused before anything
    unknown = set(network) - {"allowOut", "denyOut", "rules", "egressProxy", *_IGNORED}
    if unknown:
        raise BadRequest(f"unknown network fields {sorted(unknown)}")
    allow, deny = (_listed(network, key) for key in ("allowOut", "denyOut"))
    allow_all = ALL_TRAFFIC in allow
    allow = [a for a in allow if a != ALL_TRAFFIC]
    if (internet is False or ALL_TRAFFIC in deny) and not allow_all:
        return NetworkPolicy.parse({"allow": allow})
    named = NetworkPolicy.parse({"allow": allow, "deny": [] if allow_all else deny})
    for entry in named.rules or ():
        covering = next((d for d in named.deny if entry.within(d)), None)
        if covering is not None:
            raise BadRequest(
                f"allow_out entry {entry.text!r} lies inside deny_out entry {covering.text!r}: "
                "here a deny entry wins, so drop one of them"
            )
    return NetworkPolicy((Rule.parse(PUBLIC),), named.deny)


def credentials_of(network: Any) -> tuple[Credential, ...]:
    """E2B's ``network.rules`` (per host, ``transform.headers`` whose values hold one
    ``Secret.fill(name)`` placeholder) as credentials the egress proxy brokers."""
    rules = (network or {}).get("rules") if isinstance(network, dict) else None
    if not rules:
        return ()
    if not isinstance(rules, dict):
        raise BadRequest("network.rules must be an object of host -> rules")
    found = []
    for host, entries in rules.items():
        if not isinstance(entries, list):
            raise BadRequest(f"network.rules[{host!r}] must be a list of rules")
        for entry in entries:
            transform = entry.get("transform") if isinstance(entry, dict) else None
            if not isinstance(transform, dict) or set(transform) - {"headers"}:
                raise NotSupported("network.rules transforms may set only headers here")
            for header, value in (transform.get("headers") or {}).items():
                found.append(_credential(host, header, value))
    return tuple(found)


def _credential(host: str, header: str, value: Any) -> Credential:
    if isinstance(value, str) and "${e2b.iam." in value:
        raise NotSupported("workload identity (iam) tokens are not offered; use Secret.fill")
    names = _FILL.findall(value) if isinstance(value, str) else []
    if len(names) != 1 or VALUE in value:
        raise BadRequest(
            f"the header {header!r} for {host!r} must hold one Secret.fill(name) placeholder "
            "(the proxy adds the secret's value; static headers are not added)"
        )
    if not SECRET_NAME.fullmatch(names[0]):
        raise BadRequest(
            f"secret name {names[0]!r}: this gateway's secrets are named with letters, digits "
            "and _ (an environment variable's name), e.g. GH_TOKEN"
        )
    template = _FILL.sub(VALUE, value)
    return Credential.parse({"secret": names[0], "hosts": [host], "header": header,
                             "format": template})  # fmt: skip


def internet_access(body: dict[str, Any]) -> bool | None:
    """E2B's ``allow_internet_access``, checked."""
    internet = body.get("allow_internet_access")
    if not isinstance(internet, bool | None):
        raise BadRequest("allow_internet_access must be true or false")
    return internet


def _listed(network: dict[str, Any], key: str) -> list[str]:
    value = network.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"network.{key} must be a list of host names, IPs or CIDRs")
    return value
