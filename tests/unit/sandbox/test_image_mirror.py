"""The Debian mirror kernel images are built from: the host's own apt sources."""

from __future__ import annotations

from gateway.sandbox.images import host_debian_mirror


def test_host_mirror_is_read_from_apt_sources():
    assert host_debian_mirror().startswith(("http://", "https://"))
