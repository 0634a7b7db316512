"""Build kernel images locally, named by a hash of what goes into them.

There may be no registry: the base image is pulled when possible, otherwise
made with ``debootstrap`` from the host's own Debian mirror and imported. A
tag is the hash of the build context's files (the image directory's, plus the
repository paths its ``sbx-context`` lists) and the base, so an unchanged
image is never rebuilt and a changed one never reuses a stale tag. Blocking
by design: the CLI calls it directly, the server from a thread.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..errors import GatewayError

REPO = "sbx"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PACKAGES_FILE = "/opt/sbx/packages.txt"  # written by each image's Dockerfile
MAX_PACKAGES_FILE = 1 << 20
# Lists paths of the repository (files or directories) an image's build also needs,
# e.g. the gateway's own image needs its source.
CONTEXT_FILE = "sbx-context"
_APT_SOURCES = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]


class ImageBuildError(GatewayError):
    code = "image_build_failed"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:12]


def _files(directory: Path) -> Iterator[Path]:
    """An image's files, without the bytecode an installer compiles beside them."""
    return (p for p in sorted(directory.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)


def _package_list(chunks: Iterable[bytes]) -> list[str]:
    """The package list from its archive, read at most ``MAX_PACKAGES_FILE`` into memory.

    A template's image is its tenant's: its list may be any size, or no list.
    """
    raw = bytearray()
    for chunk in chunks:
        raw += chunk
        if len(raw) > MAX_PACKAGES_FILE + 1024:
            return []
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            return member.read().decode(errors="replace").split() if member else []
    except (tarfile.TarError, IndexError):
        return []


def host_debian_mirror() -> str:
    """The Debian mirror the host's apt uses; image builds reuse the host's settings."""
    for source in _APT_SOURCES:
        if not source.is_file():
            continue
        text = source.read_text(errors="replace")
        deb822 = re.search(r"^URIs:\s*(\S+)", text, re.MULTILINE)
        one_line = re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.MULTILINE)
        found = deb822 or one_line
        if found and "security" not in found.group(1):
            return found.group(1)
    raise ImageBuildError("no Debian mirror in the host's apt sources; cannot debootstrap")


class ImageBuilder:
    """Builds the images under ``images_dir`` (one Dockerfile directory each)."""

    def __init__(
        self,
        client: docker.DockerClient,
        images_dir: Path,
        base: str = "debian:bookworm-slim",
        suite: str = "bookworm",
        progress: Callable[[str], None] = print,
    ) -> None:
        self.client = client
        self.images_dir = images_dir
        self.base = base
        self.suite = suite
        self.progress = progress

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.images_dir.glob("*/Dockerfile"))

    def tag_for(self, name: str) -> str:
        """``sbx/<name>:<hash>`` of the build context's files and the configured base."""
        directory = self.images_dir / name
        if not (directory / "Dockerfile").is_file():
            raise ImageBuildError(f"no image {name!r}: {directory}/Dockerfile is missing")
        parts = [self.base.encode()]
        for path, arcname in self._context_files(directory):
            parts += [arcname.encode(), path.read_bytes()]
        return f"{REPO}/{name}:{_digest(*parts)}"

    def _context_files(self, directory: Path) -> list[tuple[Path, str]]:
        """(file, name in the build context): the image directory, plus what it lists."""
        files = [(p, str(p.relative_to(directory))) for p in _files(directory)]
        listed = directory / CONTEXT_FILE
        if listed.is_file():
            root = self.images_dir.parent.parent  # the checkout holding gateway/images
            for line in listed.read_text().split():
                target = root / line
                found = [target] if target.is_file() else _files(target)
                files += [(p, str(p.relative_to(root))) for p in found]
        return files

    def push(self, name: str, registry: str) -> str:
        """Push a built image (a name, or its ``sbx/name:tag``) to ``registry``; return the ref.

        The registry is where a swarm's nodes pull from (docs/SCALING.md).
        """
        tag = name if ":" in name else self.tag_for(name)
        if not self.exists(tag):
            raise ImageBuildError(f"image {name} is not built; run `sbx images build {name}`")
        target = f"{registry}/{tag}"
        repository, _, version = target.rpartition(":")
        self.client.images.get(tag).tag(repository, version)
        try:
            for line in self.client.images.push(repository, version, stream=True, decode=True):
                if "error" in line:
                    raise ImageBuildError(f"pushing {name} failed: {line['error'].strip()}")
        finally:
            self.client.images.remove(target)
        self.progress(f"{name}: pushed {target}")
        return target

    def exists(self, ref: str) -> bool:
        try:
            self.client.images.get(ref)
            return True
        except docker.errors.ImageNotFound:
            return False

    def is_built(self, name: str) -> bool:
        return self.exists(self.tag_for(name))

    def build(self, name: str, force: bool = False) -> str:
        """Build one image unless an identical one exists; return its tag."""
        tag = self.tag_for(name)
        if not force and self.exists(tag):
            self.progress(f"{name}: up to date ({tag})")
            return tag
        base = self.ensure_base()
        self.progress(f"{name}: building {tag} on {base}")
        context = self._context(self.images_dir / name)
        stream = self.client.api.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            buildargs={"BASE": base},
            network_mode="host",
            rm=True,
            forcerm=True,
            decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                raise ImageBuildError(f"building {name} failed: {chunk['error'].strip()}")
            line = chunk.get("stream", "").rstrip()
            if line:
                self.progress(f"  {line}")
        self.client.images.get(tag).tag(f"{REPO}/{name}", "latest")
        self.progress(f"{name}: built {tag}")
        return tag

    def _context(self, directory: Path) -> io.BytesIO:
        """The build context: the image directory, what it lists, and the host's CA bundle."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path, arcname in self._context_files(directory):
                tar.add(path, arcname=arcname)
            tar.add(HOST_CA_BUNDLE, arcname="host-ca.crt")
        buffer.seek(0)
        return buffer

    def ensure_base(self) -> str:
        """The configured base if it is here or pullable, else a debootstrapped one."""
        if self.exists(self.base):
            return self.base
        try:
            self.progress(f"base: pulling {self.base}")
            self.client.images.pull(self.base)
            return self.base
        except docker.errors.DockerException as e:
            self.progress(f"base: cannot pull {self.base} ({str(e).splitlines()[0][:120]})")
        mirror = host_debian_mirror()
        tag = f"{REPO}/base:{self.suite}-{_digest(self.suite.encode(), mirror.encode())}"
        if self.exists(tag):
            return tag
        self._debootstrap(tag, mirror)
        return tag

    def _debootstrap(self, tag: str, mirror: str) -> None:
        if os.geteuid() != 0:
            raise ImageBuildError(
                "no base image can be pulled and making one with debootstrap needs root; "
                "run `sbx images build` as root or make the base image available"
            )
        if shutil.which("debootstrap") is None:
            raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap")
        self.progress(f"base: creating {tag} with debootstrap from the host's mirror (~1 min)")
        with tempfile.TemporaryDirectory(prefix="sbx-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            cmd = [
                "debootstrap", "--variant=minbase", "--include=ca-certificates",
                self.suite, str(rootfs), mirror,
            ]  # fmt: skip
            with subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            ) as proc:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith(("I: Retrieving", "I: Configuring", "E:", "W:")):
                        self.progress(f"  {line.rstrip()}")
            if proc.returncode != 0:
                raise ImageBuildError(f"debootstrap failed with code {proc.returncode}")
            tarball = Path(tmp) / "rootfs.tar"
            with tarfile.open(tarball, "w") as tar:
                tar.add(rootfs, arcname=".")
            repo, _, version = tag.partition(":")
            with open(tarball, "rb") as f:
                self.client.api.import_image_from_data(f, repository=repo, tag=version)
        self.progress(f"base: imported {tag}")

    def facts(self, ref: str) -> dict[str, Any]:
        """Digest and installed packages of an image, for notebooks to record.

        The package list is written into the image at build time; reading it
        from a created (never started) container costs no kernel start.
        """
        image = self.client.images.get(ref)
        container = self.client.containers.create(image.id, command=["true"])
        try:
            chunks, _ = container.get_archive(PACKAGES_FILE)
            packages = _package_list(chunks)
        except docker.errors.NotFound:
            packages = []
        finally:
            container.remove(force=True)
        return {"digest": image.id, "packages": packages}

    def list(self) -> list[dict[str, Any]]:
        """Each image: name, tag, whether it is built, size and creation time."""
        rows = []
        for name in self.names():
            tag = self.tag_for(name)
            row: dict[str, Any] = {"name": name, "tag": tag, "built": False}
            try:
                attrs = self.client.images.get(tag).attrs
                row.update(built=True, size=attrs["Size"], created=attrs["Created"])
            except docker.errors.ImageNotFound:
                pass
            rows.append(row)
        return rows
