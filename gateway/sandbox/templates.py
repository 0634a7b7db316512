"""Template images built on this host from a tenant's Dockerfile, then hardened.

Two builds per template, both with the engine's classic builder, no network
(a RUN step reaches nothing: not the gateway, not a registry), one CPU, a
memory cap, and a watchdog that kills a step running past the time bound
or writing more than the disk bound. The first is the tenant's Dockerfile
(``dockerfiles.resolve`` has pinned every ``FROM`` to a local image); the
second is the gateway's own layer on top: setuid/setgid bits and file
capabilities stripped, the sandbox's user, ``/workspace``, and the kernel
image's entrypoint and command back, whatever the Dockerfile set. Run
time hardening (``docker/provisioner.py``) does not depend on this layer;
it makes the image hold nothing a hardened sandbox could misuse either.
Blocking by design: the sessions layer runs it on threads of its own.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shlex
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.api.build
import docker.errors
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from ..errors import BadRequest, GatewayError
from .dockerfiles import OWN_LABELS
from .wheels import (
    DIR,
    DIRECTIVE,
    HINT,
    PROBE,
    PipRefused,
    Target,
    Wheels,
    install_lines,
    parse_pip,
)

DOCKERFILE = ".sbx-template.Dockerfile"  # the name the resolved Dockerfile takes in the context
LABEL = "sbx.template"
CGROUP = "sbx-template-builds"  # the cgroup every build step runs under
CGROUPS = Path("/sys/fs/cgroup")
MAX_LINE = 4096  # characters of one line of a build's log
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING = re.compile(r" ---> Running in ([0-9a-f]{12,64})")
_LAYER = re.compile(r" ---> ([0-9a-f]{12,64})")  # the image a step committed
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the builder colours a step's stderr
_BUILDER = ("Step ", " ---> ", "Removing intermediate container", "Successfully ")
# Strips what a hardened sandbox must not find: setuid/setgid bits, file capabilities.
_STRIP_CAPS = (
    "import os\n"
    "for top, dirs, files in os.walk('/'):\n"
    "    dirs[:] = [d for d in dirs if top + d not in ('/proc', '/sys', '/dev')]\n"
    "    for f in files:\n"
    "        p = os.path.join(top, f)\n"
    "        try:\n"
    "            if 'security.capability' in os.listxattr(p, follow_symlinks=False):\n"
    "                os.removexattr(p, 'security.capability', follow_symlinks=False)\n"
    "        except OSError:\n"
    "            pass\n"
)


class TemplateContextRefused(BadRequest):
    """A build context this host will not build from."""

    code = "template_context_refused"


class BuildFailed(GatewayError):
    """A template build that failed: at which step, and why (``reason``)."""

    code = "template_build_failed"

    def __init__(self, step: str, reason: str) -> None:
        super().__init__(f"{step}: {reason}" if step else reason)
        self.step = step
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class BuildLimits:
    """What one build may take: memory and disk in bytes, time in seconds, one CPU core."""

    memory: int = 2 << 30
    disk: int = 4 << 30  # written by any one step, and added by the whole build
    timeout: float = 900.0
    context: int = 64 << 20  # the build context, unpacked
    context_files: int = 10_000
    pids: int = 512  # processes of every build step at once, together


def context_tar(
    context: bytes | None,
    dockerfile: str,
    limits: BuildLimits,
    wheels: dict[str, Path] | None = None,
) -> bytes:
    """The tenant's context (a tar, gzip allowed) with the resolved Dockerfile added.

    Only files, directories and links inside the context; bounded in size and
    count before anything is unpacked (a header's size is read, not trusted
    after the fact). ``wheels``: the files the gateway fetched, by their name
    in the context (under ``DIR``, where the tenant's own files are dropped).
    """
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        if context:
            _add_tar(context, tar, limits, [0, 0], "")
        for name, path in (wheels or {}).items():
            tar.add(path, arcname=name)
        info = tarfile.TarInfo(DOCKERFILE)
        raw = dockerfile.encode()
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


def merge_contexts(parts: dict[str, bytes], limits: BuildLimits) -> bytes:
    """Several tars (gzip allowed) as one, each under a directory named by its key."""
    out = io.BytesIO()
    seen = [0, 0]  # files and bytes so far, over every part
    with tarfile.open(fileobj=out, mode="w") as tar:
        for prefix, raw in parts.items():
            _add_tar(raw, tar, limits, seen, f"{prefix}/")
    return out.getvalue()


def _add_tar(
    raw: bytes, into: tarfile.TarFile, limits: BuildLimits, seen: list[int], prefix: str
) -> None:
    """Copy a tar's members into ``into`` under ``prefix``, counting them in ``seen``."""
    try:
        source = tarfile.open(fileobj=io.BytesIO(raw), mode="r:*")
    except tarfile.TarError as e:
        raise TemplateContextRefused(f"the build context is not a tar archive: {e}") from e
    with source:
        for member in _members(source):
            seen[0] += 1
            seen[1] += member.size
            if seen[0] > limits.context_files or seen[1] > limits.context:
                raise TemplateContextRefused(
                    f"the build context is larger than {limits.context >> 20} MiB or "
                    f"{limits.context_files} files; send only what the Dockerfile copies"
                )
            data = source.extractfile(member) if member.isfile() else None
            member.name = prefix + member.name
            into.addfile(member, data)


def _members(source: tarfile.TarFile):
    while True:
        try:
            member = source.next()
        except tarfile.TarError as e:
            raise TemplateContextRefused(f"the build context is not a readable tar: {e}") from e
        if member is None:
            return
        name = member.name
        if name.startswith("/") or ".." in name.split("/") or "\x00" in name:
            raise TemplateContextRefused(
                f"the build context holds a path outside it: {name[:200]!r}"
            )
        if not (member.isfile() or member.isdir() or member.issym()):
            raise TemplateContextRefused(
                f"the build context holds {name[:200]!r}, which is neither a file, a directory "
                "nor a symbolic link"
            )
        parts = [p for p in name.split("/") if p not in ("", ".")]  # './x' is 'x' unpacked
        if parts[:1] == [DOCKERFILE] or parts[:1] == [DIR]:
            continue
        yield member


class TemplateEngine:
    """Builds, inspects and removes template images with the docker SDK (blocking).

    The classic builder takes no pids limit, so every build step runs under
    one cgroup of the engine's (``CGROUP``) whose ``pids.max`` this sets: a
    step that forks without end meets it, not the host's pid table.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        limits: BuildLimits,
        cgroups: Path = CGROUPS,
        wheels: Wheels | None = None,
    ) -> None:
        self.client = client
        self.limits = limits
        self.cgroups = cgroups
        self.wheels = wheels or Wheels()
        self.targets: dict[str, Target] = {}  # what wheels must run on, by kernel image
        self.api = _CgroupBuilds(client.api)
        self.watching: set[_Watchdog] = set()  # the watchdogs of the builds under way

    def cancel(self) -> None:
        """Stop every build under way at its running step (the gateway is stopping)."""
        for watch in list(self.watching):
            watch.verdict = watch.verdict or "the gateway stopped during the build"
            watch.deadline = 0.0
        self.wheels.cancel()

    def _bound_pids(self) -> None:
        """Make the builds' cgroup and set its pids bound (cgroup v1 or v2); or refuse."""
        v1 = self.cgroups / "pids"
        group = (v1 if v1.is_dir() else self.cgroups) / CGROUP
        try:
            group.mkdir(exist_ok=True)
            (group / "pids.max").write_text(f"{self.limits.pids}\n")
        except OSError as e:
            raise BuildFailed(
                "",
                f"template builds need a pids-limited cgroup ({group}), which could not be "
                f"set up: {e.strerror}; run the gateway as root",
            ) from None

    def own_labels(self, ref: str) -> list[str]:
        """The image's label keys named as the gateway's own (none when it is gone)."""
        try:
            labels = self.client.api.inspect_image(ref)["Config"].get("Labels")
        except docker.errors.ImageNotFound:
            return []
        return gateways_labels(labels)

    def image_id(self, ref: str) -> str | None:
        try:
            return self.client.images.get(ref).id
        except docker.errors.ImageNotFound:
            return None

    def build(
        self,
        tag: str,
        dockerfile: str,
        context: bytes | None,
        kernel_image: str,
        user: str,
        log: Callable[[str], None],
        refusal: Callable[[str, str], str | None] | None = None,
    ) -> str:
        """The tenant's image, then the gateway's layer as ``tag``; return its id.

        ``refusal``: why the tenant's package policy refuses a wheel (name, version), or None.
        """
        self._bound_pids()
        stage = f"{tag}-user"
        deadline = time.monotonic() + self.limits.timeout
        try:
            with tempfile.TemporaryDirectory(prefix="sbx-template-wheels-") as fetched:
                dockerfile, wheels = self._pip_steps(
                    dockerfile, kernel_image, Path(fetched), log, deadline, refusal
                )
                tar = context_tar(context, dockerfile, self.limits, wheels)
            self._build(stage, tar, log, "", deadline)
            kernel = self.client.images.get(kernel_image).attrs["Config"]
            layer = _gateway_layer(stage, kernel, user)
            layer_context = context_tar(None, layer, self.limits)
            self._build(tag, layer_context, log, "gateway layer", deadline)
        finally:
            self.remove(stage)
        left = self._privileged(tag)
        if left:
            self.remove(tag)
            raise BuildFailed(
                "gateway layer",
                f"the image still holds setuid/setgid files or file capabilities "
                f"({', '.join(left)}): the Dockerfile changed the tools the gateway's layer "
                "strips them with; leave /bin/sh, find and chmod as the base has them",
            )
        image = self.client.images.get(tag)
        own = gateways_labels(image.attrs["Config"].get("Labels"))
        if own:
            self.remove(tag)
            raise BuildFailed(
                "",
                f"the image carries labels named as the gateway's own ({', '.join(own)}): "
                f"a sandbox inherits them; name yours without {OWN_LABELS!r}",
            )
        base = self.client.images.get(kernel_image).attrs.get("Size", 0)
        if image.attrs.get("Size", 0) - base > self.limits.disk:
            self.remove(tag)
            raise BuildFailed(
                "", f"the image grew past the disk bound of {self.limits.disk >> 20} MiB"
            )
        return image.id

    def _pip_steps(
        self,
        dockerfile: str,
        kernel_image: str,
        into: Path,
        log: Callable[[str], None],
        deadline: float,
        refusal: Callable[[str, str], str | None] | None = None,
    ) -> tuple[str, dict[str, Path]]:
        """Each ``# sbx: pip install`` line as the lines installing its wheels, fetched here.

        Every step's downloads share the wheels' byte and time bounds, within the build's.
        """
        lines, out, wheels = dockerfile.splitlines(), [], {}
        steps = used = 0
        until = min(deadline, time.monotonic() + self.wheels.limits.timeout)
        for line in lines:
            if not line.startswith(DIRECTIVE):
                out.append(line)
                continue
            step = parse_pip(line[len(DIRECTIVE) :])
            what = f"pip install {' '.join(step.specs)}"[:200]
            dest = into / str(steps)
            dest.mkdir()
            try:
                target = self._target(kernel_image)
                log(f"{what}: fetching wheels for {target}")
                left = self.wheels.limits.bytes - used
                for wheel in self.wheels.fetch(step, target, dest, left, until - time.monotonic()):
                    name, version, *_ = parse_wheel_filename(wheel.name)
                    refused = refusal(name, str(version)) if refusal else None
                    if refused:
                        raise PipRefused(f"{refused} of your package policy")
                    size = wheel.stat().st_size
                    used += size
                    log(f"{what}: {wheel.name} ({size} bytes)")
                    wheels[f"{DIR}/{steps}/{wheel.name}"] = wheel
            except PipRefused as e:
                raise BuildFailed(what, e.message) from None
            except InvalidWheelFilename as e:
                raise BuildFailed(what, f"the index served an unreadable wheel: {e}") from None
            out += install_lines(step, steps)
            steps += 1
        return "\n".join(out) + "\n", wheels

    def _target(self, kernel_image: str) -> Target:
        """The Python and platform of a kernel image, asked of it once per image id (no network)."""
        key = self.image_id(kernel_image) or kernel_image
        if key not in self.targets:
            try:
                said = self.client.containers.run(
                    kernel_image, entrypoint=["python3", "-c", PROBE],
                    network_disabled=True, remove=True, user="65534:65534",
                )  # fmt: skip
                self.targets[key] = Target.parse(said.decode())
            except (docker.errors.DockerException, ValueError) as e:
                raise PipRefused(
                    f"the image runs no Python pip could install for: {str(e)[:300]}"
                ) from None
        return self.targets[key]

    def _build(
        self, tag: str, context: bytes, log: Callable[[str], None], phase: str, deadline: float
    ) -> None:
        step = [phase]
        watch = _Watchdog(self.client, self.limits, deadline)
        self.watching.add(watch)
        watch.start()
        try:
            self._stream(tag, context, log, phase, step, watch)
            if watch.verdict:
                raise BuildFailed(step[0], watch.verdict)
        except BuildFailed:
            self._drop_untagged(watch.layers)
            raise
        finally:
            watch.stop()
            self.watching.discard(watch)

    def _stream(
        self,
        tag: str,
        context: bytes,
        log: Callable[[str], None],
        phase: str,
        step: list[str],
        watch: _Watchdog,
    ) -> None:
        """Run one build, following its output; a failed step raises ``BuildFailed``."""
        try:
            stream = self.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                dockerfile=DOCKERFILE,
                tag=tag,
                network_mode="none",
                pull=False,
                nocache=True,  # a layer cached from another tenant's build would tell of it
                rm=True,
                forcerm=True,
                decode=True,
                use_config_proxy=False,
                container_limits={
                    "memory": self.limits.memory,
                    "memswap": self.limits.memory,
                    "cpusetcpus": "0",
                },
                labels={LABEL: tag},
            )
            said: list[str] = []  # the step's own last line of output
            for chunk in stream:
                if "error" in chunk:
                    error = chunk["error"].strip()
                    if said:
                        error += f"; its last output: {said[-1][:500]}"
                    if "pip install" in step[0] and "--no-index" not in step[0]:
                        error += f" ({HINT})"
                    raise BuildFailed(step[0], watch.verdict or error)
                for line in _COLOUR.sub("", chunk.get("stream", "")).splitlines():
                    self._note(line, step, watch, phase, log)
                    if line.strip() and not line.startswith(_BUILDER):
                        said[:] = [line.strip()]
        except docker.errors.APIError as e:
            raise BuildFailed(step[0], watch.verdict or str(e.explanation or e)) from None

    def _drop_untagged(self, layers: list[str]) -> None:
        """Remove what a failed build committed: its steps' images no tag names.

        The ids come from the build's output, which its steps can also print,
        so only an untagged image goes, never forced (one a container uses stays).
        """
        for layer in reversed(layers):
            try:
                if not self.client.api.inspect_image(layer).get("RepoTags"):
                    self.client.api.remove_image(layer)
            except docker.errors.APIError:
                pass

    @staticmethod
    def _note(line: str, step: list[str], watch: _Watchdog, phase: str, log: Callable) -> None:
        line = line.rstrip()
        if not line:
            return
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE] + " [cut]"
        log(line)
        found = _STEP.match(line)
        if found:
            step[0] = (
                f"{phase + ' ' if phase else ''}step {found.group(1)} ({found.group(3)[:200]})"
            )
            watch.container, watch.awaiting = None, True
        layer = _LAYER.fullmatch(line)
        if layer:
            watch.layers.append(layer.group(1))
        running = _RUNNING.fullmatch(line)
        if running and watch.awaiting:  # the builder's own line comes before the step's output
            watch.container, watch.awaiting = running.group(1), False

    def _privileged(self, tag: str, most: int = 5) -> list[str]:
        """Files of the built image that are setuid, setgid or carry file capabilities.

        Read from the engine's export of its filesystem, not with the image's
        own tools, which the Dockerfile may have replaced.
        """
        container = self.client.api.create_container(tag, entrypoint=["/"], network_disabled=True)
        found: list[str] = []
        try:
            stream = _Chunks(self.client.api.export(container["Id"]))
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    caps = "SCHILY.xattr.security.capability" in member.pax_headers
                    if caps or (member.isfile() and member.mode & 0o6000):
                        found.append("/" + member.name)
                        if len(found) == most:
                            break
        finally:
            self.client.api.remove_container(container["Id"], force=True)
        return found

    def remove(self, ref: str) -> bool:
        """Remove an image; False when a container still uses it (it stays)."""
        try:
            self.client.images.remove(ref, noprune=False)
        except docker.errors.ImageNotFound:
            return True
        except docker.errors.APIError as e:
            if e.status_code == 409:
                return False
            raise
        return True


def gateways_labels(labels: dict[str, str] | None) -> list[str]:
    """An image's label keys named as the gateway's own (bar the template's own label).

    The line check refuses them in a Dockerfile, but it has missed keys the engine put
    together (variables, quotes, escapes) and a base built before it knew of one passes
    its labels on: the image itself is the last word.
    """
    return sorted(
        key[:64] for key in labels or {} if key.lower().startswith(OWN_LABELS) and key != LABEL
    )


def _gateway_layer(stage: str, kernel: dict, user: str) -> str:
    """The Dockerfile of the gateway's layer over the tenant's image ``stage``."""
    uid, _, gid = user.partition(":")
    strip = (
        "find / -xdev \\( -perm -4000 -o -perm -2000 \\) -type f -exec chmod ug-s {} + ; "
        f"if command -v python3 >/dev/null; then python3 -c {shlex.quote(_STRIP_CAPS)}; fi; "
    )
    lines = [
        f"FROM {stage}",
        "USER 0:0",
        # The exec form: a SHELL the Dockerfile set does not run it. The session's workspace
        # is mounted over /workspace: the image's is never seen, and a link there is gone.
        "RUN "
        + json.dumps(
            [
                "/bin/sh",
                "-c",
                strip + f"rm -rf /workspace && mkdir /workspace && chown {uid}:{gid} /workspace",
            ]
        ),
        f"USER {user}",
        "WORKDIR /workspace",
        f"ENTRYPOINT {json.dumps(kernel.get('Entrypoint') or [])}",
        f"CMD {json.dumps(kernel.get('Cmd') or [])}",
    ]
    return "\n".join(lines) + "\n"


class _CgroupBuilds:
    """The client's API whose build requests name the builds' cgroup as their parent.

    The SDK's ``build`` passes no cgroup parent, the engine's API takes one:
    the SDK's own ``build`` is run with this as its client, everything but the
    request itself delegated (the shared client is left as it is).
    """

    def __init__(self, api: docker.APIClient) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def _post(self, url: str, **kw: Any) -> Any:
        kw["params"] = {**(kw.get("params") or {}), "cgroupparent": f"/{CGROUP}"}
        return self._api._post(url, **kw)

    def build(self, **kw: Any) -> Any:
        return docker.api.build.BuildApiMixin.build(self, **kw)  # type: ignore[arg-type]


class _Chunks(io.RawIOBase):
    """A stream of byte chunks (the engine's export) read as a file, in order."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            self.pending = next(self.chunks, b"")
            if not self.pending:
                return 0
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        self.pending = self.pending[size:]
        return size


class _Watchdog:
    """Kills the running step of a build past its time or writing past its disk bound."""

    def __init__(self, client: docker.DockerClient, limits: BuildLimits, deadline: float) -> None:
        self.client = client
        self.limits = limits
        self.deadline = deadline  # time.monotonic() past which the build is stopped
        self.container: str | None = None
        self.awaiting = False  # a step began; its container is not named yet
        self.layers: list[str] = []  # the images the build's steps committed
        self.verdict: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sbx-template-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            if time.monotonic() > self.deadline:
                self._kill(
                    f"the build ran past its time bound of {self.limits.timeout:g} s "
                    "and was stopped"
                )
                continue
            if self.container is None:
                continue
            try:
                found = self.client.api.containers(
                    all=True, size=True, filters={"id": self.container}
                )
            except docker.errors.APIError:
                continue
            size = found[0].get("SizeRw") if found else None
            if size is not None and size > self.limits.disk:
                self._kill(
                    f"the step wrote more than the disk bound of {self.limits.disk >> 20} MiB "
                    "and was stopped"
                )

    def _kill(self, verdict: str) -> None:
        self.verdict = self.verdict or verdict
        if self.container is None:
            return
        try:  # only ever a step of a build: a container under the builds' cgroup
            seen = self.client.api.inspect_container(self.container)
            if seen.get("HostConfig", {}).get("CgroupParent") == f"/{CGROUP}":
                self.client.api.kill(self.container)
        except docker.errors.APIError:
            pass
