"""How the SDK finds the gateway's URL and token, without a gateway."""

from __future__ import annotations

import pytest

from gateway.client import Client, GatewayError
from gateway.client.settings import DEFAULT_URL, ClientSettings


@pytest.fixture
def home(tmp_path) -> dict[str, str]:
    """An environment whose default data dir is empty, so no real token leaks in."""
    return {"XDG_DATA_HOME": str(tmp_path / "xdg")}


def _generated(data_dir, token: str) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "token").write_text(token + "\n")


def test_defaults_then_the_token_a_local_gateway_generated(tmp_path, home):
    assert ClientSettings.load(environ=home) == ClientSettings(DEFAULT_URL, "")
    _generated(tmp_path / "xdg" / "sandbox-gateway", "made-at-first-start")
    assert ClientSettings.load(environ=home).token == "made-at-first-start"
    _generated(tmp_path / "elsewhere", "from-data-dir")
    assert ClientSettings.load(environ={**home, "SBX_DATA_DIR": str(tmp_path / "elsewhere")}) == (
        ClientSettings(DEFAULT_URL, "from-data-dir")
    )


def test_config_file_then_env_then_arguments(tmp_path, home):
    _generated(tmp_path / "data", "generated")
    config = tmp_path / "sbx.toml"
    # The server's own keys share the file; the client leaves them alone.
    config.write_text(
        f'url = "http://file:1"\ndata-dir = "{tmp_path / "data"}"\nport = 9000\nmax-sessions = 5\n'
    )
    env = {**home, "SBX_CONFIG": str(config)}
    assert ClientSettings.load(environ=env) == ClientSettings("http://file:1", "generated")
    config.write_text(f'token = "file-token"\n{config.read_text()}')
    assert ClientSettings.load(environ=env).token == "file-token"
    env |= {"SBX_URL": "http://env:2", "SBX_TOKEN": "env-token"}
    assert ClientSettings.load(environ=env) == ClientSettings("http://env:2", "env-token")
    assert ClientSettings.load("http://arg:3", "arg-token", environ=env) == (
        ClientSettings("http://arg:3", "arg-token")
    )
    # An empty token (`--token ''`) outranks the file's and leaves the generated one, as before.
    assert ClientSettings.load(token="", environ={**home, "SBX_CONFIG": str(config)}).token == (
        "generated"
    )
    other = tmp_path / "other.toml"
    other.write_text('url = "http://other:4"\n')
    assert ClientSettings.load(config=str(other), environ=home).url == "http://other:4"


def test_an_unreadable_config_file_names_itself(tmp_path, home):
    bad = tmp_path / "bad.toml"
    bad.write_text("url = \n")
    for path in (bad, tmp_path / "missing.toml"):
        with pytest.raises(GatewayError, match=f"cannot read config file {path}") as raised:
            ClientSettings.load(environ={**home, "SBX_CONFIG": str(path)})
        assert raised.value.code == "config_error"


def test_the_sdk_fills_only_what_the_caller_left_out(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("SBX_URL", "http://env:2/")
    monkeypatch.setenv("SBX_TOKEN", "env-token")
    with Client() as client:
        assert (client.url, client.token) == ("http://env:2", "env-token")
    # An explicit empty token means none, not the configured one.
    with Client("http://arg:3", "") as client:
        assert (client.url, client.token) == ("http://arg:3", "")
        assert "Authorization" not in client.headers
