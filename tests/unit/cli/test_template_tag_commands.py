"""``sbx templates tag / untag / tags`` and ``build --tag``: what they ask the client for."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def tag_template(self, name, version, tags):
        self.calls.append(("tag", name, version, tags))
        return {"name": name, "version": 2, "tags": tags}

    def untag_template(self, name, tags):
        self.calls.append(("untag", name, tags))

    def template_tags(self, name):
        self.calls.append(("tags", name))
        return [{"tag": "prod", "version": 2, "build_id": "b", "created_at": 1.0}]

    def build_template(self, name, dockerfile, context, kernel=None, tags=None):
        self.calls.append(("build", name, tags))
        return {"id": "b", "name": name, "version": 3, "status": "building"}


@pytest.fixture
def client(use_client):
    return use_client(FakeClient())


def test_tag_moves_tags_to_a_version_by_number_or_by_tag(client, sbx, capsys):
    assert sbx("templates", "tag", "geo:2", "prod", "stable") == 0
    assert sbx("templates", "tag", "geo:prod", "live") == 0
    assert client.calls == [("tag", "geo", 2, ["prod", "stable"]), ("tag", "geo", "prod", ["live"])]
    assert "geo:2 prod stable" in capsys.readouterr().out


def test_tag_needs_the_version_it_moves_tags_to(client, sbx):
    with pytest.raises(BadRequest, match="NAME:VERSION"):
        sbx("templates", "tag", "geo", "prod")


def test_untag_and_tags(client, sbx, capsys):
    assert sbx("templates", "untag", "geo", "prod") == 0
    assert sbx("templates", "tags", "geo") == 0
    assert client.calls == [("untag", "geo", ["prod"]), ("tags", "geo")]
    assert capsys.readouterr().out.split() == ["geo:prod", "2"]


def test_a_build_takes_tags(client, sbx, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM sbx/python\n")
    argv = ["templates", "build", "geo", "--tag", "v1", "--tag", "stable", "--no-wait"]
    assert sbx(*argv, "-f", str(tmp_path / "Dockerfile")) == 0
    assert client.calls == [("build", "geo", ["v1", "stable"])]
