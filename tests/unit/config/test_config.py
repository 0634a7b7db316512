"""Settings: every option reads the same from a flag, an env var and the config file."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.main import build_parser
from gateway.config import ConfigError, Settings
from gateway.errors import LimitExceeded

ROOT = Path(__file__).resolve().parent.parent
FIELDS = dataclasses.fields(Settings)

# One value for each option, none its default, all consistent with each other
# (swarm placement wants runc only and no egress).
SAMPLES = {
    "host": "0.0.0.0",
    "port": "9000",
    "cors_origins": "https://a.example/, https://b.example",
    "max_request_body": "32m",
    "max_anonymous_body": "32k",
    "preview_max_connections": "16",
    "preview_max_bytes": "64m",
    "max_header_size": "32k",
    "idle_connection_timeout": "30",
    "body_timeout": "5",
    "ws_ping_interval": "15",
    "reconnect_grace": "2.5",
    "replay_buffer_events": "50",
    "replay_buffer_size": "1m",
    "client_write_buffer": "32m",
    "auth": "none",
    "tokens_file": "/etc/sbx/tokens.toml",
    "token_tenant": "team",
    "tenant_max_sessions": "4",
    "tenant_max_memory": "2g",
    "tenant_max_disk": "8g",
    "tenant_max_cpus": "6.5",
    "tenant_creates_per_minute": "30",
    "secrets_key_file": "/run/keys/sbx-secrets.key",
    "max_secret_size": "1k",
    "tenant_max_snapshots": "5",
    "tenant_max_snapshot_bytes": "2g",
    "tenant_max_volumes": "4",
    "volume_size": "256m",
    "max_volume_size": "8g",
    "token": "secret",
    "policies_dir": "/etc/sbx/policies",
    "approval_timeout": "120",
    "max_sessions": "8",
    "host_max_sessions": "40",
    "host_max_memory": "20g",
    "pause_frozen_for": "45",
    "pause_memory_floor": "2g",
    "checkpoint_idle_after": "1.5",
    "checkpoint_every": "20",
    "checkpoint_max_size": "256m",
    "host_id": "host-a",
    "pool_max": "python3=6",
    "pool_shrink_after": "30",
    "template_pool_per_tenant": "2",
    "pool_imports": "numpy,pandas",
    "start_concurrency": "3",
    "start_queue": "20",
    "start_queue_per_tenant": "5",
    "start_wait": "45",
    "default_ttl": "60",
    "max_ttl": "120",
    "default_idle_timeout": "30",
    "max_idle_timeout": "90",
    "idle_action": "pause",
    "jupyter_ttl_from": "created",
    "default_memory": "256m",
    "max_memory": "1g",
    "default_cpus": "0.5",
    "max_cpus": "2",
    "default_pids": "128",
    "max_pids": "512",
    "default_disk": "512m",
    "max_disk": "2g",
    "default_timeout": "30",
    "max_timeout": "300",
    "default_output_bytes": "512k",
    "max_output_bytes": "8m",
    "session_output_bytes": "512m",
    "max_code_size": "1m",
    "max_archive_size": "512m",
    "template_build_memory": "1g",
    "template_build_disk": "2g",
    "template_build_timeout": "300",
    "template_builds": "2",
    "template_upload_disk": "1g",
    "tmp_size": "32m",
    "pool": "python3=1,bash",
    "pool_refill_concurrency": "2",
    "kernels_dir": "/srv/kernels",
    "images_dir": "/srv/images",
    "base_image": "debian:trixie-slim",
    "default_images": "python, r",
    "max_kernel_message": "16m",
    "kernel_message_guard": "false",
    "kernel_start_timeout": "30",
    "interrupt_grace": "1",
    "runtimes": "runc",
    "default_runtime": "runc",
    "seccomp_profile": "docker-default",
    "network_policies": "none",
    "egress_network": "sbx-test",
    "egress_proxy_ports": "48000-48009",
    "egress_allow_ranges": "10.1.0.0/16, 127.0.0.0/8",
    "egress_always_allow": "pkg.example:443, *.mirror.example",
    "egress_ca_file": "/etc/sbx/internal-ca.pem",
    "package_cache": "false",
    "npm_cache": "false",
    "package_allow": "numpy, pandas==2.2.3",
    "package_deny": "evil-pkg",
    "placement": "swarm",
    "registry": "manager.example:5000",
    "swarm_network": "sbx-test-net",
    "swarm_constraints": "node.role==worker, node.labels.kernels==yes",
    "swarm_poll_interval": "0.5",
    "data_dir": "/srv/sbx",
    "database_url": "postgresql://sbx@db.example/sbx",
    "advertise_url": "",  # advertise_network's alternative
    "advertise_network": "sbx-front",
    "lease_ttl": "4",
    "workers": "1",
    "reuse_port": "true",
    "end_sessions_on_stop": "true",
    "drain_timeout": "3",
    "cull_interval": "0.25",
    "history_max_age": "86400",
    "history_max_executions": "500",
    "history_prune_interval": "5",
    "log_level": "debug",
    "loop_lag_warning": "0.25",
    "webhook_timeout": "2.5",
    "webhook_attempts": "5",
    "webhook_backoff": "1",
    "webhook_concurrency": "8",
    "webhook_queue": "200",
    "webhook_log_max_age": "86400",
    "webhook_allow_ranges": "10.0.0.0/8",
    "tool_allow_ranges": "10.0.0.0/8",
    "url": "http://gateway.example:8765",
}


def values(settings: Settings, skip: tuple[str, ...] = ()) -> dict:
    return {f.name: getattr(settings, f.name) for f in FIELDS if f.name not in skip}


def serve_flag(name: str) -> str | None:
    """``sbx serve``'s flag for a setting: --token is a client's, so serve's is --admin-token."""
    return {"url": None, "token": "--admin-token"}.get(name, "--" + name.replace("_", "-"))


def test_every_option_has_a_sample():
    assert set(SAMPLES) == {f.name for f in FIELDS}


def test_flags_env_and_file_give_the_same_typed_values(tmp_path):
    flags = [part for name, raw in SAMPLES.items() if serve_flag(name)
             for part in (serve_flag(name), raw)]  # fmt: skip
    parsed_flags = build_parser().parse_args(["serve", *flags])
    from_flags = Settings.load(parsed_flags, {"SBX_URL": SAMPLES["url"]})  # a client setting
    from_env = Settings.load(None, {f"SBX_{name.upper()}": raw for name, raw in SAMPLES.items()})
    config = tmp_path / "sbx.toml"
    config.write_text("".join(f"{name} = {raw!r}\n" for name, raw in SAMPLES.items()))
    from_file = Settings.load(None, {"SBX_CONFIG": str(config)})
    assert values(from_flags) == values(from_env) == values(from_file)

    s = from_file
    assert (s.port, s.max_request_body, s.default_output_bytes) == (9000, 32 * 2**20, 512 * 2**10)
    assert s.cors_origins == ("https://a.example", "https://b.example")
    assert s.pool == {"python3": 1, "bash": 1} and s.runtimes == ("runc",)
    assert s.egress_proxy_ports == range(48000, 48010)
    assert s.egress_allow_ranges[0] == ipaddress.ip_network("10.1.0.0/16")
    assert [rule.text for rule in s.egress_always_allow] == ["pkg.example:443", "*.mirror.example"]
    assert s.seccomp_profile.json is None and s.end_sessions_on_stop is True
    assert s.default_limits.memory == 256 * 2**20 and s.max_limits.cpus == 2.0


def test_toml_native_values_read_like_text(tmp_path):
    config = tmp_path / "sbx.toml"
    config.write_text(
        'port = 9000\ntmp-size = 1048576\nruntimes = ["runc"]\nend_sessions_on_stop = true\n'
        "pool = {python3 = 3}\n"
    )
    native = Settings.load(None, {"SBX_CONFIG": str(config)})
    text = Settings.from_mapping(
        {
            "port": "9000",
            "tmp_size": "1m",
            "runtimes": "runc",
            "end_sessions_on_stop": "yes",
            "pool": "python3=3",
        }
    )
    assert values(native) == values(text)


def test_settings_built_from_typed_values_equal_those_built_from_text():
    typed = Settings.from_mapping(SAMPLES)
    assert values(Settings(**values(typed))) == values(typed)


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_a_default_as_help_shows_it_reads_back_as_the_default(f):
    kind = f.metadata["kind"]
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    assert kind.parse(kind.show(default)) == default


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("max_request_body", "lots"),
        ("tmp_size", "64q"),
        ("default_memory", "1.5.m"),
        ("default_ttl", "soon"),
        ("drain_timeout", "10s"),
        ("max_sessions", "many"),
        ("end_sessions_on_stop", "maybe"),
        ("pool", "python3=two"),
        ("egress_proxy_ports", "47099-47000"),
        ("egress_allow_ranges", "10.0.0.0/8,everything"),
        ("egress_always_allow", "pkg.example,not a host"),
        ("seccomp_profile", "/nonexistent/profile.json"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_option(name, raw):
    flag = "--" + name.replace("_", "-")
    for load in (
        lambda: Settings.load(None, {f"SBX_{name.upper()}": raw}),
        lambda: Settings.load(build_parser().parse_args(["serve", flag, raw]), {}),
    ):
        with pytest.raises(ConfigError, match=f"setting {name}="):
            load()


def test_serve_help_lists_every_option_under_its_group():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")} | {"COLUMNS": "100"}
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--help"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    group_of, group = {}, None
    for line in result.stdout.splitlines():
        if re.fullmatch(r"\S.*:", line):
            group = line[:-1]
        elif flag := re.match(r" {2}(--[a-z-]+)", line):
            group_of[flag[1]] = group
    for f in FIELDS:
        if not (flag := serve_flag(f.name)):
            continue
        assert group_of.get(flag) == f.metadata["group"], (
            f"sbx serve --help shows {flag} under {group_of.get(flag)!r}, "
            f"not under {f.metadata['group']!r}"
        )
    assert "(env SBX_MAX_REQUEST_BODY, default 16m)" in " ".join(result.stdout.split())


def parsed(*argv: str):
    return build_parser().parse_args(list(argv))


def test_token_is_always_the_token_a_client_sends(capsys):
    """--token means one thing: the gateway token this client authenticates with."""
    client_commands = (["sessions", "ls"], ["exec", "x", "1"], ["mcp"], ["e2b", "env"])
    for command in client_commands:
        assert parsed(*command, "--token", "t0k").token == "t0k", command
    # the token a gateway accepts has its own name, and a server has no --url to send to
    assert parsed("serve", "--admin-token", "adm1n").token == "adm1n"
    with pytest.raises(SystemExit):
        parsed("serve", "--url", "http://elsewhere:1")
    for command in (["images", "build"], ["images", "ls"], ["images", "push"]):
        with pytest.raises(SystemExit):
            parsed(*command, "--token", "t0k")
    capsys.readouterr()
    help_text = " ".join(
        subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--help"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        ).stdout.split()
    )  # fmt: skip
    assert "--admin-token" in help_text and "--token " not in help_text


def test_serve_token_still_works_with_a_deprecation_message(capsys):
    assert parsed("serve", "--token", "old-spelling").token == "old-spelling"
    assert "--token is deprecated here, use --admin-token" in capsys.readouterr().err


def test_mcp_over_http_refuses_a_token_it_would_not_send():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "mcp", "--http", "--port", "0", "--token", "t0k"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--token is for stdio" in result.stderr


def test_advertise_network_needs_placement_swarm_and_no_advertise_url():
    swarm = {"placement": "swarm", "runtimes": "runc", "network_policies": "none",
             "package_cache": "false", "npm_cache": "false"}  # fmt: skip
    s = Settings.from_mapping({**swarm, "advertise_network": "sbx-front"})
    assert s.advertised(8765, "10.0.1.7") == "http://10.0.1.7:8765"
    with pytest.raises(ConfigError, match="it needs placement swarm"):
        Settings.from_mapping({"advertise_network": "sbx-front"})
    with pytest.raises(ConfigError, match="no advertise_url"):
        Settings.from_mapping(
            {**swarm, "advertise_network": "sbx-front", "advertise_url": "http://a:1"}
        )


def test_settings_layers_env_over_file_and_flags_over_env(tmp_path):
    config = tmp_path / "sbx.toml"
    config.write_text('port = 9000\nmax-sessions = 5\ndefault_memory = "256m"\n')
    env = {"SBX_CONFIG": str(config), "SBX_MAX_SESSIONS": "7"}
    settings = Settings.load(None, env)
    assert settings.port == 9000 and settings.max_sessions == 7
    assert settings.default_limits.memory == 256 * 2**20
    with pytest.raises(ConfigError, match="max_sessions"):
        Settings.load(None, {"SBX_MAX_SESSIONS": "many"})
    with pytest.raises(LimitExceeded):
        Settings.load(None, {"SBX_DEFAULT_MEMORY": "64g"})


def test_pool_imports_are_module_names_and_pause_and_checkpoint_times_are_not_negative():
    assert Settings.from_mapping({"pool_imports": "numpy, pandas.io"}).pool_imports == (
        "numpy",
        "pandas.io",
    )
    for value in ("os; import shutil", "../x", "numpy-extra"):
        with pytest.raises(ConfigError, match="is not a Python module name"):
            Settings.from_mapping({"pool_imports": value})
    for name in ("pause_frozen_for", "checkpoint_every", "checkpoint_idle_after"):
        with pytest.raises(ConfigError, match="cannot be < 0"):
            Settings.from_mapping({name: "-1"})
