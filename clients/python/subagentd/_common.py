"""What `Client` and `AsyncClient` share: where the server is and how to
reach it, deadlines and the retry policy, request building and the watch's
resume rules. No I/O here."""

from __future__ import annotations

import enum
import os
import random
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Mapping, Optional, Sequence, Tuple, Union, cast

import grpc

from subagents.v1 import subagents_pb2 as pb

from . import errors
from ._convert import Seconds, duration, to_seconds
from .types import AgentStatus, ApprovalDecision, AwaitMode

#: Server address when neither `address=` nor `SUBAGENTD_ADDR` is given (the CLI's).
DEFAULT_ADDRESS = "http://127.0.0.1:50051"
#: Default gRPC deadline of a unary call, in seconds.
DEFAULT_CALL_TIMEOUT = 30.0
#: An Await's own wait when none is given (the server's default too).
DEFAULT_AWAIT_TIMEOUT = 30.0

SERVICE = "/subagents.v1.AgentService/"

Metadata = Tuple[Tuple[str, str], ...]


class Unset(enum.Enum):
    """The type of `UNSET`: "use the client's default"."""

    UNSET = 0


#: A `call_timeout` left to the client's default.
UNSET = Unset.UNSET

#: A call's deadline: seconds or a timedelta; None for none; `UNSET` for the default.
CallTimeout = Union[float, int, timedelta, None, Unset]


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for NO_LEADER / RECOVERING on idempotent calls and for a
    watch's reconnects: waits start at `initial_backoff` seconds and grow by
    `multiplier` up to `max_backoff` (with jitter). A call retries only while
    its deadline leaves room; a call without one (and a watch between two
    events) gives up after `max_elapsed` seconds of failures."""

    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    multiplier: float = 2.0
    max_elapsed: float = 60.0


@dataclass(frozen=True)
class Connection:
    """Where and how to connect; see `resolve`."""

    target: str
    credentials: Optional[grpc.ChannelCredentials]
    metadata: Metadata


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def split_address(address: str) -> Tuple[str, Optional[bool]]:
    """("host:port", TLS?) of an address as the CLI takes it:
    `http://host:port` (plaintext), `https://host:port` (TLS) or
    `host:port` (plaintext unless a CA or client certificate is given)."""
    address = address.strip()
    for scheme, tls in (("http://", False), ("https://", True)):
        if address.startswith(scheme):
            return address[len(scheme) :].rstrip("/"), tls
    return address, None


def resolve(
    address: Optional[str] = None,
    token: Optional[str] = None,
    ca_file: Optional[str] = None,
    cert_file: Optional[str] = None,
    key_file: Optional[str] = None,
) -> Connection:
    """The connection for the given settings, each falling back to the
    CLI's environment variable (`SUBAGENTD_ADDR`, `SUBAGENTD_TOKEN`,
    `SUBAGENTD_CA_FILE`, `SUBAGENTD_CERT_FILE`, `SUBAGENTD_KEY_FILE`)."""
    address = address or os.environ.get("SUBAGENTD_ADDR") or DEFAULT_ADDRESS
    token = token if token is not None else os.environ.get("SUBAGENTD_TOKEN", "")
    ca_file = ca_file if ca_file is not None else os.environ.get("SUBAGENTD_CA_FILE")
    cert_file = cert_file if cert_file is not None else os.environ.get("SUBAGENTD_CERT_FILE")
    key_file = key_file if key_file is not None else os.environ.get("SUBAGENTD_KEY_FILE")
    if bool(cert_file) != bool(key_file):
        raise ValueError("cert_file and key_file go together")
    target, tls = split_address(address)
    if tls is None:
        tls = bool(ca_file or cert_file)
    credentials = None
    if tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(ca_file), private_key=_read(key_file), certificate_chain=_read(cert_file)
        )
    token = token.strip()
    metadata: Metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return Connection(target=target, credentials=credentials, metadata=metadata)


#: Channel options: responses up to 256 MiB (a page of 1000 agents with
#: their results), as the CLI accepts.
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 256 * 1024 * 1024),)


class Deadline:
    """A call's deadline and the retry schedule within it."""

    def __init__(self, timeout: Optional[float], policy: RetryPolicy) -> None:
        now = time.monotonic()
        self._policy = policy
        self._at = None if timeout is None else now + timeout
        self._give_up = now + policy.max_elapsed if self._at is None else self._at
        self._backoff = policy.initial_backoff

    def remaining(self) -> Optional[float]:
        """Seconds left (at least a millisecond), or None without a deadline."""
        if self._at is None:
            return None
        return max(0.001, self._at - time.monotonic())

    def reset(self) -> None:
        """Progress was made (a watch event): failures count afresh."""
        if self._at is None:
            self._give_up = time.monotonic() + self._policy.max_elapsed
        self._backoff = self._policy.initial_backoff

    def next_backoff(self) -> Optional[float]:
        """How long to wait before the next try, or None when the deadline
        (or `max_elapsed`) leaves no room for one."""
        wait = self._backoff * random.uniform(0.5, 1.0)
        self._backoff = min(self._backoff * self._policy.multiplier, self._policy.max_backoff)
        if time.monotonic() + wait >= self._give_up:
            return None
        return wait


def seconds_or_none(value: CallTimeout, default: Optional[float]) -> Optional[float]:
    if isinstance(value, Unset):
        return default
    if value is None:
        return None
    return to_seconds(value)


def retried(err: errors.SubagentdError) -> bool:
    """Errors an idempotent call retries: the server will answer soon."""
    return isinstance(err, (errors.NoLeader, errors.Recovering))


def watch_resumes(err: errors.SubagentdError) -> bool:
    """Errors after which a watch subscribes again by `after_sequence`."""
    return isinstance(err, (errors.Unavailable, errors.WatchLagged))


# ----- requests ------------------------------------------------------------------


def spawn_request(
    *,
    agent: str,
    prompt: str,
    model: str,
    description: str,
    parent_id: str,
    lead_id: str,
    background: bool,
    labels: Optional[Mapping[str, str]],
    timeout: Optional[Seconds],
    idempotency_key: Optional[str],
    detached: bool,
    continue_from: str,
    fork: bool,
    workspace_base: str = "",
) -> pb.SpawnRequest:
    request = pb.SpawnRequest(
        agent=agent,
        model=model,
        prompt=prompt,
        description=description,
        parent_id=parent_id,
        lead_id=lead_id,
        background=background,
        labels=dict(labels or {}),
        idempotency_key=str(uuid.uuid4()) if idempotency_key is None else idempotency_key,
        detached=detached,
        continue_from=continue_from,
        fork=fork,
        workspace_base=workspace_base,
    )
    if timeout is not None:
        request.timeout.CopyFrom(duration(timeout))
    return request


def status_ids(ids: Union[str, Sequence[str]]) -> Tuple[bool, pb.StatusRequest]:
    """(one id given?, the request)."""
    one = isinstance(ids, str)
    return one, pb.StatusRequest(ids=[ids] if isinstance(ids, str) else list(ids))


def list_request(
    *,
    parent_id: str,
    root_id: str,
    lead_id: str,
    statuses: Iterable[AgentStatus],
    tenant: str,
    conversation_id: str,
    uncollected: bool,
    page_size: int,
) -> pb.StatusRequest:
    return pb.StatusRequest(
        parent_id=parent_id,
        root_id=root_id,
        lead_id=lead_id,
        statuses=[cast(pb.AgentStatus, int(s)) for s in statuses],
        tenant=tenant,
        conversation_id=conversation_id,
        uncollected=uncollected,
        page_size=page_size,
    )


def await_request(
    ids: Union[str, Sequence[str], None],
    *,
    lead_id: str,
    parent_id: str,
    mode: Union[AwaitMode, str],
    timeout: Seconds,
    collect: bool,
) -> pb.AwaitRequest:
    if isinstance(mode, str):
        try:
            mode = AwaitMode[mode.upper()]
        except KeyError:
            raise ValueError(f"mode must be 'all' or 'any', not {mode!r}") from None
    request = pb.AwaitRequest(
        ids=[ids] if isinstance(ids, str) else list(ids or ()),
        mode=cast(pb.AwaitMode, int(mode)),
        lead_id=lead_id,
        parent_id=parent_id,
        collect=collect,
    )
    request.timeout.CopyFrom(duration(timeout))
    return request


def await_call_timeout(call_timeout: CallTimeout, default: Optional[float], timeout: Seconds) -> Optional[float]:
    """An Await's deadline: the caller's, or by default the client's default
    on top of the Await's own wait (the server answers `timed_out` first)."""
    if isinstance(call_timeout, Unset):
        return None if default is None else default + to_seconds(timeout)
    return seconds_or_none(call_timeout, default)


def cancel_request(id: str, *, lead_id: str, reason: str) -> pb.CancelRequest:
    return pb.CancelRequest(id=id, lead_id=lead_id, reason=reason)


def approve_request(
    id: str, *, approval_id: str, approve: Union[bool, ApprovalDecision], note: str
) -> pb.ApproveRequest:
    if isinstance(approve, bool):
        decision = ApprovalDecision.APPROVE if approve else ApprovalDecision.DENY
    else:
        decision = approve
    return pb.ApproveRequest(
        id=id, approval_id=approval_id, decision=cast(pb.ApprovalDecision, int(decision)), note=note
    )


def watch_request(
    ids: Union[str, Sequence[str], None],
    *,
    parent_id: str,
    root_id: str,
    lead_id: str,
    after_sequence: int,
    include_snapshot: bool,
    include_progress: bool,
    tenant: str,
    conversation_id: str,
) -> pb.WatchAgentsRequest:
    return pb.WatchAgentsRequest(
        ids=[ids] if isinstance(ids, str) else list(ids or ()),
        parent_id=parent_id,
        root_id=root_id,
        lead_id=lead_id,
        after_sequence=after_sequence,
        include_snapshot=include_snapshot,
        include_progress=include_progress,
        tenant=tenant,
        conversation_id=conversation_id,
    )


class WatchPosition:
    """A watch's request and where it stands: the sequence of the last event
    received, which the next subscription resumes after."""

    def __init__(self, request: pb.WatchAgentsRequest) -> None:
        self._request = request
        self.last_sequence = request.after_sequence
        self.resumes = 0

    def request(self) -> pb.WatchAgentsRequest:
        """The request for the next subscription. A resume replays after the
        last event (the server sends SNAPSHOTs when it cannot); before any
        event it subscribes as first asked."""
        if self.resumes == 0 or self.last_sequence == 0:
            return self._request
        request = pb.WatchAgentsRequest()
        request.CopyFrom(self._request)
        request.after_sequence = self.last_sequence
        request.include_snapshot = False
        return request

    def received(self, sequence: int) -> None:
        self.last_sequence = sequence

    def ended(self, err: Optional[errors.SubagentdError]) -> None:
        """The stream ended (`err` None: cleanly, as at a server's
        shutdown); the next `request()` resumes."""
        self.resumes += 1
        if isinstance(err, errors.WatchLagged) and err.resume_after_sequence:
            self.last_sequence = err.resume_after_sequence
