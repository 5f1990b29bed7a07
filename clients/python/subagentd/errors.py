"""Errors a program can branch on.

Every error a `Client` or `AsyncClient` call raises is a `SubagentdError`.
subagentd puts a `google.rpc.ErrorInfo` (domain "subagentd") on every error
status; its reason picks the class here (`ERRORS`, the one table), and its
metadata become typed attributes (`GlobalLimitReached.limit` is an int).
Statuses without one (the transport's DEADLINE_EXCEEDED, a refused
connection's UNAVAILABLE, a cancelled call) are `DeadlineExceeded`,
`Unavailable`, `Cancelled` (`TRANSPORT_ERRORS`); anything else is a plain
`SubagentdError`. Each keeps the gRPC `code`, the `message`, the whole
`metadata` dict, the unpacked status `details` and the `rpc_error` raised.

    try:
        client.spawn("coder", "fix the test", background=True)
    except GlobalLimitReached as e:
        print(f"{e.live} of {e.limit} live; raise {e.config_key}")
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Type, Union, cast

import grpc
from google.protobuf import message as _message
from google.rpc import error_details_pb2, status_pb2

from .types import AgentStatus

__all__ = [
    "DOMAIN",
    "ERRORS",
    "TRANSPORT_ERRORS",
    "AgentBusy",
    "AgentFinished",
    "AgentNotFound",
    "ApprovalMismatch",
    "Cancelled",
    "ConversationExpired",
    "DeadlineExceeded",
    "DepthLimitReached",
    "DescendantLimitReached",
    "FieldViolation",
    "GlobalLimitReached",
    "InvalidRequest",
    "NoLeader",
    "NotAwaitingApproval",
    "NotLatest",
    "NotResumable",
    "PermissionDenied",
    "RateLimited",
    "Recovering",
    "ShuttingDown",
    "SteerNotAccepted",
    "StoreFailed",
    "SubagentdError",
    "TenantLimitReached",
    "Unauthenticated",
    "Unavailable",
    "UnknownAgentType",
    "WatchLagged",
    "WatchLimitReached",
    "from_rpc_error",
    "rich_status",
    "status_details",
]

#: ErrorInfo domain of subagentd's errors.
DOMAIN = "subagentd"

_DETAILS_TRAILER = "grpc-status-details-bin"

# Detail types subagentd sends, by their Any type name.
_DETAIL_TYPES: Dict[str, Type[_message.Message]] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        error_details_pb2.ErrorInfo,
        error_details_pb2.BadRequest,
        error_details_pb2.QuotaFailure,
        error_details_pb2.PreconditionFailure,
        error_details_pb2.ResourceInfo,
        error_details_pb2.RetryInfo,
        error_details_pb2.DebugInfo,
        error_details_pb2.Help,
        error_details_pb2.LocalizedMessage,
    )
}


class FieldViolation(NamedTuple):
    """A request field and what is wrong with it (`BadRequest`)."""

    field: str
    description: str


class SubagentdError(Exception):
    """Any error of a subagentd call.

    `reason` is the ErrorInfo reason ("" when the status carried none from
    subagentd), `code` the gRPC status code, `message` the status message,
    `metadata` the ErrorInfo metadata, `details` the unpacked status details
    (ErrorInfo, BadRequest, QuotaFailure, …), `rpc_error` the grpc error."""

    #: The ErrorInfo reason a subclass stands for.
    REASON: ClassVar[str] = ""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        details: Sequence[_message.Message] = (),
        rpc_error: Optional[grpc.RpcError] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = self.REASON if reason is None else reason
        self.metadata: Dict[str, str] = dict(metadata or {})
        self.details: List[_message.Message] = list(details)
        self.rpc_error = rpc_error

    def __str__(self) -> str:
        head = f"{self.code.name}"
        if self.reason:
            head += f" {self.reason}"
        return f"{head}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.name}, reason={self.reason!r}, message={self.message!r}, metadata={self.metadata!r})"

    # Typed metadata readers for the subclasses.
    def _str(self, key: str) -> str:
        return self.metadata.get(key, "")

    def _int(self, key: str) -> int:
        try:
            return int(self.metadata.get(key, ""))
        except ValueError:
            return 0

    def _list(self, key: str) -> List[str]:
        return [part for part in self.metadata.get(key, "").split(",") if part]

    def _status(self, key: str) -> AgentStatus:
        name = self.metadata.get(key, "").removeprefix("AGENT_STATUS_")
        return AgentStatus.__members__.get(name, AgentStatus.UNSPECIFIED)


# ----- statuses without subagentd's ErrorInfo ---------------------------------


class Unavailable(SubagentdError):
    """UNAVAILABLE: the server could not be reached (or a proxy answered);
    also the base of subagentd's own UNAVAILABLE reasons."""


class DeadlineExceeded(SubagentdError):
    """The call's deadline (`call_timeout`) passed."""


class Cancelled(SubagentdError):
    """The call was cancelled on the client's side."""


# ----- ErrorInfo reasons ---------------------------------------------------------


class InvalidRequest(SubagentdError):
    """A request field is malformed; `violations` name the fields."""

    REASON = "INVALID_REQUEST"

    @property
    def violations(self) -> List[FieldViolation]:
        return [
            FieldViolation(v.field, v.description)
            for d in self.details
            if isinstance(d, error_details_pb2.BadRequest)
            for v in d.field_violations
        ]


class UnknownAgentType(InvalidRequest):
    """`agent` names no configured type; `known` lists those that are."""

    REASON = "UNKNOWN_AGENT_TYPE"

    @property
    def agent(self) -> str:
        return self._str("agent")

    @property
    def known(self) -> List[str]:
        return self._list("known")


class AgentNotFound(SubagentdError):
    """No retained agent has this `id` (given in request field `field`)."""

    REASON = "AGENT_NOT_FOUND"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def field(self) -> str:
        return self._str("field")


class AgentFinished(SubagentdError):
    """The parent of a Spawn, or the target of a Steer, has ended."""

    REASON = "AGENT_FINISHED"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def field(self) -> str:
        return self._str("field")

    @property
    def status(self) -> AgentStatus:
        return self._status("status")


class AgentBusy(SubagentdError):
    """`continue_from` names a live agent."""

    REASON = "AGENT_BUSY"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def status(self) -> AgentStatus:
        return self._status("status")


class NotLatest(SubagentdError):
    """`continue_from` names an agent a later one continued; continue
    `latest_id` instead (or fork)."""

    REASON = "NOT_LATEST"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def conversation_id(self) -> str:
        return self._str("conversation_id")

    @property
    def latest_id(self) -> str:
        return self._str("latest_id")


class ConversationExpired(SubagentdError):
    """The transcript is no longer retained."""

    REASON = "CONVERSATION_EXPIRED"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def field(self) -> str:
        return self._str("field")


class NotResumable(SubagentdError):
    """The agent type (`agent`) sets `continuable = false`."""

    REASON = "NOT_RESUMABLE"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def agent(self) -> str:
        return self._str("agent")


class GlobalLimitReached(SubagentdError):
    """`live` of `limit` background agents are live (`config_key`)."""

    REASON = "GLOBAL_LIMIT_REACHED"

    @property
    def limit(self) -> int:
        return self._int("limit")

    @property
    def live(self) -> int:
        return self._int("live")

    @property
    def config_key(self) -> str:
        return self._str("config_key")


class TenantLimitReached(GlobalLimitReached):
    """A tenant's `max_background_agents` reached."""

    REASON = "TENANT_LIMIT_REACHED"

    @property
    def tenant(self) -> str:
        return self._str("tenant")


class RateLimited(SubagentdError):
    """A tenant's `spawn_rate` passed; try again after `retry_after`."""

    REASON = "RATE_LIMITED"

    @property
    def tenant(self) -> str:
        return self._str("tenant")

    @property
    def spawn_rate(self) -> str:
        return self._str("spawn_rate")

    @property
    def spawn_burst(self) -> int:
        return self._int("spawn_burst")

    @property
    def config_key(self) -> str:
        return self._str("config_key")

    @property
    def retry_after(self) -> Optional[timedelta]:
        for d in self.details:
            if isinstance(d, error_details_pb2.RetryInfo) and d.HasField("retry_delay"):
                return d.retry_delay.ToTimedelta()
        return None


class WatchLimitReached(SubagentdError):
    """A tenant has `open` of `limit` WatchAgents streams open."""

    REASON = "WATCH_LIMIT_REACHED"

    @property
    def tenant(self) -> str:
        return self._str("tenant")

    @property
    def limit(self) -> int:
        return self._int("limit")

    @property
    def open(self) -> int:
        return self._int("open")

    @property
    def config_key(self) -> str:
        return self._str("config_key")


class DepthLimitReached(SubagentdError):
    """A Spawn at `depth` beyond `max_depth` (`limit`)."""

    REASON = "DEPTH_LIMIT_REACHED"

    @property
    def limit(self) -> int:
        return self._int("limit")

    @property
    def depth(self) -> int:
        return self._int("depth")

    @property
    def config_key(self) -> str:
        return self._str("config_key")


class DescendantLimitReached(SubagentdError):
    """The tree of `root_id` has `live` of `limit` live agents."""

    REASON = "DESCENDANT_LIMIT_REACHED"

    @property
    def limit(self) -> int:
        return self._int("limit")

    @property
    def live(self) -> int:
        return self._int("live")

    @property
    def root_id(self) -> str:
        return self._str("root_id")

    @property
    def config_key(self) -> str:
        return self._str("config_key")


class ShuttingDown(Unavailable):
    """The server is shutting down."""

    REASON = "SHUTTING_DOWN"


class StoreFailed(Unavailable):
    """The change may not have been kept; retry with the same idempotency key."""

    REASON = "STORE_FAILED"


class Recovering(Unavailable):
    """The server is reading its store at start (or waits for a worker to
    re-attach `agent_id`); retried by the client's idempotent calls."""

    REASON = "RECOVERING"

    @property
    def agent_id(self) -> str:
        return self._str("agent_id")


class NoLeader(Unavailable):
    """A standby knows no reachable leader; retried by the client's
    idempotent calls."""

    REASON = "NO_LEADER"


class SteerNotAccepted(SubagentdError):
    """The agent type (`agent`) takes no steer messages."""

    REASON = "STEER_NOT_ACCEPTED"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def agent(self) -> str:
        return self._str("agent")


class NotAwaitingApproval(SubagentdError):
    """The agent has no pending approval (it is `status`)."""

    REASON = "NOT_AWAITING_APPROVAL"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def status(self) -> AgentStatus:
        return self._status("status")


class ApprovalMismatch(SubagentdError):
    """`approval_id` is not the agent's pending approval (`pending_approval_id`)."""

    REASON = "APPROVAL_MISMATCH"

    @property
    def id(self) -> str:
        return self._str("id")

    @property
    def approval_id(self) -> str:
        return self._str("approval_id")

    @property
    def pending_approval_id(self) -> str:
        return self._str("pending_approval_id")


class WatchLagged(SubagentdError):
    """A watch fell behind; resume after `resume_after_sequence` (the
    client's `watch` does so by itself)."""

    REASON = "WATCH_LAGGED"

    @property
    def missed_events(self) -> int:
        return self._int("missed_events")

    @property
    def resume_after_sequence(self) -> int:
        return self._int("resume_after_sequence")


class Unauthenticated(SubagentdError):
    """No credential or a bad one; `cause` says which (missing, malformed, …)."""

    REASON = "UNAUTHENTICATED"

    @property
    def cause(self) -> str:
        return self._str("cause")


class PermissionDenied(SubagentdError):
    """The caller's roles do not allow the call (`required_roles`), or it
    named a tenant it is not granted (`granted_tenants`), or agent types
    (`agent_types`) it may not serve."""

    REASON = "PERMISSION_DENIED"

    @property
    def method(self) -> str:
        return self._str("method")

    @property
    def required_roles(self) -> List[str]:
        return self._list("required_roles")

    @property
    def granted_tenants(self) -> List[str]:
        return self._list("granted_tenants")

    @property
    def agent_types(self) -> List[str]:
        return self._list("agent_types")


#: ErrorInfo reason → class: the one table.
ERRORS: Mapping[str, Type[SubagentdError]] = {
    cls.REASON: cls
    for cls in (
        InvalidRequest,
        UnknownAgentType,
        AgentNotFound,
        AgentFinished,
        AgentBusy,
        NotLatest,
        ConversationExpired,
        NotResumable,
        GlobalLimitReached,
        TenantLimitReached,
        RateLimited,
        WatchLimitReached,
        DepthLimitReached,
        DescendantLimitReached,
        ShuttingDown,
        StoreFailed,
        Recovering,
        NoLeader,
        SteerNotAccepted,
        NotAwaitingApproval,
        ApprovalMismatch,
        WatchLagged,
        Unauthenticated,
        PermissionDenied,
    )
}

#: gRPC code → class, for statuses without subagentd's ErrorInfo.
TRANSPORT_ERRORS: Mapping[grpc.StatusCode, Type[SubagentdError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def _trailer(err: grpc.RpcError) -> Optional[bytes]:
    try:
        trailing = err.trailing_metadata()
    except Exception:  # an error that is no call (e.g. a channel's own)
        return None
    for item in cast(Iterable[Tuple[str, Union[str, bytes]]], trailing or ()):
        key, value = item[0], item[1]
        if key == _DETAILS_TRAILER and isinstance(value, bytes):
            return value
    return None


def rich_status(err: grpc.RpcError) -> Optional[status_pb2.Status]:
    """The `google.rpc.Status` in the error's `grpc-status-details-bin`
    trailer (sync or `grpc.aio` error), or None when it has none."""
    raw = _trailer(err)
    if raw is None:
        return None
    status = status_pb2.Status()
    try:
        status.ParseFromString(raw)
    except _message.DecodeError:
        return None
    return status


def status_details(status: Optional[status_pb2.Status]) -> List[_message.Message]:
    """The details of `status`, unpacked, in the order sent; details of
    unknown types are left out."""
    out: List[_message.Message] = []
    for any_detail in status.details if status is not None else ():
        cls = _DETAIL_TYPES.get(any_detail.TypeName())
        if cls is not None:
            detail = cls()
            any_detail.Unpack(detail)
            out.append(detail)
    return out


def _code_and_message(err: grpc.RpcError) -> Tuple[grpc.StatusCode, str]:
    try:
        code = err.code()
        message = err.details() or ""
    except Exception:
        return grpc.StatusCode.UNKNOWN, str(err)
    return code, message


def from_rpc_error(err: grpc.RpcError) -> SubagentdError:
    """The `SubagentdError` for a grpc error (sync or `grpc.aio`)."""
    code, message = _code_and_message(err)
    details = status_details(rich_status(err))
    info = next(
        (d for d in details if isinstance(d, error_details_pb2.ErrorInfo) and d.domain == DOMAIN),
        None,
    )
    if info is None:
        cls = TRANSPORT_ERRORS.get(code, SubagentdError)
        return cls(message, code=code, reason="", details=details, rpc_error=err)
    cls = ERRORS.get(info.reason, SubagentdError)
    # A reason this library does not know keeps its name in `reason`.
    return cls(message, code=code, reason=info.reason, metadata=dict(info.metadata), details=details, rpc_error=err)
