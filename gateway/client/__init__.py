"""Python SDK for the gateway, in a blocking and an asyncio half with the same methods.

::

    from gateway.client import Session

    with Session.create("http://127.0.0.1:8765", token, memory="1g", ttl=600) as session:
        session.files.write("data.csv", "x,y\\n1,2\\n")
        execution = session.run("import pandas as pd; pd.read_csv('data.csv')", on_stdout=print)
        print(execution.text, execution.error)

``AsyncSession`` / ``AsyncClient`` are the asyncio twins (``await``,
``async with``, ``aclose``). Gateway errors raise the classes of
``gateway.errors`` (re-exported here), matched by their error code.
"""

from ..errors import (
    BadRequest,
    Conflict,
    Denied,
    EgressUnavailable,
    EngineUnavailable,
    FileNotFound,
    FileTooLarge,
    Forbidden,
    GatewayError,
    ImageNotBuilt,
    KernelDied,
    KernelNotFound,
    KernelStartFailed,
    LimitExceeded,
    NotAFile,
    NotAllowed,
    NotFound,
    NotSupported,
    PathForbidden,
    PayloadTooLarge,
    QuotaExceeded,
    RuntimeUnavailable,
    SandboxUnavailable,
    SessionEnded,
    SessionNotFound,
    TooManySessions,
    Unauthorized,
    Unavailable,
)
from .aio import AsyncClient, AsyncCommands, AsyncFiles, AsyncSession, AsyncSnapshot
from .base import CommandOptions, Retry, SessionOptions
from .errors import GatewayUnreachable
from .models import (
    Approval,
    Artifact,
    CommandResult,
    Execution,
    ExecutionError,
    FileInfo,
    Port,
    PreviewLink,
    RecordedExecution,
    ReplayCell,
    ReplayReport,
    Result,
    SessionInfo,
    SessionMetrics,
)
from .stream import RunCallbacks
from .sync import Client, Commands, Files, Session, Snapshot

__all__ = [
    "Approval",
    "Artifact",
    "AsyncClient",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncSession",
    "AsyncSnapshot",
    "BadRequest",
    "Client",
    "CommandOptions",
    "CommandResult",
    "Commands",
    "Conflict",
    "Denied",
    "EgressUnavailable",
    "EngineUnavailable",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "FileNotFound",
    "FileTooLarge",
    "Files",
    "Forbidden",
    "GatewayError",
    "GatewayUnreachable",
    "ImageNotBuilt",
    "KernelDied",
    "KernelNotFound",
    "KernelStartFailed",
    "LimitExceeded",
    "NotAFile",
    "NotAllowed",
    "NotFound",
    "NotSupported",
    "PathForbidden",
    "PayloadTooLarge",
    "Port",
    "PreviewLink",
    "QuotaExceeded",
    "RecordedExecution",
    "ReplayCell",
    "ReplayReport",
    "Result",
    "Retry",
    "RunCallbacks",
    "RuntimeUnavailable",
    "SandboxUnavailable",
    "Session",
    "SessionEnded",
    "SessionInfo",
    "SessionMetrics",
    "SessionNotFound",
    "SessionOptions",
    "Snapshot",
    "TooManySessions",
    "Unauthorized",
    "Unavailable",
]
