"""Errors a user can cause or meet, each with a stable code and HTTP status.

Domain code raises these; one place (``gateway.api.base``) turns them into
``{"error": {"code", "message"}}`` responses, so handlers never pick status
codes themselves. The tree::

    GatewayError                      500 internal_error
    ├── ConfigError                       config_error (a setting or config file is unusable)
    ├── BadRequest                    400 bad_request
    │   ├── LimitExceeded             422 limit_exceeded
    │   ├── NotAllowed                403 not_allowed (a runtime / network policy not offered)
    │   ├── UnsupportedMediaType      415 unsupported_media_type
    │   └── PolicyInvalid                 policy_invalid (a policy file or document, with its line)
    ├── Unauthorized                  401 unauthorized (no token, or not a valid one)
    ├── Forbidden                     403 forbidden (an admin-only endpoint)
    │   └── Denied                        denied (a policy or an approver refused the code)
    ├── PathForbidden                 403 path_forbidden
    ├── NotFound                      404
    │   ├── SessionNotFound               session_not_found
    │   ├── KernelNotFound                kernel_not_found
    │   ├── SnapshotNotFound              snapshot_not_found
    │   └── FileNotFound                  file_not_found
    ├── Conflict                      409
    │   ├── KernelDied                    kernel_died
    │   ├── SessionEnded                  session_ended
    │   ├── AlreadyDecided                already_decided (an approval decided before)
    │   ├── SessionBusy                   session_busy (a cell runs: pause or snapshot later)
    │   ├── NotPaused                     not_paused
    │   ├── StrategyUnavailable           strategy_unavailable (no way to keep this kernel's state)
    │   ├── StateNotSaved                 state_not_saved (the kernel could not save it)
    │   ├── StateNotRestored              state_not_restored (saved state unreadable or missing)
    │   └── NotAFile                      not_a_file
    ├── PayloadTooLarge               413 payload_too_large (request body, code)
    │   └── FileTooLarge                  file_too_large
    ├── TooManySessions               429 too_many_sessions
    │   └── QuotaExceeded                 quota_exceeded (a tenant's quota)
    ├── TooManyContexts               429 too_many_contexts (a session's code contexts)
    ├── TooManyWatchers               429 too_many_watchers (a session's or a tenant's watches)
    ├── NotSupported                  501 not_supported (a feature this gateway does not offer yet)
    └── Unavailable                   503
        ├── EngineUnavailable             engine_unavailable
        ├── ImageNotBuilt                 image_not_built
        ├── KernelStartFailed             kernel_start_failed
        ├── RuntimeUnavailable            runtime_unavailable
        ├── EgressUnavailable             egress_unavailable
        ├── SandboxUnavailable            sandbox_unavailable (a cluster node does not answer)
        ├── OwnerUnavailable              owner_unavailable (the gateway owning a session does not)
        ├── Overloaded                    overloaded (cold starts queued past their bound)
        └── StoreUnavailable              store_unavailable (the shared database does not answer)
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error the API reports; the message is shown to users."""

    status = 500
    code = "internal_error"
    retry_after: int | None = None  # seconds worth waiting before a retry (a Retry-After header)

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after is not None:
            self.retry_after = retry_after


class ConfigError(GatewayError):
    """A setting or config file is unusable: the gateway (or the SDK) refuses it."""

    code = "config_error"


class BadRequest(GatewayError):
    status = 400
    code = "bad_request"


class LimitExceeded(BadRequest):
    """A requested limit is invalid or above the server's maximum."""

    status = 422
    code = "limit_exceeded"


class UnsupportedMediaType(BadRequest):
    """A body in a content type the endpoint does not read."""

    status = 415
    code = "unsupported_media_type"


class NotAllowed(BadRequest):
    """A valid request for something this server's configuration does not offer."""

    status = 403
    code = "not_allowed"


class PolicyInvalid(BadRequest):
    """A policy that cannot be used; the message names the line at fault."""

    code = "policy_invalid"


class NotFound(GatewayError):
    status = 404
    code = "not_found"


class SessionNotFound(NotFound):
    code = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"no session {session_id!r}: it never existed or was deleted; "
            "create one with POST /v1/sessions"
        )


class ApprovalNotFound(NotFound):
    code = "approval_not_found"


class SnapshotNotFound(NotFound):
    code = "snapshot_not_found"

    def __init__(self, snapshot_id: str) -> None:
        super().__init__(
            f"no snapshot {snapshot_id!r}: it never existed or was deleted; "
            "GET /v1/sessions/{id}/snapshots lists a session's"
        )


class VolumeNotFound(NotFound):
    code = "volume_not_found"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no volume {name!r}: it never existed or was deleted; GET /v1/volumes lists yours"
        )


class KernelNotFound(NotFound):
    code = "kernel_not_found"


class FileNotFound(NotFound):
    code = "file_not_found"


class PathForbidden(GatewayError):
    """A path the gateway will not touch: a link, a FIFO, a device."""

    status = 403
    code = "path_forbidden"


class Conflict(GatewayError):
    status = 409
    code = "conflict"


class KernelDied(Conflict):
    """The session's kernel is dead; it must be restarted before use."""

    code = "kernel_died"


class SessionEnded(Conflict):
    code = "session_ended"


class SessionBusy(Conflict):
    """A cell is running; its state cannot be saved until it finishes."""

    code = "session_busy"


class NotPaused(Conflict):
    code = "not_paused"


class StrategyUnavailable(Conflict):
    """The kernel state strategy asked for cannot be used for this session."""

    code = "strategy_unavailable"


class StateNotSaved(Conflict):
    """The kernel's state could not be saved (no disk, no memory); the session keeps running."""

    code = "state_not_saved"


class StateNotRestored(Conflict):
    """A saved kernel state is missing or unreadable; nothing was changed."""

    code = "state_not_restored"


class VolumeInUse(Conflict):
    """A volume another session's mount holds (a delete, or a mount that would conflict)."""

    code = "volume_in_use"


class NotAFile(Conflict):
    code = "not_a_file"


class AlreadyDecided(Conflict):
    code = "already_decided"


class Unauthorized(GatewayError):
    status = 401
    code = "unauthorized"


class Forbidden(GatewayError):
    status = 403
    code = "forbidden"


class Denied(Forbidden):
    """An execute a policy or an approver refused (or whose approval timed out): it never ran."""

    code = "denied"


class PayloadTooLarge(GatewayError):
    status = 413
    code = "payload_too_large"


class FileTooLarge(PayloadTooLarge):
    code = "file_too_large"


class TooManySessions(GatewayError):
    status = 429
    code = "too_many_sessions"


class QuotaExceeded(TooManySessions):
    """A tenant holds as many sessions, or as much memory, as its quota allows."""

    code = "quota_exceeded"


class TooManyContexts(GatewayError):
    """A session holds as many code contexts as it may (``sessions.contexts``)."""

    status = 429
    code = "too_many_contexts"


class TooManyWatchers(GatewayError):
    """A session, or its tenant, watches as many directories as it may; stop a watch first."""

    status = 429
    code = "too_many_watchers"


class PreviewLimit(GatewayError):
    """A session's previews hold as many connections, or moved as many bytes, as they may."""

    status = 429
    code = "preview_limit"
    retry_after = 1


class PortNotListening(GatewayError):
    """A preview asked for a port on which nothing in the sandbox listens (as a proxy says)."""

    status = 502
    code = "port_not_listening"


class NotSupported(GatewayError):
    """A call another API defines (E2B's pause, snapshots) that this gateway does not offer yet."""

    status = 501
    code = "not_supported"


class Unavailable(GatewayError):
    status = 503
    code = "unavailable"


class EngineUnavailable(Unavailable):
    """The container engine does not answer; the watcher notices within seconds when it does."""

    code = "engine_unavailable"
    retry_after = 5


class ImageNotBuilt(Unavailable):
    code = "image_not_built"


class KernelStartFailed(Unavailable):
    code = "kernel_start_failed"


class RuntimeUnavailable(Unavailable):
    """An allowed runtime the container engine does not have (gVisor not set up)."""

    code = "runtime_unavailable"


class EgressUnavailable(Unavailable):
    """Allowlist networking cannot be set up on this host (no root, no iptables)."""

    code = "egress_unavailable"


class SandboxUnavailable(Unavailable):
    """A cluster sandbox (its node, or the agent in it) does not answer."""

    code = "sandbox_unavailable"


class OwnerUnavailable(Unavailable):
    """The gateway that owns the session does not answer; its lease runs out within seconds."""

    code = "owner_unavailable"
    retry_after = 3


class Overloaded(Unavailable):
    """Creates the warm pool cannot serve wait for a cold start; past the queue's bound, this."""

    code = "overloaded"
    retry_after = 5


class StoreUnavailable(Unavailable):
    """The shared database does not answer: new work waits for it, work in flight goes on."""

    code = "store_unavailable"
    retry_after = 2
