"""Package policies by name and version, and the cache URLs pip reads them from."""

from __future__ import annotations

import pytest

from gateway.egress.packages import PackagePolicy, project_of


@pytest.mark.parametrize(
    ("allow", "deny", "name", "version", "refused"),
    [
        ((), (), "Six", "1.0", None),
        ((), ("six",), "Six", "1.0", "six is on the deny list"),
        ((), ("six==1.0",), "six", "1.0", "six==1.0 is on the deny list"),
        ((), ("six==1.0",), "six", "1.1", None),
        (("numpy",), (), "six", "1.0", "six is not on the allow list"),
        (("Zope.Interface",), (), "zope_interface", "6.0", None),
        (("pandas==2.2.3",), (), "pandas", "2.2.3", None),
        (("pandas==2.2.3",), (), "pandas", "2.1.0", "pandas 2.1.0 is not an allowed version"),
        (("pandas",), ("pandas",), "pandas", "2.2.3", "pandas is on the deny list"),
    ],
)
def test_package_policies_by_name_and_version(allow, deny, name, version, refused):
    assert PackagePolicy(allow, deny).refusal(name, version) == refused


def test_cache_urls_name_their_project_and_version():
    assert project_of("/root/sbx/+simple/six/") == ("six", None, None)
    wheel = "/root/sbx/+f/472/1f391ed90541f/six-1.17.0-py2.py3-none-any.whl"
    assert project_of(wheel) == ("six", "1.17.0", "six-1.17.0-py2.py3-none-any.whl")
    sdist = "/root/sbx/+f/14f/d1ed3dd0e1a46/zope.interface-6.0.tar.gz"
    assert project_of(sdist) == ("zope.interface", "6.0", "zope.interface-6.0.tar.gz")
    assert project_of("/+api") == (None, None, None)
