"""Where the SDK finds the gateway and the token to send, with the standard library only.

The server's settings (``gateway.config``) would bring the sandbox modules and
Docker along; the SDK reads the same layers for the few keys it needs:
defaults < the TOML file named by ``SBX_CONFIG`` < ``SBX_URL`` / ``SBX_TOKEN``
/ ``SBX_DATA_DIR`` < explicit arguments. With no token in any layer, the one
a local gateway generated in its data directory is sent. The file's other
keys are the server's, and left to it.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8765"
_KEYS = ("url", "token", "data_dir")


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """The gateway's URL and the API token to send it ("" for none)."""

    url: str = DEFAULT_URL
    token: str = ""

    @classmethod
    def load(
        cls,
        url: str | None = None,
        token: str | None = None,
        *,
        config: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ClientSettings:
        """Merge the layers, None meaning not given; with a token in none, the generated one."""
        environ = os.environ if environ is None else environ
        values: dict[str, str] = {}
        config = config or environ.get("SBX_CONFIG")
        if config:
            values.update(read_config_file(Path(config)))
        for key in _KEYS:
            if f"SBX_{key.upper()}" in environ:
                values[key] = environ[f"SBX_{key.upper()}"]
        values.update({k: v for k, v in (("url", url), ("token", token)) if v is not None})
        data_dir = Path(values.get("data_dir") or default_data_dir(environ))
        url = values.get("url", DEFAULT_URL)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"the gateway's URL (--url, SBX_URL or url in the config file) must be an "
                f"http:// or https:// URL, not {url!r}"
            )
        return cls(
            url=url,
            token=values.get("token") or generated_token(data_dir),
        )


def read_config_file(path: Path) -> dict[str, str]:
    """The client's keys of a gateway config file, as text (``data-dir`` spells ``data_dir``)."""
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    keys = {k.replace("-", "_"): v for k, v in data.items()}
    return {k: str(keys[k]) for k in _KEYS if k in keys}


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """Where a gateway keeps its data when told nothing: the XDG data home."""
    base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sandbox-gateway"


def generated_token(data_dir: Path) -> str:
    """The token a local gateway made on its first start, or "" when there is none."""
    try:
        return (data_dir / "token").read_text().strip()
    except OSError:
        return ""
