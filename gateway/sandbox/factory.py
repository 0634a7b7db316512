"""Where a session's sandbox comes from: the request checked, the container started.

``Sandboxes`` turns a create request into a ``Session`` (checked against the
kernelspec and the server's limits), gives a session its ``Kernel`` and
``Workspace``, and starts its container. The session manager uses it for
cold starts, the warm pool ahead of time, and recovery to rebuild what a
restarted gateway takes over.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ..config import Settings
from ..errors import BadRequest, EngineUnavailable
from ..execution.kernel import Kernel
from ..sessions.model import Session
from ..validation import env_vars, image_ref, metadata_dict, seconds
from .docker.placement import Placement
from .files import AsyncWorkspace
from .images import ImageBuilder
from .isolation.manager import IsolationManager
from .kernelspecs import KernelSpecs


class Sandboxes:
    """Makes sessions' sandboxes: validated sessions, kernels, workspaces, containers."""

    def __init__(
        self,
        settings: Settings,
        client: docker.DockerClient,
        kernelspecs: KernelSpecs,
        images: ImageBuilder,
        isolation: IsolationManager,
        placement: Placement,
    ) -> None:
        self.settings = settings
        self.docker = client
        self.kernelspecs = kernelspecs
        self.images = images
        self.isolation = isolation
        self.placement = placement
        self.sessions_dir = Path(settings.data_dir) / "sessions"
        self.gateway_id = ""  # set once the store is open

    def new_session(self, request: dict[str, Any], tenant: str) -> Session:
        """A session as a create request asks for it, checked against the server's limits."""
        s = self.settings
        kernel_name = request.get("kernel") or "python3"
        if not isinstance(kernel_name, str):
            raise BadRequest("kernel must be a kernelspec name such as 'python3'")
        sandbox = self.kernelspecs.sandbox(kernel_name)
        image = image_ref(request.get("image")) or self.kernel_image(kernel_name)
        session_id = request.get("id")
        if session_id is not None:
            try:
                session_id = str(uuid.UUID(str(session_id)))
            except ValueError:
                raise BadRequest("id must be a UUID") from None
        runtime, network = self.isolation.choose(request, sandbox)
        return Session(
            kernel_name=kernel_name,
            image=image,
            limits=s.default_limits.resolve(request.get("limits"), s.max_limits),
            ttl=seconds(request.get("ttl"), "ttl", s.default_ttl, s.max_ttl),
            idle_timeout=seconds(
                request.get("idle_timeout"),
                "idle_timeout",
                s.default_idle_timeout,
                s.max_idle_timeout,
            ),
            env=env_vars(request.get("env")),
            metadata=metadata_dict(request.get("metadata")),
            session_id=session_id,
            start_timeout=seconds(
                request.get("start_timeout"),
                "start_timeout",
                s.kernel_start_timeout,
                max(s.kernel_start_timeout, 600.0),
            ),
            runtime=runtime,
            network=network,
            tenant=tenant,
        )

    def kernel_image(self, kernel_name: str) -> str:
        """The tag of the image a kernel's sessions run in unless they name another."""
        return self.images.tag_for(self.kernelspecs.sandbox(kernel_name).get("image", kernel_name))

    def session_dir(self, session_id: str) -> Path:
        return self.sessions_dir / session_id

    def equip(self, session: Session) -> None:
        """Give a session its Kernel and Workspace objects (no container is started)."""
        sandbox_cfg = self.kernelspecs.sandbox(session.kernel_name)
        spec = self.placement.sandbox(session, sandbox_cfg, self.gateway_id)
        session.workspace = AsyncWorkspace(self.placement.workspace(session, spec))
        session.kernel = Kernel(
            session.kernel_name,
            self.kernelspecs.manager,
            spec,
            session.start_timeout or self.settings.kernel_start_timeout,
        )

    async def _check_image(self, session: Session) -> None:
        """Refuse a named image this gateway does not have: the client's mistake, a 400."""
        if session.image == self.kernel_image(session.kernel_name):
            return  # the kernel's own image not built yet is the operator's (503 image_not_built)
        try:
            found = await asyncio.to_thread(self.images.exists, session.image)
        except docker.errors.DockerException as e:
            raise EngineUnavailable(f"the container engine failed: {e}") from e
        if not found:
            raise BadRequest(
                f"there is no image {session.image} on this gateway; GET /v1/kernels lists the "
                "built ones, or ask for image null to get the kernel's own"
            )

    async def launch(self, session: Session) -> None:
        """Start the session's container and wait for its kernel; fill in what it reports."""
        await self._check_image(session)
        session.isolation = await self.isolation.prepare(
            session.id, session.runtime, session.network, session.limits.pids
        )
        self.equip(session)
        assert session.kernel is not None
        await self.placement.prepare(session, session.kernel.sandbox)
        try:
            await session.kernel.start()
            facts = await self.placement.image_facts(session)
        except docker.errors.DockerException as e:
            raise EngineUnavailable(f"the container engine failed: {e}") from e
        session.image_digest = facts["digest"]
        session.packages = facts["packages"]
        session.language_info = (await session.kernel.kernel_info()).get("language_info", {})
        session.display_name = self.kernelspecs.get(session.kernel_name).display_name
