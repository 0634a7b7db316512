"""The one settings object: defaults < config file < ``SBX_*`` env < CLI flags.

Every option is a dataclass field declared once with its help, its ``--help``
group and its kind (how text becomes the typed value, and back), so the flag
list, env names, file keys and help can never drift apart.

Over 500 lines on purpose: the sixty-odd option declarations are the one list
that drives flags, env, file keys and ``--help``; split, they would drift.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import socket
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import BadRequest, ConfigError, LimitExceeded
from .hosts import IPNetwork, Rule, parse_ranges
from .limits import Limits, parse_size

# kernels/ and images/ ship inside the package, so an installed wheel finds them too.
PACKAGE_DIR = Path(__file__).resolve().parent
KERNELS_DIR, IMAGES_DIR = PACKAGE_DIR / "kernels", PACKAGE_DIR / "images"


@dataclasses.dataclass(frozen=True)
class Kind:
    """How an option's text (flag, env var or file) becomes its value, and how help shows it.

    ``parse`` also takes the value it made, unchanged, so settings built in code
    from typed values and from text end up alike.
    """

    parse: Callable[[Any], Any]
    show: Callable[[Any], str] = str
    metavar: str | None = None


# The runtimes a session may ask for (sandbox/isolation/runtimes.py maps each onto the
# engine's; a unit test holds the two lists equal, as sandbox/ never reads config).
RUNTIMES = ("runc", "gvisor")


@dataclasses.dataclass(frozen=True)
class SeccompProfile:
    """The ``seccomp_profile`` setting: as the user named it, and an operator's own JSON.

    ``gateway`` (the gateway's own profile, which the sandbox layer builds) and
    ``docker-default`` carry no JSON here.
    """

    source: str
    json: str | None = dataclasses.field(repr=False)  # a profile file's text

    @classmethod
    def load(cls, value: Any) -> SeccompProfile:
        """Read the profile a name or file stands for, once, at load time."""
        if isinstance(value, cls):
            return value
        source = str(value)
        if source in ("gateway", "docker-default"):
            return cls(source, None)
        text = Path(source).read_text()
        profile = json.loads(text)
        if not isinstance(profile, dict) or "defaultAction" not in profile:
            raise ValueError(f"{source} is not a seccomp profile")
        return cls(source, text)


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _items(value: Any) -> list[Any]:
    """A list option's entries: from ``a, b`` text, or a TOML array (or tuple) as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return list(value)


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(item).strip() for item in _items(value))


def _origins(value: Any) -> tuple[str, ...]:
    return tuple(origin.rstrip("/") for origin in _names(value))


def _cidrs(value: Any) -> tuple[IPNetwork, ...]:
    return tuple(parse_ranges(",".join(map(str, _items(value))), "in the list"))


def _rules(value: Any) -> tuple[Rule, ...]:
    try:
        return tuple(item if isinstance(item, Rule) else Rule.parse(item) for item in _items(value))
    except BadRequest as e:
        raise ValueError(e.message) from None


def _size(value: Any) -> int:
    try:
        return parse_size(value)
    except LimitExceeded:
        raise ValueError("use a size like '512m', '1g' or a number of bytes") from None


def _show_size(n: int) -> str:
    """Bytes as people write them in a setting: the largest unit that divides them exactly."""
    for unit, scale in (("t", 2**40), ("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _show_pool(sizes: Mapping[str, int]) -> str:
    return ",".join(f"{name}={count}" for name, count in sizes.items())


def _pool(value: Any) -> dict[str, int]:
    """``python3=2,bash=1`` (or a TOML table) -> {"python3": 2, "bash": 1}; a bare name is 1."""
    if isinstance(value, Mapping):
        value = _show_pool(value)
    sizes = {}
    try:
        for part in _items(value):
            name, _, count = part.partition("=")
            sizes[name.strip()] = int(count or 1)
    except ValueError:
        raise ValueError("use the form 'python3=2,bash=1'") from None
    return sizes


def _show_ports(ports: range) -> str:
    last = ports.stop - 1
    return str(last) if ports.start == last else f"{ports.start}-{last}"


def _ports(value: Any) -> range:
    text = _show_ports(value) if isinstance(value, range) else str(value)
    low, _, high = text.partition("-")
    try:
        ports = range(int(low), int(high or low) + 1)
    except ValueError:
        ports = range(0)
    if not ports or ports.start < 1 or ports.stop > 65536:
        raise ValueError("use a port or a range like 47000-47099")
    return ports


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


def _show_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _idle_action(value: Any) -> str:
    if value not in ("end", "pause"):
        raise ValueError(f"{value!r} is neither 'end' nor 'pause'")
    return str(value)


def _ttl_from(value: Any) -> str:
    if value not in ("activity", "created"):
        raise ValueError(f"{value!r} is neither 'activity' nor 'created'")
    return str(value)


TEXT = Kind(str)
INT = Kind(int, metavar="N")
NUMBER = Kind(float, _show_number, "N")
SECONDS = Kind(float, _show_number, "SECONDS")
SWITCH = Kind(_boolean, lambda on: "true" if on else "false", "BOOL")
SIZE = Kind(_size, _show_size, "SIZE")
NAMES = Kind(_names, ",".join, "A,B")
ORIGINS = Kind(_origins, ",".join, "ORIGIN,...")
POOL = Kind(_pool, _show_pool, "KERNEL=N,...")
PORTS = Kind(_ports, _show_ports, "PORT[-PORT]")
CIDRS = Kind(_cidrs, lambda networks: ",".join(map(str, networks)), "CIDR,...")
RULES = Kind(_rules, lambda rules: ",".join(rule.text for rule in rules), "ENTRY,...")
IDLE_ACTION = Kind(_idle_action, metavar="end|pause")
TTL_FROM = Kind(_ttl_from, metavar="activity|created")
SECCOMP = Kind(SeccompProfile.load, lambda profile: profile.source, "PROFILE")
_BY_TYPE = {str: TEXT, int: INT, float: NUMBER, bool: SWITCH}

# The --help groups, in the order the fields below declare them.
LISTENING = "listening"
AUTH = "auth"
LIMITS = "sessions & limits"
POOLING = "pool"
KERNELS = "kernels & images"
ISOLATION = "isolation & egress"
SWARM = "swarm"
STORAGE = "storage & lifecycle"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
CLIENT = "client (the SDK, client commands and sbx mcp)"


def _opt(default: Any, help: str, group: str, kind: Kind | None = None) -> Any:
    """Declare an option: ``default`` as a user writes it, parsed here once."""
    kind = kind or _BY_TYPE[type(default)]
    value = kind.parse(default)
    metadata = {"help": help, "group": group, "kind": kind}
    if value.__hash__ is None:  # the pool's dict: each Settings gets its own
        return dataclasses.field(
            default_factory=functools.partial(kind.parse, default), metadata=metadata
        )
    return dataclasses.field(default=value, metadata=metadata)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "sandbox-gateway")


@dataclasses.dataclass
class Settings:
    """Gateway configuration, validated at load time.

    Each field holds its typed value (sizes in bytes, lists as tuples), parsed
    once when the settings are built: some are read on every request.
    """

    # -- listening
    host: str = _opt("127.0.0.1", "address to listen on", LISTENING)
    port: int = _opt(8765, "port to listen on (0 picks a free one)", LISTENING)
    workers: int = _opt(
        1,
        "gateway processes sharing the port (SO_REUSEPORT) and the database, each with its "
        "own data dir <data_dir>/worker-<n>; more than one needs database_url",
        LISTENING,
    )
    reuse_port: bool = _opt(
        False,
        "share the port with other gateway processes (SO_REUSEPORT) and answer peers on a "
        "port of its own on 127.0.0.1; --workers sets it for its workers",
        LISTENING,
    )
    cors_origins: tuple[str, ...] = _opt(
        "",
        "comma-separated browser origins allowed to call the API (CORS); off when empty",
        LISTENING,
        ORIGINS,
    )
    max_request_body: int = _opt(
        "16m", "largest JSON request body (uploads stream separately)", LISTENING, SIZE
    )
    max_anonymous_body: int = _opt(
        "64k",
        "largest request body of a caller without a valid API token; a bigger one is "
        "refused with 401 from its headers, unread",
        LISTENING,
        SIZE,
    )
    max_header_size: int = _opt("64k", "largest request line plus headers", LISTENING, SIZE)
    preview_max_connections: int = _opt(
        32, "preview connections a session holds at once (more: 429)", LISTENING
    )
    preview_max_bytes: int = _opt(
        "512m",
        "bytes a session's previews move per minute; past that new ones get 429 and open "
        "ones wait for the next minute",
        LISTENING,
        SIZE,
    )
    idle_connection_timeout: float = _opt(
        60.0,
        "seconds a connection may sit idle, or take to send a request's headers",
        LISTENING,
        SECONDS,
    )
    body_timeout: float = _opt(
        10.0,
        "seconds a caller without a valid API token gets to send its request body "
        "(authenticated bodies and uploads are not timed)",
        LISTENING,
        SECONDS,
    )
    ws_ping_interval: float = _opt(
        30.0, "seconds between WebSocket pings that find dead clients", LISTENING, SECONDS
    )
    reconnect_grace: float = _opt(
        10.0,
        "seconds a dropped stream or Jupyter client may take to reconnect and resume; "
        "then its buffer is dropped and, on the agent stream, its running cell interrupted",
        LISTENING,
        SECONDS,
    )
    replay_buffer_events: int = _opt(
        1000,
        "events kept per session stream (and per parked Jupyter client) for reconnects",
        LISTENING,
    )
    replay_buffer_size: int = _opt(
        "8m", "bytes of events kept for reconnects, per buffer", LISTENING, SIZE
    )
    client_write_buffer: int = _opt(
        "64m",
        "bytes waiting to be sent to one WebSocket client; one that does not read past it "
        "is disconnected (close code 1008) rather than held in memory",
        LISTENING,
        SIZE,
    )

    # -- auth
    auth: str = _opt(
        "token",
        "'token' (callers need an API token) or 'none' (no authentication: only for a "
        "single user on this machine; the gateway warns loudly)",
        AUTH,
    )
    tokens_file: str = _opt("", "TOML file of API tokens, their tenants and tenant quotas", AUTH)
    token_tenant: str = _opt(
        "default", "tenant of the single `token` (and of a generated one)", AUTH
    )
    tenant_max_sessions: int = _opt(32, "live sessions one tenant may hold at once", AUTH)
    tenant_max_memory: int = _opt(
        "16g", "memory limits one tenant's live sessions may add up to", AUTH, SIZE
    )
    tenant_max_disk: int = _opt(
        "32g", "workspace sizes (disk limits) one tenant's live sessions may add up to", AUTH, SIZE
    )
    tenant_max_cpus: float = _opt(
        64.0, "CPU quotas (cores) one tenant's live sessions may add up to", AUTH
    )
    tenant_creates_per_minute: int = _opt(
        0, "sessions one tenant may create a minute, whichever gateway it asks (0: any)", AUTH
    )
    secrets_key_file: str = _opt(
        "",
        "file holding the key that seals tenants' secrets (base64 of 32 bytes; made, mode "
        "0600, when missing); keep it apart from the database and its backups (empty: "
        "secrets.key in data_dir)",
        AUTH,
    )
    max_secret_size: int = _opt("4k", "largest value of one sealed secret", AUTH, SIZE)
    policies_dir: str = _opt(
        "",
        "directory of execute policies, <tenant>.toml or .yaml and default.*, read at start "
        "and on POST /v1/policies/reload (empty: <data_dir>/policies; docs/approvals.md)",
        AUTH,
    )
    approval_timeout: float = _opt(
        600.0, "seconds a held execute waits for an approver before it is denied", AUTH, SECONDS
    )
    tenant_max_snapshots: int = _opt(64, "snapshots one tenant may keep", AUTH)
    tenant_max_snapshot_bytes: int = _opt(
        "16g", "disk one tenant's snapshots may take, added up", AUTH, SIZE
    )
    tenant_max_volumes: int = _opt(16, "named volumes one tenant may keep", AUTH)
    volume_size: int = _opt(
        "1g", "a new volume's size when its create names none (ENOSPC past it)", AUTH, SIZE
    )
    max_volume_size: int = _opt("64g", "the largest volume a create may ask for", AUTH, SIZE)
    token: str = _opt(
        "",
        "API token: the one the SDK, client commands and `sbx mcp` send (their --token), "
        "and the one `sbx serve` accepts as an admin of token_tenant besides the tokens "
        "file (its --admin-token)",
        AUTH,
    )

    # -- sessions & limits
    max_sessions: int = _opt(64, "live sessions allowed at once, server-wide", LIMITS)
    host_max_sessions: int = _opt(
        0,
        "open sessions (paused too) all the gateways on this host may hold together (0: none)",
        LIMITS,
    )
    host_max_memory: int = _opt(
        "0",
        "memory limits all the gateways' sessions on this host may add up to (0: no cap)",
        LIMITS,
        SIZE,
    )
    host_id: str = _opt(
        "",
        "this host's name in the host caps' counts, the same for every gateway on it "
        "(empty: the hostname, a container's own in a container: set it)",
        LIMITS,
    )
    default_ttl: float = _opt(
        3600.0, "session lifetime in seconds when none is asked for", LIMITS, SECONDS
    )
    max_ttl: float = _opt(86400.0, "longest lifetime a session may ask for", LIMITS, SECONDS)
    default_idle_timeout: float = _opt(
        600.0, "seconds without activity before a session ends", LIMITS, SECONDS
    )
    max_idle_timeout: float = _opt(
        86400.0, "longest idle timeout a session may ask for", LIMITS, SECONDS
    )
    idle_action: str = _opt(
        "end",
        "what the idle timeout does to a session that asks for nothing else: 'end' it, or "
        "'pause' it (its kernel's state kept on disk, no memory held; docs/snapshots.md)",
        LIMITS,
        IDLE_ACTION,
    )
    pause_frozen_for: float = _opt(
        300.0,
        "seconds a pause keeps a sandbox frozen (no CPU, its memory held, a resume in "
        "milliseconds) before saving its state to disk and freeing the memory (0: every pause "
        "saves at once; docs/snapshots.md)",
        LIMITS,
        SECONDS,
    )
    pause_memory_floor: int = _opt(
        "1g",
        "below this much available memory on the host, frozen sandboxes are saved to disk, "
        "the longest frozen first, one a culling interval",
        LIMITS,
        SIZE,
    )
    checkpoint_idle_after: float = _opt(
        2.0,
        "seconds a session that asked to survive crashes stays idle after an execute before "
        "its kernel's state is checkpointed (docs/snapshots.md)",
        LIMITS,
        SECONDS,
    )
    checkpoint_every: float = _opt(
        30.0, "seconds between two checkpoints of one session at least", LIMITS, SECONDS
    )
    checkpoint_max_size: int = _opt(
        "1g",
        "largest checkpoint of a kernel's namespace; a larger one is refused, the last kept",
        LIMITS,
        SIZE,
    )
    jupyter_ttl_from: str = _opt(
        "activity",
        "what the ttl of a kernel started through the Jupyter API (/api/kernels) counts "
        "from: 'activity' (its last message or execute; while a client is connected or a "
        "cell runs it does not run out; max_ttl from creation still ends it) or 'created'",
        LIMITS,
        TTL_FROM,
    )
    default_memory: int = _opt(
        "512m", "memory limit per session (swap is not allowed)", LIMITS, SIZE
    )
    max_memory: int = _opt("8g", "largest memory limit a session may ask for", LIMITS, SIZE)
    default_cpus: float = _opt(1.0, "CPU quota per session, in cores", LIMITS)
    max_cpus: float = _opt(4.0, "largest CPU quota a session may ask for", LIMITS)
    default_pids: int = _opt(256, "process/thread limit per session", LIMITS)
    max_pids: int = _opt(4096, "largest pids limit a session may ask for", LIMITS)
    default_disk: int = _opt("1g", "size of a session's writable workspace", LIMITS, SIZE)
    max_disk: int = _opt("20g", "largest workspace a session may ask for", LIMITS, SIZE)
    default_timeout: float = _opt(60.0, "execution timeout in seconds", LIMITS, SECONDS)
    max_timeout: float = _opt(
        3600.0, "longest execution timeout a client may ask for", LIMITS, SECONDS
    )
    default_output_bytes: int = _opt(
        "1m", "output kept per execution; the rest is cut", LIMITS, SIZE
    )
    max_output_bytes: int = _opt("64m", "largest output cap a session may ask for", LIMITS, SIZE)
    session_output_bytes: int = _opt(
        "256m",
        "output one session keeps over its life, all executions together (history, "
        "exports); past it an execution keeps its error and a note, nothing more",
        LIMITS,
        SIZE,
    )
    max_code_size: int = _opt("2m", "largest code of one execute", LIMITS, SIZE)
    max_archive_size: int = _opt(
        "1g",
        "largest directory download (?format=tar|zip), by its files' sizes (a sparse file "
        "counts whole); a bigger one is refused with 413 before anything is sent",
        LIMITS,
        SIZE,
    )
    tmp_size: int = _opt("64m", "size of the in-memory /tmp of each kernel container", LIMITS, SIZE)
    template_build_memory: int = _opt(
        "2g", "memory of each step of a template build (which has one CPU core)", LIMITS, SIZE
    )
    template_build_disk: int = _opt(
        "4g",
        "disk one step of a template build may write, and its image add to its base; "
        "past it the build is stopped and fails",
        LIMITS,
        SIZE,
    )
    template_build_timeout: float = _opt(
        900.0, "longest template build; past it the build is stopped and fails", LIMITS, SECONDS
    )
    template_builds: int = _opt(
        1, "template builds at once (a few more wait; past those, 503 overloaded)", LIMITS, INT
    )
    template_upload_disk: int = _opt(
        "2g",
        "disk E2B's uploaded COPY file sets may take together while they wait for their "
        "builds (each tenant's within the 64 MiB context bound); past it the oldest sets "
        "of the tenant holding the most go first",
        LIMITS,
        SIZE,
    )

    # -- pool
    pool: Mapping[str, int] = _opt(
        "python3=2",
        "warm pool: ready kernels kept per kernelspec, e.g. 'python3=2,bash=1' ('' for none); "
        "they count against max_sessions",
        POOLING,
        POOL,
    )
    pool_imports: tuple[str, ...] = _opt(
        "",
        "Python modules each pooled Python kernel imports ahead, e.g. 'numpy,pandas': a "
        "session's first import of them, and a resume or fork whose saved objects need them, "
        "take none of their import time (they count toward each such session's memory)",
        POOLING,
        NAMES,
    )
    pool_refill_concurrency: int = _opt(
        1, "pooled kernels started at once while refilling", POOLING
    )
    pool_max: Mapping[str, int] = _opt(
        "",
        "most ready kernels per kernelspec the pool grows to while creates find it empty, "
        "e.g. 'python3=8' (one more for each create that found none; a kernelspec not named "
        "stays at its pool size)",
        POOLING,
        POOL,
    )
    template_pool_per_tenant: int = _opt(
        4,
        "most ready sandboxes one tenant keeps pooled for its templates, all together "
        "(PUT /v1/templates/NAME/pool); they count against its quota and max_sessions "
        "(0: tenants cannot pool templates)",
        POOLING,
        INT,
    )
    pool_shrink_after: float = _opt(
        60.0,
        "seconds without a create finding the pool empty before a grown pool gives back one "
        "ready kernel (down to its pool size)",
        POOLING,
        SECONDS,
    )
    start_concurrency: int = _opt(
        0,
        "cold starts at once; the rest wait their turn, fairly by tenant (0: one per CPU)",
        POOLING,
    )
    start_queue: int = _opt(
        64,
        "creates that may wait for a cold start; one more is refused (503, Retry-After)",
        POOLING,
    )
    start_queue_per_tenant: int = _opt(
        16, "of those, the most one tenant may have waiting", POOLING
    )
    start_wait: float = _opt(
        60.0,
        "seconds a create waits for a cold start before it is refused (503)",
        POOLING,
        SECONDS,
    )

    # -- kernels & images
    kernels_dir: str = _opt(str(KERNELS_DIR), "directory of kernelspecs offered", KERNELS)
    images_dir: str = _opt(str(IMAGES_DIR), "directory of kernel image Dockerfiles", KERNELS)
    base_image: str = _opt(
        "debian:bookworm-slim",
        "base image for kernel images (debootstrapped if not pullable)",
        KERNELS,
    )
    default_images: tuple[str, ...] = _opt(
        "python",
        "comma-separated images `sbx images build` builds when given no names",
        KERNELS,
        NAMES,
    )
    max_kernel_message: int = _opt(
        "32m",
        "largest kernel message the gateway reads (all its frames; on swarm each frame); "
        "a bigger one is refused before it is held whole, and the execution's outputs say so",
        KERNELS,
        SIZE,
    )
    kernel_message_guard: bool = _opt(
        True,
        "relay each local kernel's sockets through a guard that bounds a whole message "
        "(libzmq alone bounds each frame: one message of many frames under the limit "
        "could grow the gateway); off only for trusted kernels, or to measure its cost",
        KERNELS,
    )
    kernel_start_timeout: float = _opt(
        60.0, "seconds to wait for a new kernel to answer", KERNELS, SECONDS
    )
    interrupt_grace: float = _opt(
        5.0, "seconds a timed-out cell gets to stop before restart", KERNELS, SECONDS
    )

    # -- isolation & egress
    runtimes: tuple[str, ...] = _opt(
        "runc,gvisor",
        "container runtimes sessions may ask for (runc, gvisor), comma-separated; a "
        "kernelspec's metadata.sandbox.runtimes narrows it per kernel",
        ISOLATION,
        NAMES,
    )
    default_runtime: str = _opt("runc", "runtime of sessions that ask for none", ISOLATION)
    seccomp_profile: SeccompProfile = _opt(  # noqa: RUF009 (frozen, so shared safely)
        "gateway",
        "seccomp profile for runc kernels: 'gateway' (the gateway's own, "
        "gateway/sandbox/isolation/seccomp.py: no ptrace, namespaces, keyrings, bpf, io_uring, "
        "...), 'docker-default' (the engine's default), or a file in Docker's JSON format "
        "(docs/SECURITY.md); gVisor ignores it",
        ISOLATION,
        SECCOMP,
    )
    network_policies: tuple[str, ...] = _opt(
        "none,allowlist",
        "network policies sessions may ask for (none, allowlist)",
        ISOLATION,
        NAMES,
    )
    egress_network: str = _opt(
        "sbx-egress",
        "internal Docker network (and bridge device) of allowlist sessions, shared by "
        "this host's gateways",
        ISOLATION,
    )
    egress_proxy_ports: range = _opt(
        "47000-47099",
        "host ports the egress proxy may listen on; the firewall lets sandboxes reach only these",
        ISOLATION,
        PORTS,
    )
    egress_allow_ranges: tuple[IPNetwork, ...] = _opt(
        "",
        "CIDRs allowlists may reach although private, loopback, link-local or this host "
        "(comma-separated; the gateway's own ports stay unreachable); empty: none",
        ISOLATION,
        CIDRS,
    )
    egress_always_allow: tuple[Rule, ...] = _opt(
        "",
        "allowlist entries every allowlist session gets, e.g. your package index host "
        "(comma-separated)",
        ISOLATION,
        RULES,
    )
    egress_ca_file: str = _opt(
        "",
        "PEM file of authorities the egress proxy trusts, beside the host's, for hosts it "
        "sends a brokered credential to (an internal service's private CA); empty: the host's",
        ISOLATION,
    )

    package_cache: bool = _opt(
        False,
        "run devpi-server beside the gateway as a caching mirror of the index pip is "
        "configured with here; Python sessions install from it with no network "
        "(docs/packages.md)",
        ISOLATION,
    )
    npm_cache: bool = _opt(
        False,
        "run verdaccio beside the gateway as a caching proxy of the registry npm is "
        "configured with here; JavaScript sessions install from it with no network "
        "(docs/packages.md)",
        ISOLATION,
    )
    package_allow: tuple[str, ...] = _opt(
        "",
        "packages sessions may install from the caches (pip and npm), names, name==version "
        "or name@version (comma-separated; empty: any); a tenant's package_allow replaces it",
        ISOLATION,
        NAMES,
    )
    package_deny: tuple[str, ...] = _opt(
        "",
        "packages sessions may not install, names, name==version or name@version "
        "(comma-separated); a tenant's package_deny replaces it",
        ISOLATION,
        NAMES,
    )

    # -- swarm
    placement: str = _opt(
        "docker",
        "where kernels run: 'docker' (containers on this host's engine) or 'swarm' (one-task "
        "services on any node of the Docker Swarm whose manager the engine API reaches; the "
        "gateway then runs as a container on swarm_network: docs/SCALING.md)",
        SWARM,
    )
    registry: str = _opt(
        "",
        "registry the swarm's nodes pull kernel images from, e.g. 'manager.example:5000' "
        "(`sbx images push` puts them there); empty: images must already be on every node",
        SWARM,
    )
    swarm_network: str = _opt(
        "sbx-kernels",
        "attachable internal overlay network that cluster kernels listen on",
        SWARM,
    )
    swarm_constraints: tuple[str, ...] = _opt(
        "",
        "Swarm placement constraints for kernel services, comma-separated, e.g. "
        "'node.role==worker'",
        SWARM,
        NAMES,
    )
    swarm_poll_interval: float = _opt(
        1.0,
        "seconds between the cluster checks that find lost nodes and ended tasks",
        SWARM,
        SECONDS,
    )

    # -- storage & lifecycle
    data_dir: str = _opt(
        "",
        "where the SQLite store and session directories live (empty: "
        "$XDG_DATA_HOME/sandbox-gateway, or ~/.local/share/sandbox-gateway)",
        STORAGE,
    )
    database_url: str = _opt(
        "",
        "the store: empty for SQLite in the data dir (one gateway), or a PostgreSQL URL "
        "(postgresql://user@host/db, or ?host=/socket/dir) that several gateways share; "
        "scripts/postgres starts a local server",
        STORAGE,
    )
    advertise_url: str = _opt(
        "",
        "where the other gateways sharing the database reach this one, passing on requests "
        "for its sessions (empty: http://<host>:<port>, 127.0.0.1 for a wildcard host)",
        STORAGE,
    )
    advertise_network: str = _opt(
        "",
        "with placement swarm, instead of advertise_url: the network (as the gateway's "
        "container is attached to it, e.g. sbx-front) whose address this gateway's task "
        "advertises, as http://<address>:<port>; a Swarm service's replicas have no fixed "
        "address",
        STORAGE,
    )
    lease_ttl: float = _opt(
        3.0,
        "seconds a gateway's lease on a session lasts unless renewed (renewed each third of "
        "it); with a shared database, a dead gateway's sessions are free again after this",
        STORAGE,
        SECONDS,
    )
    end_sessions_on_stop: bool = _opt(
        False,
        "end every session when the gateway stops; by default they keep running and the "
        "next start on the same data dir reattaches to them",
        STORAGE,
    )
    drain_timeout: float = _opt(
        10.0,
        "seconds a stopping gateway lets running cells finish before cutting them",
        STORAGE,
        SECONDS,
    )
    cull_interval: float = _opt(
        1.0, "how often TTL and idle timeouts are checked, seconds", STORAGE, SECONDS
    )
    history_max_age: float = _opt(
        0.0,
        "seconds an execution's record is kept (and an ended session's, once its executions "
        "are gone); 0 keeps them forever",
        STORAGE,
        SECONDS,
    )
    history_max_executions: int = _opt(
        0, "newest executions kept per session, older ones pruned; 0 keeps all", STORAGE
    )
    history_prune_interval: float = _opt(
        60.0, "seconds between passes that prune history past its retention", STORAGE, SECONDS
    )
    log_level: str = _opt("info", "debug, info, warning or error", STORAGE)
    loop_lag_warning: float = _opt(
        0.5,
        "log a warning when the event loop stalls for longer than this many seconds",
        STORAGE,
        SECONDS,
    )
    webhook_timeout: float = _opt(
        5.0, "seconds one lifecycle webhook attempt may take (docs/webhooks.md)", STORAGE, SECONDS
    )
    webhook_attempts: int = _opt(8, "attempts at a webhook delivery before it fails", STORAGE)
    webhook_backoff: float = _opt(
        5.0, "seconds before a webhook's first retry; doubled for each next one", STORAGE, SECONDS
    )
    webhook_concurrency: int = _opt(4, "webhook attempts one gateway makes at once", STORAGE)
    webhook_queue: int = _opt(
        1000, "webhook deliveries one endpoint may have waiting; more are dropped (logged)",
        STORAGE,
    )  # fmt: skip
    webhook_log_max_age: float = _opt(
        604800.0, "seconds finished webhook deliveries stay in the delivery log", STORAGE, SECONDS
    )
    webhook_allow_ranges: tuple[IPNetwork, ...] = _opt(
        "",
        "private, loopback or link-local ranges webhook endpoints may resolve into (by default "
        "only public addresses are called, never the gateway's own port)",
        STORAGE,
        CIDRS,
    )
    tool_allow_ranges: tuple[IPNetwork, ...] = _opt(
        "",
        "private, loopback or link-local ranges sessions' MCP servers may resolve into (by "
        "default only public addresses are reached, never the gateway's own port)",
        STORAGE,
        CIDRS,
    )

    # -- client
    url: str = _opt("http://127.0.0.1:8765", "gateway URL the SDK and client commands use", CLIENT)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            raw = getattr(self, f.name)
            try:
                setattr(self, f.name, f.metadata["kind"].parse(raw))
            except (TypeError, ValueError, OSError) as e:
                raise ConfigError(f"setting {f.name}={raw!r} is invalid: {e}") from None
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
        for module in self.pool_imports:
            if not _MODULE.fullmatch(module):
                raise ConfigError(f"pool_imports: {module!r} is not a Python module name")
        if min(self.start_queue, self.start_queue_per_tenant, self.start_concurrency + 1) < 1:
            raise ConfigError(
                "start_queue and start_queue_per_tenant must be at least 1, start_concurrency 0 "
                "(one per CPU) or more"
            )
        if min(self.host_max_sessions, self.host_max_memory, self.start_wait) < 0:
            raise ConfigError("host_max_sessions, host_max_memory and start_wait cannot be < 0")
        pausing = (self.pause_frozen_for, self.pause_memory_floor, self.checkpoint_idle_after)
        if min(*pausing, self.checkpoint_every, self.checkpoint_max_size) < 0:
            raise ConfigError(
                "pause_frozen_for, pause_memory_floor and the checkpoint_* options cannot be < 0"
            )
        if not self.host_id:
            self.host_id = socket.gethostname()
        self.default_limits.resolve({}, self.max_limits)  # defaults above the maximums fail now
        self._check_isolation()
        self._check_placement()
        if min(self.history_max_age, self.history_max_executions) < 0:
            raise ConfigError("history_max_age and history_max_executions must be 0 (keep) or more")
        if self.database_url and not self.database_url.startswith(POSTGRES_SCHEMES):
            raise ConfigError("database_url must be empty (SQLite) or a postgresql:// URL")
        if self.workers < 1:
            raise ConfigError("workers must be at least 1")
        if self.workers > 1 and not self.database_url:
            raise ConfigError(
                "workers share their sessions through the database: set database_url "
                "(scripts/serve --postgres starts a local PostgreSQL)"
            )
        if self.lease_ttl <= 0:
            raise ConfigError("lease_ttl must be positive")
        if self.advertise_network and (self.placement != "swarm" or self.advertise_url):
            raise ConfigError(
                "advertise_network names a Swarm task's network: it needs placement swarm, "
                "and no advertise_url (set one of them)"
            )
        if self.history_prune_interval <= 0:
            raise ConfigError("history_prune_interval must be positive")
        webhooks = (self.webhook_timeout, self.webhook_attempts, self.webhook_concurrency,
                    self.webhook_queue)  # fmt: skip
        if self.webhook_backoff < 0 or min(webhooks) <= 0:
            raise ConfigError(
                "webhook_timeout, webhook_attempts, webhook_concurrency and webhook_queue must "
                "be positive, webhook_backoff at least 0"
            )
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
        return Limits(
            **{f.name: getattr(self, f"{prefix}_{f.name}") for f in dataclasses.fields(Limits)}
        )

    def _check_isolation(self) -> None:
        unknown = set(self.runtimes) - set(RUNTIMES)
        if unknown or not self.runtimes:
            raise ConfigError(f"runtimes must name some of {', '.join(RUNTIMES)}")
        if self.default_runtime not in self.runtimes:
            raise ConfigError(f"default_runtime {self.default_runtime!r} is not in runtimes")
        policies = set(self.network_policies)
        if not policies or policies - {"none", "allowlist"}:
            raise ConfigError("network_policies must name some of none, allowlist")
        if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,14}", self.egress_network):
            raise ConfigError("egress_network must be a network name of at most 15 characters")

    def _check_placement(self) -> None:
        if self.placement not in ("docker", "swarm"):
            raise ConfigError(f"placement must be 'docker' or 'swarm', not {self.placement!r}")
        if self.placement != "swarm":
            return
        if self.package_cache or self.npm_cache:
            raise ConfigError(
                "the package caches serve this host's sandboxes only: set "
                "package_cache=false and npm_cache=false with placement swarm"
            )
        # A service cannot pick a runtime, and the egress proxy serves this host's kernels only.
        if self.runtimes != ("runc",) or self.network_policies != ("none",):
            raise ConfigError(
                "placement swarm offers runtime runc and network policy none only: set "
                "runtimes=runc and network_policies=none (docs/SCALING.md says why)"
            )
        if self.swarm_poll_interval <= 0:
            raise ConfigError("swarm_poll_interval must be positive")

    def secrets_key_path(self) -> Path:
        """Where the secrets key lives."""
        return Path(self.secrets_key_file or Path(self.data_dir) / "secrets.key")

    def policies_path(self) -> Path:
        """Where tenants' execute policies are read from (and written by the API)."""
        return Path(self.policies_dir or Path(self.data_dir) / "policies")

    def advertised(self, port: int, network_address: str = "") -> str:
        """This gateway's base URL for its peers, once it listens on ``port``.

        ``network_address``: its address on ``advertise_network``, when that is set.
        """
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = network_address or ("127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @classmethod
    def add_arguments(
        cls,
        parser: argparse.ArgumentParser,
        only: tuple[str, ...] | None = None,
        *,
        skip: tuple[str, ...] = (),
        flags: Mapping[str, str] | None = None,
    ) -> None:
        """Add one ``--flag`` per field (or per ``only`` field) under its group; unset stay None.

        Flags keep the text as typed: the settings parse it, as they do env and file values.
        ``flags`` renames a field's flag where its usual one would mean something else
        there (``--token`` is always the token a client sends, so ``sbx serve`` names the
        token it accepts ``--admin-token``).
        """
        parser.add_argument("--config", help="TOML config file (also SBX_CONFIG)")
        groups: dict[str, Any] = {}
        flags = flags or {}
        for f in dataclasses.fields(cls):
            if (only is not None and f.name not in only) or f.name in skip:
                continue
            title, kind = f.metadata["group"], f.metadata["kind"]
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            switch = {"nargs": "?", "const": "true"} if kind is SWITCH else {}
            shown = kind.show(_default(f)) or "''"
            groups[title].add_argument(
                flags.get(f.name, "--" + f.name.replace("_", "-")),
                dest=f.name,
                default=None,
                metavar=kind.metavar,
                help=f"{f.metadata['help']} (env SBX_{f.name.upper()}, default {shown})",
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
        """Build settings from option names to text (or typed) values, e.g. a config file's."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown}")
        return cls(**values)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    return {k.replace("-", "_"): v for k, v in data.items()}
