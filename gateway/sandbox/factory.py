"""The placement the settings name, built from plain values (STYLE 5: by name from config)."""

from __future__ import annotations

from pathlib import Path

import docker
import zmq.asyncio

from .base import GuardFactory, Placement
from .docker.placement import DockerPlacement
from .images import ImageBuilder
from .swarm.placement import SwarmOptions, SwarmPlacement

PLACEMENTS = ("docker", "swarm")


def make_placement(
    name: str,
    client: docker.DockerClient,
    images: ImageBuilder,
    sessions_dir: Path,
    tmp_size: int,
    swarm: SwarmOptions,
    context: zmq.asyncio.Context,
    max_message: int,
    guard: GuardFactory | None = None,
) -> Placement:
    """The ``docker`` or ``swarm`` placement; ``swarm`` options matter only to the latter.

    ``max_message`` bounds a kernel message whole where the placement can
    (docker: a ``guard`` before each kernel socket); every socket's libzmq
    bounds each frame.
    """
    if name == "swarm":
        return SwarmPlacement(client, images, sessions_dir, swarm, tmp_size, context)
    return DockerPlacement(client, images, sessions_dir, tmp_size, max_message, guard)
