"""One sandbox lifecycle for every session: build, launch, adopt, tear down.

New sessions, the warm pool and recovery all go through ``SandboxLifecycle``,
so a sandbox is made, started, reattached after a gateway restart and
removed one way only::

    new_session -> launch (isolation, spec, prepare, kernel start, facts) -> ... -> teardown
    from_record -> adopt  (isolation, spec, kernel adopt, reattach)        -> ... -> teardown
    from_record -> adopt_paused (isolation, spec, reattach) -> resume      -> ... -> teardown
    paused session + pooled sandbox -> move_in (copy files, swap dirs, adopt) -> ... -> teardown

It turns a session into the plain ``SandboxRequest`` the placement takes, and
the placement's answer into the session's ``Kernel`` and workspace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from ..access.secrets import SecretVault
from ..egress import Brokering
from ..egress.packages import PackageGate
from ..errors import BadRequest, EngineUnavailable, NotAllowed
from ..execution.kernel import Kernel
from ..sandbox.base import ENGINE_ERRORS, Placement, SandboxRequest
from ..sandbox.images import ImageBuilder
from ..sandbox.isolation.manager import IsolationManager
from ..sandbox.kernelspecs import KernelSpecs
from ..validation import seconds
from ..workspace.files import AsyncWorkspace
from .model import Session
from .options import SessionOptions
from .requests import FREEZE, CreateSession

log = logging.getLogger(__name__)


class SandboxLifecycle:
    """Makes, starts, adopts and removes sessions' sandboxes."""

    def __init__(
        self,
        settings: SessionOptions,
        kernelspecs: KernelSpecs,
        images: ImageBuilder,
        isolation: IsolationManager,
        placement: Placement,
        secrets: SecretVault | None = None,
        packages: dict[str, PackageGate] | None = None,
    ) -> None:
        """``secrets``: where sessions' sealed secrets come from; ``packages``: the package
        caches' gates, by the language of the kernels they serve. None offers none."""
        self.settings = settings
        self.secrets = secrets
        self.packages = packages or {}
        self.kernelspecs = kernelspecs
        self.images = images
        self.isolation = isolation
        self.placement = placement
        self.gateway_id = ""  # set once the store is open

    def new_session(self, request: CreateSession, tenant: str) -> Session:
        """A session as a create request asks for it, checked against the server's limits."""
        down = self.placement.unavailable()
        if down is not None:
            raise EngineUnavailable(
                f"{down}; no session can start until it is back (running sessions keep "
                "working): retry in a few seconds, or ask the operator to start the engine"
            )
        s = self.settings
        sandbox = self.kernelspecs.sandbox(request.kernel)
        runtime, network = self.isolation.choose(
            request.runtime, request.network, sandbox, request.credentials
        )
        if request.secrets_as == "files" and not self.placement.secret_files:
            raise NotAllowed(
                f"the {self.placement.name} placement gives secrets as env only; "
                'ask for "secrets_as": "env"'
            )
        return Session(
            kernel_name=request.kernel,
            image=request.image or self.kernel_image(request.kernel),
            limits=s.default_limits.resolve(request.limits, s.max_limits),
            ttl=seconds(request.ttl, "ttl", s.default_ttl, s.max_ttl),
            idle_timeout=seconds(
                request.idle_timeout,
                "idle_timeout",
                s.default_idle_timeout,
                s.max_idle_timeout,
            ),
            env=dict(request.env),
            metadata=dict(request.metadata),
            session_id=request.session_id,
            start_timeout=seconds(
                request.start_timeout,
                "start_timeout",
                s.kernel_start_timeout,
                max(s.kernel_start_timeout, 600.0),
            ),
            runtime=runtime,
            network=network,
            tenant=tenant,
            secret_names=tuple(
                dict.fromkeys((*request.secrets, *(c.secret for c in request.credentials)))
            ),
            credentials=request.credentials,
            secrets_as=request.secrets_as,
            policy=request.policy,
            idle_action=request.idle_action or s.idle_action,
            ttl_from=request.ttl_from,
            max_lifetime=s.max_ttl,
            working_dir=self._working_dir(request),
            survive_crashes=request.survive_crashes,
        )

    def _working_dir(self, request: CreateSession) -> str | None:
        """The directory a Python kernel is to start in; other kernels cannot be moved yet."""
        if request.working_dir is None:
            return None
        language = self.kernelspecs.get(request.kernel).language
        if language != "python":
            raise BadRequest(
                f"KERNEL_WORKING_DIR is honoured for Python kernels only, not {language} "
                f"({request.kernel}); unset it, and the kernel starts in /workspace"
            )
        return request.working_dir

    async def enter_working_dir(self, session: Session) -> None:
        """Move a (re)started kernel into its working directory, made if missing."""
        if session.working_dir is None or session.kernel is None:
            return
        path = f"/workspace/{session.working_dir}"
        await session.kernel.run_silently(
            f"import os as _sbx_os\n_sbx_os.makedirs({path!r}, exist_ok=True)\n"
            f"_sbx_os.chdir({path!r})\ndel _sbx_os"
        )

    async def unseal(self, session: Session, strict: bool = True) -> None:
        """Give the session the values of the secrets it names (a 400 for an unknown one).

        Not ``strict`` (a session taken over after a restart): a secret deleted
        meanwhile is left out, so the kernel keeps running.
        """
        if not session.secret_names:
            return
        if self.secrets is None:
            raise BadRequest("this gateway offers no sealed secrets")
        values = await self.secrets.unseal(session.tenant, session.secret_names, strict)
        session.give_secrets(values)

    def kernel_image(self, kernel_name: str) -> str:
        """The tag of the image a kernel's sessions run in unless they name another."""
        return self.images.tag_for(self.kernelspecs.sandbox(kernel_name).get("image", kernel_name))

    def _equip(self, session: Session) -> None:
        """Give a session its Kernel and workspace objects (no sandbox is started)."""
        sandbox_cfg = self.kernelspecs.sandbox(session.kernel_name)
        as_files = session.secrets_as == "files"
        gate = self._gate(session)
        installs = gate.cache.env if gate is not None else {}
        request = SandboxRequest(
            session_id=session.id,
            image=session.image,
            limits=session.limits,
            env={**installs, **session.env, **({} if as_files else session.secrets)},
            secret_files=session.secrets if as_files else {},
            isolation=session.isolation,
            user=sandbox_cfg.get("user", "1000:1000"),
            start_timeout=session.start_timeout or self.settings.kernel_start_timeout,
            volumes=session.volumes,
        )
        spec = self.placement.sandbox(request, self.gateway_id)
        kernel = Kernel(session.kernel_name, self.kernelspecs.manager, spec, request.start_timeout)
        session.kernel = kernel
        workspace = self.placement.workspace(spec, lambda: kernel.manager.provisioner)
        session.workspace = AsyncWorkspace(workspace)

    async def _check_image(self, session: Session) -> None:
        """Refuse a named image this gateway does not have: the client's mistake, a 400."""
        if session.image == self.kernel_image(session.kernel_name):
            return  # the kernel's own image not built yet is the operator's (503 image_not_built)
        try:
            found = await asyncio.to_thread(self.images.exists, session.image)
        except ENGINE_ERRORS as e:
            raise EngineUnavailable(f"the container engine failed: {e}") from e
        if not found:
            raise BadRequest(
                f"there is no image {session.image} on this gateway; GET /v1/kernels lists the "
                "built ones, or ask for image null to get the kernel's own"
            )

    async def _isolate(self, session: Session) -> None:
        network = session.network
        session.isolation = await self.isolation.prepare(
            session.id,
            session.runtime,
            network,
            session.limits.pids,
            Brokering(session.credentials, session.brokered),
        )
        if session.network != network:  # changed while the proxy did not serve it yet
            self.isolation.egress.update(session.id, session.network)

    async def launch(self, session: Session) -> None:
        """Start the session's sandbox and wait for its kernel; fill in what it reports."""
        await self._check_image(session)
        await self._isolate(session)
        self._equip(session)
        assert session.kernel is not None
        await self.placement.prepare(session.kernel.sandbox)
        try:
            await session.kernel.start()
            facts = await self.placement.image_facts(
                session.image, lambda: session.kernel.manager.provisioner
            )
        except ENGINE_ERRORS as e:
            raise EngineUnavailable(f"the container engine failed: {e}") from e
        session.image_digest = facts["digest"]
        session.packages = facts["packages"]
        session.language_info = (await session.kernel.kernel_info()).get("language_info", {})
        session.display_name = self.kernelspecs.get(session.kernel_name).display_name
        await self.connect_packages(session)

    def _gate(self, session: Session) -> PackageGate | None:
        """The gate of the package cache the session's kernel installs through, if any."""
        if not self.packages:
            return None
        return self.packages.get(self.kernelspecs.get(session.kernel_name).language.lower())

    async def connect_packages(self, session: Session, relay: bool = True) -> None:
        """Serve the session's package socket, and start the kernel's relay to it.

        Called once its kernel runs, and after each restart of it (a new
        process has no relay); ``relay`` false: the kernel still runs one.
        """
        gate = self._gate(session)
        if gate is None or session.kernel is None:
            return
        await gate.open(session.id, session.kernel.sandbox.run_dir)
        if relay:
            await session.kernel.run_silently(gate.cache.relay)

    async def adopt(self, session: Session, runtime: dict[str, Any]) -> None:
        """Take over a sandbox a previous gateway process started (its kernel's runtime info).

        Raises GatewayError when this host can no longer give the sandbox what it had.
        """
        await self.unseal(session, strict=False)
        # The egress proxy lives in this process: let the session's kernel back in.
        await self._isolate(session)
        self._equip(session)
        assert session.kernel is not None
        await session.kernel.adopt(runtime)
        await self.placement.reattach(session.id)
        await self.connect_packages(session, relay=False)

    async def adopt_paused(self, session: Session) -> None:
        """Take over a session a previous gateway process paused: no sandbox, its files here."""
        await self.unseal(session, strict=False)  # its resumed kernel gets them again
        await self._isolate(session)
        self._equip(session)
        await self.placement.reattach(session.id)

    async def move_in(
        self, session: Session, pooled: Session, carry: str, meanwhile: Awaitable | None = None
    ) -> bool:
        """Give a paused session a pooled sandbox's running kernel; the session keeps its id.

        Its files are copied into the sandbox's workspace while ``meanwhile``
        (loading its saved state into the pooled kernel) runs, its ``carry``
        directory (the saved state) goes along, then the directories are
        swapped and the session's own Kernel adopts the sandbox as after a
        gateway restart. False when the files could not be copied: the pooled
        sandbox is removed and the session, as paused as before, may start
        cold. Any other failure removes the pooled sandbox too and is raised;
        once the directories are swapped, the session holds its files and
        state in the new one, and the caller stops the adopted kernel.
        """
        kernel = pooled.kernel
        assert kernel is not None and kernel.container_id is not None
        container, runtime = kernel.container_id, kernel.runtime_info()
        try:
            filled, done = await asyncio.gather(
                self.placement.fill_pooled(session.id, pooled.id, carry),
                meanwhile or asyncio.sleep(0),
                return_exceptions=True,
            )
            # Both finished: nothing writes to the pooled sandbox.
            failed = next((o for o in (done, filled) if isinstance(o, BaseException)), None)
            if failed is None:
                await kernel.let_go()
                self._release(pooled.id)
                await self.placement.move_in(session.id, pooled.id, container)
        except BaseException:  # the resume cut short too: the sandbox would run for nobody
            await self.teardown(pooled)
            raise
        if failed is not None:
            await self.teardown(pooled)
            if isinstance(failed, OSError | ValueError):  # its files: it may start cold
                log.warning("session %s: no pooled sandbox to resume in: %s", session.id, failed)
                return False
            raise failed
        self._equip(session)
        assert session.kernel is not None
        await session.kernel.adopt({**runtime, "kernel_id": session.id})
        await session.kernel.connect()
        await self.connect_packages(session, relay=False)
        return True

    def _release(self, session_id: str) -> None:
        """Stop serving a sandbox's egress and package sockets."""
        self.isolation.release(session_id)
        for gate in self.packages.values():
            gate.close(session_id)

    async def teardown(self, session: Session) -> None:
        """Stop the kernel and remove the sandbox and its directory: the one way out."""
        self._release(session.id)
        kernel = session.kernel
        kept = (session.paused or {}).get("strategy")  # state is "deleted" by now
        if kernel is not None and kept == FREEZE:  # frozen: its channels and guards are open
            await kernel.let_go()
        elif kernel is not None and kept is None:  # a saved pause has no kernel running
            try:
                await kernel.shutdown()
            except Exception as e:  # its sandbox is removed below all the same
                log.warning("session %s: kernel shutdown failed: %r", session.id, e)
        try:
            await self.placement.discard(session.id)
        except ENGINE_ERRORS as e:  # the engine is down: the next start (or `sbx gc`) reaps it
            log.warning("session %s: its sandbox is left for later: %s", session.id, e)
