"""An image's package list is read bounded: a template's image is the tenant's to fill."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from gateway.sandbox.images import ImageBuilder


class Container:
    def __init__(self, chunks) -> None:
        self.chunks = chunks

    def get_archive(self, path):
        return self.chunks, {}

    def remove(self, force=False):
        pass


class Client:
    def __init__(self, chunks) -> None:
        self.container = Container(chunks)
        self.images = self
        self.containers = self
        self.id = "sha256:x"

    def get(self, ref):
        return self

    def create(self, image, command):
        return self.container


def test_a_package_list_of_gigabytes_is_not_read_into_the_gateway():
    pulled = []

    def endless():  # a tar header saying 4 GiB, then zeros for as long as they are read
        info = tarfile.TarInfo("packages.txt")
        info.size = 4 << 30
        yield info.tobuf()
        while True:
            pulled.append(1 << 20)
            yield b"numpy==1\n" * (1 << 17)

    builder = ImageBuilder(Client(endless()), Path("/nowhere"))
    facts = builder.facts("sbxt/x:1")
    assert sum(pulled) <= 4 << 20
    assert facts["packages"] == []


def test_a_package_list_of_a_normal_size_is_read():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = b"numpy==1\npandas==2\n"
        info = tarfile.TarInfo("packages.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    raw = out.getvalue()
    builder = ImageBuilder(Client(iter([raw[:100], raw[100:]])), Path("/nowhere"))
    assert builder.facts("sbx/python:1")["packages"] == ["numpy==1", "pandas==2"]
