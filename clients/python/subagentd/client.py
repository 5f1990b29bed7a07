"""The synchronous client (`Client`), and helpers for raw stubs.

    from subagentd import Client, GlobalLimitReached

    with Client() as client:                       # SUBAGENTD_ADDR, SUBAGENTD_TOKEN, …
        a = client.spawn("coder", "fix the flaky test", background=True, lead_id="lead-1")
        done = client.await_([a.id], timeout=600)
        print(done.agents[0].status, done.agents[0].result)

Every method takes keyword arguments named like the proto's fields, and
`call_timeout` (the gRPC deadline: seconds or a timedelta, None for none; by
default the client's). Errors are `subagentd.errors.SubagentdError`
subclasses. Idempotent calls (status, list, await_, cancel, transcript,
server_info, a watch's resubscription) and a Spawn with an idempotency key
(`spawn` makes one unless given `idempotency_key=""`) are retried with backoff
on NO_LEADER and RECOVERING while their deadline leaves room; steer and
approve are not.

For code that uses the generated stubs directly: `channel(target)` opens a
channel that sends `SUBAGENTD_TOKEN` (or `token=`) as a bearer key, with TLS
from `SUBAGENTD_CA_FILE` etc.; `error_info(err)` and `error_details(err)`
read a grpc error's ErrorInfo and details.
"""

from __future__ import annotations

import time
from datetime import timedelta
from types import TracebackType
from typing import (
    Any,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Type,
    TypeVar,
    Union,
    overload,
)

import grpc
from google.protobuf import message as _message
from google.rpc import error_details_pb2, status_pb2

from subagents.v1 import subagents_pb2 as pb

from . import _common, _convert, errors
from ._common import UNSET, CallTimeout, RetryPolicy
from ._convert import Seconds
from .types import Agent, AgentStatus, ApprovalDecision, AwaitMode, AwaitResult, Event, ServerInfo, SteerResult, TranscriptEntry

__all__ = [
    "DOMAIN",
    "Client",
    "RetryPolicy",
    "Watch",
    "channel",
    "error_details",
    "error_info",
    "error_reason",
    "rich_status",
]

DOMAIN = errors.DOMAIN

Req = TypeVar("Req", bound=_message.Message)
Resp = TypeVar("Resp", bound=_message.Message)


# ----- raw channels and error helpers (for the generated stubs) ------------------


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = list(details.metadata or []) + [self._header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


def channel(
    target: str,
    token: Optional[str] = None,
    ca_file: Optional[str] = None,
    cert_file: Optional[str] = None,
    key_file: Optional[str] = None,
) -> grpc.Channel:
    """A channel to subagentd at `target` ("host:port", or an `http://` /
    `https://` URL as the CLI takes) whose calls carry `token` — by default
    the `SUBAGENTD_TOKEN` environment variable; none when both are empty (a
    server without authentication).

    With `ca_file` (PEM; default `SUBAGENTD_CA_FILE`) the channel is TLS,
    verifying the server with that CA; `cert_file` and `key_file` (default
    `SUBAGENTD_CERT_FILE`, `SUBAGENTD_KEY_FILE`) add a client certificate
    (mTLS). Without any of them the channel is plaintext."""
    conn = _common.resolve(target, token, ca_file, cert_file, key_file)
    if conn.credentials is not None:
        base = grpc.secure_channel(conn.target, conn.credentials, options=_common.CHANNEL_OPTIONS)
    else:
        base = grpc.insecure_channel(conn.target, options=_common.CHANNEL_OPTIONS)
    if not conn.metadata:
        return base
    return grpc.intercept_channel(base, _Bearer(conn.metadata[0][1].removeprefix("Bearer ")))


def rich_status(err: grpc.RpcError) -> Optional[status_pb2.Status]:
    """The `google.rpc.Status` from the error's `grpc-status-details-bin`
    trailer, or None when it has none (e.g. a transport error)."""
    return errors.rich_status(err)


def error_details(err: grpc.RpcError) -> List[_message.Message]:
    """The status details, unpacked (ErrorInfo, QuotaFailure, …) in the order
    sent. Details of unknown types are left out."""
    return errors.status_details(errors.rich_status(err))


def error_info(err: grpc.RpcError) -> Optional[error_details_pb2.ErrorInfo]:
    """The error's `google.rpc.ErrorInfo`, or None when it carries none."""
    for detail in error_details(err):
        if isinstance(detail, error_details_pb2.ErrorInfo):
            return detail
    return None


def error_reason(err: grpc.RpcError) -> Optional[str]:
    """`ErrorInfo.reason` of a subagentd error (e.g. "GLOBAL_LIMIT_REACHED"),
    or None when the error carries no ErrorInfo from subagentd."""
    info = error_info(err)
    if info is None or info.domain != DOMAIN:
        return None
    return info.reason


# ----- the client ----------------------------------------------------------------------


class Client:
    """A synchronous client of AgentService.

    `address` ("host:port", `http://…` or `https://…`), `token` and the TLS
    files default to the CLI's environment variables (`SUBAGENTD_ADDR`,
    default http://127.0.0.1:50051; `SUBAGENTD_TOKEN`; `SUBAGENTD_CA_FILE`,
    `SUBAGENTD_CERT_FILE`, `SUBAGENTD_KEY_FILE`). `call_timeout` is the
    default deadline of unary calls (a watch has none unless given one);
    `retry` the backoff for NO_LEADER / RECOVERING and watch resumes.
    With `channel=`, that channel is used as is and only an explicit
    `token=` is added to calls. Close the client (or use it as a context
    manager) to close its channel."""

    def __init__(
        self,
        address: Optional[str] = None,
        *,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        cert_file: Optional[str] = None,
        key_file: Optional[str] = None,
        call_timeout: Union[float, timedelta, None] = _common.DEFAULT_CALL_TIMEOUT,
        retry: RetryPolicy = RetryPolicy(),
        channel: Optional[grpc.Channel] = None,
    ) -> None:
        if channel is None:
            conn = _common.resolve(address, token, ca_file, cert_file, key_file)
            if conn.credentials is not None:
                channel = grpc.secure_channel(conn.target, conn.credentials, options=_common.CHANNEL_OPTIONS)
            else:
                channel = grpc.insecure_channel(conn.target, options=_common.CHANNEL_OPTIONS)
            self._owns_channel = True
            self._metadata = conn.metadata
        else:
            self._owns_channel = False
            self._metadata = (("authorization", f"Bearer {token.strip()}"),) if token and token.strip() else ()
        self.channel = channel
        self._default_timeout = _common.seconds_or_none(call_timeout, None)
        self._retry = retry

        def unary(name: str, req: Type[Req], resp: Type[Resp]) -> grpc.UnaryUnaryMultiCallable[Req, Resp]:
            return channel.unary_unary(
                _common.SERVICE + name, request_serializer=req.SerializeToString, response_deserializer=resp.FromString
            )

        self._spawn = unary("Spawn", pb.SpawnRequest, pb.SpawnResponse)
        self._status = unary("Status", pb.StatusRequest, pb.StatusResponse)
        self._await = unary("Await", pb.AwaitRequest, pb.AwaitResponse)
        self._cancel = unary("Cancel", pb.CancelRequest, pb.CancelResponse)
        self._steer = unary("Steer", pb.SteerRequest, pb.SteerResponse)
        self._approve = unary("Approve", pb.ApproveRequest, pb.ApproveResponse)
        self._transcript = unary("GetTranscript", pb.GetTranscriptRequest, pb.GetTranscriptResponse)
        self._server_info = unary("GetServerInfo", pb.GetServerInfoRequest, pb.GetServerInfoResponse)
        self._watch: grpc.UnaryStreamMultiCallable[pb.WatchAgentsRequest, pb.WatchAgentsResponse]
        self._watch = channel.unary_stream(
            _common.SERVICE + "WatchAgents",
            request_serializer=pb.WatchAgentsRequest.SerializeToString,
            response_deserializer=pb.WatchAgentsResponse.FromString,
        )

    # ----- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Closes the channel (unless it was given)."""
        if self._owns_channel:
            self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()

    # ----- calls ----------------------------------------------------------------

    def _call(
        self,
        rpc: grpc.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        timeout: Optional[float],
        retry: bool,
    ) -> Resp:
        deadline = _common.Deadline(timeout, self._retry)
        while True:
            try:
                return rpc(request, timeout=deadline.remaining(), metadata=self._metadata)
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e)
                wait = deadline.next_backoff() if retry and _common.retried(err) else None
                if wait is None:
                    raise err from e
            time.sleep(wait)

    def _timeout(self, call_timeout: CallTimeout) -> Optional[float]:
        return _common.seconds_or_none(call_timeout, self._default_timeout)

    def spawn(
        self,
        agent: str = "",
        prompt: str = "",
        *,
        model: str = "",
        description: str = "",
        parent_id: str = "",
        lead_id: str = "",
        background: bool = False,
        labels: Optional[Mapping[str, str]] = None,
        timeout: Optional[Seconds] = None,
        idempotency_key: Optional[str] = None,
        detached: bool = False,
        continue_from: str = "",
        fork: bool = False,
        workspace_base: str = "",
        call_timeout: CallTimeout = UNSET,
    ) -> Agent:
        """Spawns an agent (SpawnRequest's fields; `timeout` is the run's
        deadline). `idempotency_key` defaults to a fresh uuid4, so a retry
        after NO_LEADER / RECOVERING cannot spawn twice; pass "" for none
        (and no retry). A foreground spawn (the default) returns the settled
        agent: give it a `call_timeout` long enough for the run."""
        request = _common.spawn_request(
            agent=agent,
            prompt=prompt,
            model=model,
            description=description,
            parent_id=parent_id,
            lead_id=lead_id,
            background=background,
            labels=labels,
            timeout=timeout,
            idempotency_key=idempotency_key,
            detached=detached,
            continue_from=continue_from,
            fork=fork,
            workspace_base=workspace_base,
        )
        response = self._call(self._spawn, request, self._timeout(call_timeout), bool(request.idempotency_key))
        return _convert.agent(response.agent)

    @overload
    def status(self, ids: str, *, call_timeout: CallTimeout = UNSET) -> Agent: ...

    @overload
    def status(self, ids: Union[List[str], tuple[str, ...]], *, call_timeout: CallTimeout = UNSET) -> List[Agent]: ...

    def status(
        self, ids: Union[str, List[str], tuple[str, ...]], *, call_timeout: CallTimeout = UNSET
    ) -> Union[Agent, List[Agent]]:
        """One agent by id, or a list of agents by ids (at most 100, in the
        order given). Unknown ids raise `AgentNotFound`."""
        one, request = _common.status_ids(ids)
        response = self._call(self._status, request, self._timeout(call_timeout), True)
        agents = [_convert.agent(a) for a in response.agents]
        return agents[0] if one else agents

    def list(
        self,
        *,
        parent_id: str = "",
        root_id: str = "",
        lead_id: str = "",
        statuses: Iterable[AgentStatus] = (),
        tenant: str = "",
        conversation_id: str = "",
        uncollected: bool = False,
        page_size: int = 0,
        call_timeout: CallTimeout = UNSET,
    ) -> Iterator[Agent]:
        """Agents matching the filters, oldest first, fetched a page
        (`page_size`, default the server's 100) at a time as iterated;
        `call_timeout` applies to each page."""
        request = _common.list_request(
            parent_id=parent_id,
            root_id=root_id,
            lead_id=lead_id,
            statuses=statuses,
            tenant=tenant,
            conversation_id=conversation_id,
            uncollected=uncollected,
            page_size=page_size,
        )
        timeout = self._timeout(call_timeout)

        def pages() -> Iterator[Agent]:
            while True:
                response = self._call(self._status, request, timeout, True)
                for a in response.agents:
                    yield _convert.agent(a)
                if not response.next_page_token:
                    return
                request.page_token = response.next_page_token

        return pages()

    def await_(
        self,
        ids: Union[str, Sequence[str], None] = None,
        *,
        lead_id: str = "",
        parent_id: str = "",
        mode: Union[AwaitMode, str] = "all",
        timeout: Seconds = _common.DEFAULT_AWAIT_TIMEOUT,
        collect: bool = False,
        call_timeout: CallTimeout = UNSET,
    ) -> AwaitResult:
        """Waits up to `timeout` (the Await's own wait: seconds or a
        timedelta) until all (`mode="all"`) or any (`"any"`) of `ids` settled,
        or — with `lead_id` or `parent_id` instead of ids — until that inbox
        holds settled agents (only those are returned; `collect=True` marks
        them so the next inbox Await does not return them again). The
        default `call_timeout` is the client's plus `timeout`."""
        request = _common.await_request(
            ids, lead_id=lead_id, parent_id=parent_id, mode=mode, timeout=timeout, collect=collect
        )
        call = _common.await_call_timeout(call_timeout, self._default_timeout, timeout)
        return _convert.await_result(self._call(self._await, request, call, True))

    def cancel(
        self, id: str = "", *, lead_id: str = "", reason: str = "", call_timeout: CallTimeout = UNSET
    ) -> List[Agent]:
        """Cancels an agent and its live descendants, or (`lead_id`) every
        live agent under a lead; returns the agents this call cancelled."""
        request = _common.cancel_request(id, lead_id=lead_id, reason=reason)
        response = self._call(self._cancel, request, self._timeout(call_timeout), True)
        return [_convert.agent(a) for a in response.agents]

    def steer(self, id: str, message: str, *, call_timeout: CallTimeout = UNSET) -> SteerResult:
        """Sends a steer message to a live agent (not retried)."""
        request = pb.SteerRequest(id=id, message=message)
        return _convert.steer_result(self._call(self._steer, request, self._timeout(call_timeout), False))

    def approve(
        self,
        id: str,
        approval_id: str,
        decision: Union[bool, ApprovalDecision] = True,
        *,
        note: str = "",
        call_timeout: CallTimeout = UNSET,
    ) -> Agent:
        """Decides an agent's pending approval (`decision`: True or
        `ApprovalDecision.APPROVE` approves, False or `DENY` denies); not
        retried."""
        request = _common.approve_request(id, approval_id=approval_id, approve=decision, note=note)
        return _convert.agent(self._call(self._approve, request, self._timeout(call_timeout), False).agent)

    def transcript(
        self,
        agent_id: str = "",
        *,
        conversation_id: str = "",
        page_size: int = 0,
        call_timeout: CallTimeout = UNSET,
    ) -> Iterator[TranscriptEntry]:
        """The transcript of an agent's history or of a whole conversation,
        oldest first, fetched a page at a time as iterated."""
        request = pb.GetTranscriptRequest(agent_id=agent_id, conversation_id=conversation_id, page_size=page_size)
        timeout = self._timeout(call_timeout)

        def entries() -> Iterator[TranscriptEntry]:
            while True:
                response = self._call(self._transcript, request, timeout, True)
                for entry in response.entries:
                    yield _convert.transcript_entry(entry)
                if not response.next_page_token:
                    return
                request.page_token = response.next_page_token

        return entries()

    def server_info(self, *, call_timeout: CallTimeout = UNSET) -> ServerInfo:
        """The server's version, agent types and MCP settings."""
        response = self._call(self._server_info, pb.GetServerInfoRequest(), self._timeout(call_timeout), True)
        return _convert.server_info(response)

    def watch(
        self,
        ids: Union[str, Sequence[str], None] = None,
        *,
        parent_id: str = "",
        root_id: str = "",
        lead_id: str = "",
        after_sequence: int = 0,
        include_snapshot: bool = False,
        include_progress: bool = False,
        tenant: str = "",
        conversation_id: str = "",
        call_timeout: Union[float, timedelta, None] = None,
    ) -> "Watch":
        """Events of the matching agents, as an iterator that resumes by
        itself: when the stream drops, the server (or a standby) answers
        UNAVAILABLE, fails over, or cuts a lagging watch off (WATCH_LAGGED),
        it subscribes again with `after_sequence` = the last sequence
        received, so no event is missed or repeated; when the server cannot
        replay that far it sends SNAPSHOT events, yielded like any other.
        Other errors are raised. `call_timeout` bounds the whole watch
        (none by default). Call `subscribed()` to know the server
        subscribed (no later event is missed), `close()` to end it."""
        request = _common.watch_request(
            ids,
            parent_id=parent_id,
            root_id=root_id,
            lead_id=lead_id,
            after_sequence=after_sequence,
            include_snapshot=include_snapshot,
            include_progress=include_progress,
            tenant=tenant,
            conversation_id=conversation_id,
        )
        timeout = None if call_timeout is None else _convert.to_seconds(call_timeout)
        return Watch(self._watch, request, self._metadata, _common.Deadline(timeout, self._retry))


class Watch(Iterator[Event]):
    """A resuming WatchAgents stream (see `Client.watch`). Iterate it;
    `close()` (from any thread) ends the iteration."""

    def __init__(
        self,
        rpc: grpc.UnaryStreamMultiCallable[pb.WatchAgentsRequest, pb.WatchAgentsResponse],
        request: pb.WatchAgentsRequest,
        metadata: _common.Metadata,
        deadline: _common.Deadline,
    ) -> None:
        self._rpc = rpc
        self._position = _common.WatchPosition(request)
        self._metadata = metadata
        self._deadline = deadline
        self._call: Optional[Any] = None
        self._closed = False

    @property
    def last_sequence(self) -> int:
        """The sequence of the last event received (where a resume starts)."""
        return self._position.last_sequence

    @property
    def resumes(self) -> int:
        """How many times the watch subscribed again."""
        return self._position.resumes

    def _open(self) -> Any:
        self._call = self._rpc(self._position.request(), timeout=self._deadline.remaining(), metadata=self._metadata)
        return self._call

    def subscribed(self) -> None:
        """Opens the stream if it is not open and waits for the server's
        response headers: the server subscribed, so every later event comes."""
        call = self._call if self._call is not None else self._open()
        call.initial_metadata()

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Event:
        while True:
            if self._closed:
                raise StopIteration
            call = self._call if self._call is not None else self._open()
            err: Optional[errors.SubagentdError] = None
            try:
                message: pb.WatchAgentsResponse = next(call)
            except StopIteration:
                pass  # ended cleanly (a server's shutdown): resume
            except grpc.RpcError as e:
                if self._closed:
                    raise StopIteration from None
                err = errors.from_rpc_error(e)
                if not _common.watch_resumes(err):
                    raise err from e
            else:
                self._position.received(message.sequence)
                self._deadline.reset()
                return _convert.event(message)
            self._call = None
            self._position.ended(err)
            wait = self._deadline.next_backoff()
            if wait is None:
                raise err or errors.Unavailable("the watch ended and could not subscribe again", code=grpc.StatusCode.UNAVAILABLE)
            time.sleep(wait)

    def close(self) -> None:
        """Ends the watch; a blocked iteration stops."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()

