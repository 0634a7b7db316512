"""npm package policies by name and version, and the registry URLs they are read from."""

from __future__ import annotations

import pytest

from gateway.egress.npm import project_of
from gateway.egress.packages import PackagePolicy


@pytest.mark.parametrize(
    ("allow", "deny", "name", "version", "refused"),
    [
        ((), (), "is-number", "7.0.0", None),
        ((), ("is-number",), "is-number", "7.0.0", "is-number is on the deny list"),
        ((), ("is-number@7.0.0",), "is-number", "7.0.0", "is-number@7.0.0 is on the deny list"),
        ((), ("is-number@7.0.0",), "is-number", "6.0.0", None),
        ((), ("lodash-merge",), "lodash.merge", "4.6.2", None),  # npm does not fold . and -
        (("@types/node",), (), "@types/node", "22.0.0", None),
        (
            ("@types/node@22",),
            (),
            "@types/node",
            "21.0.0",
            "@types/node 21.0.0 is not an allowed version",
        ),
        (("left-pad",), (), "is-number", "7.0.0", "is-number is not on the allow list"),
    ],
)
def test_npm_policies_by_name_and_version(allow, deny, name, version, refused):
    assert PackagePolicy(allow, deny).refusal(name, version, npm=True) == refused


def test_registry_urls_name_their_package_and_version():
    assert project_of("/is-number") == ("is-number", None, None)
    assert project_of("/is-number/-/is-number-7.0.0.tgz") == (
        "is-number", "7.0.0", "is-number-7.0.0.tgz",
    )  # fmt: skip
    assert project_of("/@types/node/-/node-22.0.0-rc.1.tgz") == (
        "@types/node", "22.0.0-rc.1", "node-22.0.0-rc.1.tgz",
    )  # fmt: skip
    assert project_of("/@types/node") == ("@types/node", None, None)
    assert project_of("/-/ping") == (None, None, None)
