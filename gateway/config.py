"""The one settings object: defaults < config file < ``SBX_*`` env < CLI flags.

Every option is a dataclass field whose ``help`` doubles as CLI help, so the
flag list, env names and file keys can never drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import BadRequest, GatewayError
from .limits import Limits, parse_size
from .sandbox.egress.policy import IPNetwork, Rule, parse_ranges
from .sandbox.isolation import seccomp
from .sandbox.isolation.runtimes import RUNTIMES

ROOT = Path(__file__).resolve().parent.parent


def _opt(default: Any, help: str, **kw: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **kw})


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "sandbox-gateway")


class ConfigError(GatewayError):
    code = "config_error"


@dataclasses.dataclass
class Settings:
    """Gateway configuration, validated at load time.

    Nothing assigns a field after construction, so derived values (sizes in
    bytes, parsed lists) are worked out once: some are read on every request.
    """

    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8765, "port to listen on (0 picks a free one)")
    auth: str = _opt(
        "token",
        "'token' (callers need an API token) or 'none' (no authentication: only for a "
        "single user on this machine; the gateway warns loudly)",
    )
    tokens_file: str = _opt("", "TOML file of API tokens, their tenants and tenant quotas")
    token_tenant: str = _opt("default", "tenant of the single `token` (and of a generated one)")
    tenant_max_sessions: int = _opt(32, "live sessions one tenant may hold at once")
    tenant_max_memory: str = _opt("16g", "memory limits one tenant's live sessions may add up to")
    max_request_body: str = _opt("16m", "largest JSON request body (uploads stream separately)")
    max_code_size: str = _opt("2m", "largest code of one execute")
    max_anonymous_body: str = _opt(
        "64k",
        "largest request body of a caller without a valid API token; a bigger one is "
        "refused with 401 from its headers, unread",
    )
    max_header_size: str = _opt("64k", "largest request line plus headers")
    idle_connection_timeout: float = _opt(
        60.0, "seconds a connection may sit idle, or take to send a request's headers"
    )
    body_timeout: float = _opt(
        10.0,
        "seconds a caller without a valid API token gets to send its request body "
        "(authenticated bodies and uploads are not timed)",
    )
    loop_lag_warning: float = _opt(
        0.5, "log a warning when the event loop stalls for longer than this many seconds"
    )
    cors_origins: str = _opt(
        "", "comma-separated browser origins allowed to call the API (CORS); off when empty"
    )
    data_dir: str = _opt("", "where the SQLite store and session directories live")
    kernels_dir: str = _opt(str(ROOT / "kernels"), "directory of kernelspecs offered")
    images_dir: str = _opt(str(ROOT / "images"), "directory of kernel image Dockerfiles")
    base_image: str = _opt(
        "debian:bookworm-slim", "base image for kernel images (debootstrapped if not pullable)"
    )
    default_images: str = _opt(
        "python", "comma-separated images `sbx images build` builds when given no names"
    )
    max_sessions: int = _opt(64, "live sessions allowed at once, server-wide")
    pool: str = _opt(
        "python3=2",
        "warm pool: ready kernels kept per kernelspec, e.g. 'python3=2,bash=1' ('' for none); "
        "they count against max_sessions",
    )
    pool_refill_concurrency: int = _opt(1, "pooled kernels started at once while refilling")
    default_ttl: float = _opt(3600.0, "session lifetime in seconds when none is asked for")
    max_ttl: float = _opt(86400.0, "longest lifetime a session may ask for")
    default_idle_timeout: float = _opt(600.0, "seconds without activity before a session ends")
    max_idle_timeout: float = _opt(86400.0, "longest idle timeout a session may ask for")
    default_memory: str = _opt("512m", "memory limit per session (swap is not allowed)")
    max_memory: str = _opt("8g", "largest memory limit a session may ask for")
    default_cpus: float = _opt(1.0, "CPU quota per session, in cores")
    max_cpus: float = _opt(4.0, "largest CPU quota a session may ask for")
    default_pids: int = _opt(256, "process/thread limit per session")
    max_pids: int = _opt(4096, "largest pids limit a session may ask for")
    default_disk: str = _opt("1g", "size of a session's writable workspace")
    max_disk: str = _opt("20g", "largest workspace a session may ask for")
    default_timeout: float = _opt(60.0, "execution timeout in seconds")
    max_timeout: float = _opt(3600.0, "longest execution timeout a client may ask for")
    default_output_bytes: str = _opt("1m", "output kept per execution; the rest is cut")
    max_output_bytes: str = _opt("64m", "largest output cap a session may ask for")
    tmp_size: str = _opt("64m", "size of the in-memory /tmp of each kernel container")
    runtimes: str = _opt(
        "runc,gvisor",
        "container runtimes sessions may ask for (runc, gvisor), comma-separated; a "
        "kernelspec's metadata.sandbox.runtimes narrows it per kernel",
    )
    default_runtime: str = _opt("runc", "runtime of sessions that ask for none")
    network_policies: str = _opt(
        "none,allowlist", "network policies sessions may ask for (none, allowlist)"
    )
    egress_network: str = _opt(
        "sbx-egress",
        "internal Docker network (and bridge device) of allowlist sessions, shared by "
        "this host's gateways",
    )
    egress_proxy_ports: str = _opt(
        "47000-47099",
        "host ports the egress proxy may listen on; the firewall lets sandboxes reach only these",
    )
    egress_allow_ranges: str = _opt(
        "",
        "CIDRs allowlists may reach although private, loopback, link-local or this host "
        "(comma-separated; the gateway's own ports stay unreachable); empty: none",
    )
    egress_always_allow: str = _opt(
        "",
        "allowlist entries every allowlist session gets, e.g. your package index host "
        "(comma-separated)",
    )
    seccomp_profile: str = _opt(
        "gateway",
        "seccomp profile for runc kernels: 'gateway' (the gateway's own, "
        "gateway/sandbox/isolation/seccomp.py: no ptrace, namespaces, keyrings, bpf, io_uring, "
        "...), 'docker-default' (the engine's default), or a file in Docker's JSON format "
        "(docs/SECURITY.md); gVisor ignores it",
    )
    placement: str = _opt(
        "docker",
        "where kernels run: 'docker' (containers on this host's engine) or 'swarm' (one-task "
        "services on any node of the Docker Swarm whose manager the engine API reaches; the "
        "gateway then runs as a container on swarm_network: docs/SCALING.md)",
    )
    registry: str = _opt(
        "",
        "registry the swarm's nodes pull kernel images from, e.g. 'manager.example:5000' "
        "(`sbx images push` puts them there); empty: images must already be on every node",
    )
    swarm_network: str = _opt(
        "sbx-kernels", "attachable internal overlay network that cluster kernels listen on"
    )
    swarm_constraints: str = _opt(
        "",
        "Swarm placement constraints for kernel services, comma-separated, e.g. "
        "'node.role==worker'",
    )
    swarm_poll_interval: float = _opt(
        1.0, "seconds between the cluster checks that find lost nodes and ended tasks"
    )
    kernel_start_timeout: float = _opt(60.0, "seconds to wait for a new kernel to answer")
    interrupt_grace: float = _opt(5.0, "seconds a timed-out cell gets to stop before restart")
    ws_ping_interval: float = _opt(30.0, "seconds between WebSocket pings that find dead clients")
    reconnect_grace: float = _opt(
        10.0,
        "seconds a dropped stream or Jupyter client may take to reconnect and resume; "
        "then its buffer is dropped and, on the agent stream, its running cell interrupted",
    )
    replay_buffer_events: int = _opt(
        1000, "events kept per session stream (and per parked Jupyter client) for reconnects"
    )
    replay_buffer_size: str = _opt("8m", "bytes of events kept for reconnects, per buffer")
    end_sessions_on_stop: bool = _opt(
        False,
        "end every session when the gateway stops; by default they keep running and the "
        "next start on the same data dir reattaches to them",
    )
    drain_timeout: float = _opt(
        10.0, "seconds a stopping gateway lets running cells finish before cutting them"
    )
    cull_interval: float = _opt(1.0, "how often TTL and idle timeouts are checked, seconds")
    log_level: str = _opt("info", "debug, info, warning or error")
    url: str = _opt("http://127.0.0.1:8765", "gateway URL the SDK and client commands use")
    token: str = _opt(
        "",
        "API token: the one `sbx serve` accepts (as an admin of token_tenant) besides the "
        "tokens file, and the one the SDK, client commands and `sbx mcp` send",
    )

    def __post_init__(self) -> None:
        if not self.data_dir:
            self.data_dir = _default_data_dir()
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log_level must be debug/info/warning/error, not {self.log_level}")
        if self.auth not in ("token", "none"):
            raise ConfigError(f"auth must be 'token' or 'none', not {self.auth!r}")
        if self.max_sessions < 1:
            raise ConfigError("max_sessions must be at least 1")
        if self.pool_refill_concurrency < 1:
            raise ConfigError("pool_refill_concurrency must be at least 1")
        try:
            self.pool_sizes  # noqa: B018
        except ValueError:
            raise ConfigError(
                f"pool must look like 'python3=2,bash=1', not {self.pool!r}"
            ) from None
        # Parsing both limit sets here makes a bad size fail at start, not on first use.
        self.default_limits.resolve({}, self.max_limits)
        self._check_isolation()
        self._check_placement()
        self.replay_buffer_size_bytes  # noqa: B018 (fails now on a bad size)
        self.max_request_body_bytes  # noqa: B018
        self.max_code_bytes  # noqa: B018
        self.max_anonymous_body_bytes  # noqa: B018
        self.max_header_bytes  # noqa: B018
        if min(self.idle_connection_timeout, self.body_timeout, self.loop_lag_warning) <= 0:
            raise ConfigError(
                "idle_connection_timeout, body_timeout and loop_lag_warning must be positive"
            )

    @functools.cached_property
    def default_limits(self) -> Limits:
        return self._limits("default")

    @functools.cached_property
    def max_limits(self) -> Limits:
        return self._limits("max")

    def _limits(self, prefix: str) -> Limits:
        get = lambda name: getattr(self, f"{prefix}_{name}")  # noqa: E731
        return Limits(
            memory=parse_size(get("memory"), f"{prefix}_memory"),
            cpus=float(get("cpus")),
            pids=int(get("pids")),
            disk=parse_size(get("disk"), f"{prefix}_disk"),
            timeout=float(get("timeout")),
            output_bytes=parse_size(get("output_bytes"), f"{prefix}_output_bytes"),
        )

    @property
    def client_token(self) -> str:
        """The token clients send: ``token``, else the one a local gateway generated."""
        if self.token:
            return self.token
        generated = Path(self.data_dir) / "token"
        try:
            return generated.read_text().strip()
        except OSError:
            return ""

    @functools.cached_property
    def pool_sizes(self) -> dict[str, int]:
        """``python3=2,bash=1`` -> {"python3": 2, "bash": 1}."""
        sizes = {}
        for part in _csv(self.pool):
            name, _, count = part.partition("=")
            sizes[name.strip()] = int(count or 1)
        return sizes

    @functools.cached_property
    def default_image_names(self) -> list[str]:
        return _csv(self.default_images)

    @functools.cached_property
    def tmp_bytes(self) -> int:
        return parse_size(self.tmp_size, "tmp_size")

    def tmp_bytes_for(self, limits: Limits) -> int:
        """A sandbox's /tmp size: the setting, but at most a quarter of its memory."""
        return min(self.tmp_bytes, limits.memory // 4)

    @functools.cached_property
    def runtime_names(self) -> list[str]:
        return _csv(self.runtimes)

    @functools.cached_property
    def network_policy_names(self) -> list[str]:
        return _csv(self.network_policies)

    @functools.cached_property
    def egress_proxy_port_range(self) -> range:
        low, _, high = self.egress_proxy_ports.partition("-")
        try:
            ports = range(int(low), int(high or low) + 1)
        except ValueError:
            raise ConfigError(
                "egress_proxy_ports must be a port or a range like 47000-47099"
            ) from None
        if not ports or ports.start < 1 or ports.stop > 65536:
            raise ConfigError(f"egress_proxy_ports {self.egress_proxy_ports!r} is not a range")
        return ports

    @functools.cached_property
    def egress_ranges(self) -> list[IPNetwork]:
        try:
            return parse_ranges(self.egress_allow_ranges, "egress_allow_ranges")
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @functools.cached_property
    def egress_always_allow_rules(self) -> list[Rule]:
        try:
            return [Rule.parse(entry) for entry in _csv(self.egress_always_allow)]
        except BadRequest as e:
            raise ConfigError(f"egress_always_allow: {e.message}") from None

    @property
    def seccomp_profile_json(self) -> str | None:
        """The profile's JSON text, checked, for the engine; None for the engine's default."""
        if self.seccomp_profile == "gateway":
            return seccomp.profile_json()
        if self.seccomp_profile == "docker-default":
            return None
        try:
            text = Path(self.seccomp_profile).read_text()
            profile = json.loads(text)
        except (OSError, ValueError) as e:
            raise ConfigError(f"seccomp_profile {self.seccomp_profile}: {e}") from None
        if not isinstance(profile, dict) or "defaultAction" not in profile:
            raise ConfigError(f"seccomp_profile {self.seccomp_profile} is not a seccomp profile")
        return text

    def _check_isolation(self) -> None:
        unknown = set(self.runtime_names) - set(RUNTIMES)
        if unknown or not self.runtime_names:
            raise ConfigError(f"runtimes must name some of {', '.join(RUNTIMES)}")
        if self.default_runtime not in self.runtime_names:
            raise ConfigError(f"default_runtime {self.default_runtime!r} is not in runtimes")
        policies = set(self.network_policy_names)
        if not policies or policies - {"none", "allowlist"}:
            raise ConfigError("network_policies must name some of none, allowlist")
        if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,14}", self.egress_network):
            raise ConfigError("egress_network must be a network name of at most 15 characters")
        self.egress_proxy_port_range  # noqa: B018 (each fails now on a bad value)
        self.egress_ranges  # noqa: B018
        self.egress_always_allow_rules  # noqa: B018
        self.seccomp_profile_json  # noqa: B018

    def _check_placement(self) -> None:
        if self.placement not in ("docker", "swarm"):
            raise ConfigError(f"placement must be 'docker' or 'swarm', not {self.placement!r}")
        if self.placement != "swarm":
            return
        # A service cannot pick a runtime, and the egress proxy serves this host's kernels only.
        if self.runtime_names != ["runc"] or self.network_policy_names != ["none"]:
            raise ConfigError(
                "placement swarm offers runtime runc and network policy none only: set "
                "runtimes=runc and network_policies=none (docs/SCALING.md says why)"
            )
        if self.swarm_poll_interval <= 0:
            raise ConfigError("swarm_poll_interval must be positive")

    @functools.cached_property
    def swarm_constraint_list(self) -> list[str]:
        return _csv(self.swarm_constraints)

    @functools.cached_property
    def replay_buffer_size_bytes(self) -> int:
        return parse_size(self.replay_buffer_size, "replay_buffer_size")

    @functools.cached_property
    def max_request_body_bytes(self) -> int:
        return parse_size(self.max_request_body, "max_request_body")

    @functools.cached_property
    def max_code_bytes(self) -> int:
        return parse_size(self.max_code_size, "max_code_size")

    @functools.cached_property
    def max_anonymous_body_bytes(self) -> int:
        return parse_size(self.max_anonymous_body, "max_anonymous_body")

    @functools.cached_property
    def max_header_bytes(self) -> int:
        return parse_size(self.max_header_size, "max_header_size")

    @functools.cached_property
    def cors_origin_list(self) -> list[str]:
        return [origin.rstrip("/") for origin in _csv(self.cors_origins)]

    @classmethod
    def add_arguments(
        cls, parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None
    ) -> None:
        """Add one ``--flag`` per field (or per ``only`` field); unset flags stay ``None``."""
        parser.add_argument("--config", help="TOML config file (also SBX_CONFIG)")
        for f in dataclasses.fields(cls):
            if only is not None and f.name not in only:
                continue
            switch = {"nargs": "?", "const": "true"} if isinstance(f.default, bool) else {}
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                dest=f.name,
                default=None,
                type=_parser_type(f),
                help=f"{f.metadata['help']} (env SBX_{f.name.upper()}, default {f.default!r})",
                **switch,
            )

    @classmethod
    def load(
        cls,
        args: argparse.Namespace | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Settings:
        """Merge the layers; raise ConfigError naming the bad option."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        config_file = (args and getattr(args, "config", None)) or environ.get("SBX_CONFIG")
        if config_file:
            values.update(_read_file(Path(config_file)))
        for f in dataclasses.fields(cls):
            env_value = environ.get(f"SBX_{f.name.upper()}")
            if env_value is not None:
                values[f.name] = env_value
            if args is not None and getattr(args, f.name, None) is not None:
                values[f.name] = getattr(args, f.name)
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Settings:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown}")
        typed = {}
        for name, raw in values.items():
            try:
                typed[name] = _parser_type(fields[name])(raw)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"setting {name}={raw!r} is invalid: {e}") from e
        return cls(**typed)


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parser_type(f: dataclasses.Field) -> Any:
    kind = type(f.default)
    return {bool: _boolean, int: int, float: float}.get(kind, str)


def _boolean(value: Any) -> bool:
    """Read a switch from a flag, env var or file: true/false, yes/no, on/off, 1/0."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean; use true or false")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    return {k.replace("-", "_"): v for k, v in data.items()}
