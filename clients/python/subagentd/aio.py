"""The asyncio client (`AsyncClient`, on `grpc.aio`): the same methods as
`subagentd.Client`, as coroutines; `list`, `transcript` and `watch` return
async iterators.

    async with AsyncClient() as client:
        a = await client.spawn("coder", "fix the flaky test", background=True)
        async for event in client.watch([a.id]):
            if event.agent.status.terminal:
                break
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import TracebackType
from typing import AsyncIterator, Iterable, List, Mapping, Optional, Sequence, Type, TypeVar, Union, overload

import grpc
import grpc.aio
from google.protobuf import message as _message

from subagents.v1 import subagents_pb2 as pb

from . import _common, _convert, errors
from ._common import UNSET, CallTimeout, RetryPolicy
from ._convert import Seconds
from .types import Agent, AgentStatus, ApprovalDecision, AwaitMode, AwaitResult, Event, ServerInfo, SteerResult, TranscriptEntry

__all__ = ["AsyncClient", "AsyncWatch"]

Req = TypeVar("Req", bound=_message.Message)
Resp = TypeVar("Resp", bound=_message.Message)


class AsyncClient:
    """An asyncio client of AgentService; see `subagentd.Client` for the
    settings and the retry rules. Create it inside a running event loop and
    `await client.close()` (or `async with`) when done."""

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
        channel: Optional[grpc.aio.Channel] = None,
    ) -> None:
        if channel is None:
            conn = _common.resolve(address, token, ca_file, cert_file, key_file)
            if conn.credentials is not None:
                channel = grpc.aio.secure_channel(conn.target, conn.credentials, options=_common.CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.insecure_channel(conn.target, options=_common.CHANNEL_OPTIONS)
            self._owns_channel = True
            self._metadata = conn.metadata
        else:
            self._owns_channel = False
            self._metadata = (("authorization", f"Bearer {token.strip()}"),) if token and token.strip() else ()
        self.channel = channel
        self._default_timeout = _common.seconds_or_none(call_timeout, None)
        self._retry = retry

        def unary(name: str, req: Type[Req], resp: Type[Resp]) -> grpc.aio.UnaryUnaryMultiCallable[Req, Resp]:
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
        self._watch: grpc.aio.UnaryStreamMultiCallable[pb.WatchAgentsRequest, pb.WatchAgentsResponse]
        self._watch = channel.unary_stream(
            _common.SERVICE + "WatchAgents",
            request_serializer=pb.WatchAgentsRequest.SerializeToString,
            response_deserializer=pb.WatchAgentsResponse.FromString,
        )

    async def close(self) -> None:
        """Closes the channel (unless it was given)."""
        if self._owns_channel:
            await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.close()

    async def _call(
        self,
        rpc: grpc.aio.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        timeout: Optional[float],
        retry: bool,
    ) -> Resp:
        deadline = _common.Deadline(timeout, self._retry)
        while True:
            try:
                return await rpc(request, timeout=deadline.remaining(), metadata=self._metadata)
            except grpc.aio.AioRpcError as e:
                err = errors.from_rpc_error(e)
                wait = deadline.next_backoff() if retry and _common.retried(err) else None
                if wait is None:
                    raise err from e
            await asyncio.sleep(wait)

    def _timeout(self, call_timeout: CallTimeout) -> Optional[float]:
        return _common.seconds_or_none(call_timeout, self._default_timeout)

    async def spawn(
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
        """See `Client.spawn`."""
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
        response = await self._call(self._spawn, request, self._timeout(call_timeout), bool(request.idempotency_key))
        return _convert.agent(response.agent)

    @overload
    async def status(self, ids: str, *, call_timeout: CallTimeout = UNSET) -> Agent: ...

    @overload
    async def status(
        self, ids: Union[List[str], tuple[str, ...]], *, call_timeout: CallTimeout = UNSET
    ) -> List[Agent]: ...

    async def status(
        self, ids: Union[str, List[str], tuple[str, ...]], *, call_timeout: CallTimeout = UNSET
    ) -> Union[Agent, List[Agent]]:
        """See `Client.status`."""
        one, request = _common.status_ids(ids)
        response = await self._call(self._status, request, self._timeout(call_timeout), True)
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
    ) -> AsyncIterator[Agent]:
        """See `Client.list`: an async iterator."""
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

        async def pages() -> AsyncIterator[Agent]:
            while True:
                response = await self._call(self._status, request, timeout, True)
                for a in response.agents:
                    yield _convert.agent(a)
                if not response.next_page_token:
                    return
                request.page_token = response.next_page_token

        return pages()

    async def await_(
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
        """See `Client.await_`."""
        request = _common.await_request(
            ids, lead_id=lead_id, parent_id=parent_id, mode=mode, timeout=timeout, collect=collect
        )
        call = _common.await_call_timeout(call_timeout, self._default_timeout, timeout)
        return _convert.await_result(await self._call(self._await, request, call, True))

    async def cancel(
        self, id: str = "", *, lead_id: str = "", reason: str = "", call_timeout: CallTimeout = UNSET
    ) -> List[Agent]:
        """See `Client.cancel`."""
        request = _common.cancel_request(id, lead_id=lead_id, reason=reason)
        response = await self._call(self._cancel, request, self._timeout(call_timeout), True)
        return [_convert.agent(a) for a in response.agents]

    async def steer(self, id: str, message: str, *, call_timeout: CallTimeout = UNSET) -> SteerResult:
        """See `Client.steer` (not retried)."""
        request = pb.SteerRequest(id=id, message=message)
        return _convert.steer_result(await self._call(self._steer, request, self._timeout(call_timeout), False))

    async def approve(
        self,
        id: str,
        approval_id: str,
        decision: Union[bool, ApprovalDecision] = True,
        *,
        note: str = "",
        call_timeout: CallTimeout = UNSET,
    ) -> Agent:
        """See `Client.approve` (not retried)."""
        request = _common.approve_request(id, approval_id=approval_id, approve=decision, note=note)
        response = await self._call(self._approve, request, self._timeout(call_timeout), False)
        return _convert.agent(response.agent)

    def transcript(
        self,
        agent_id: str = "",
        *,
        conversation_id: str = "",
        page_size: int = 0,
        call_timeout: CallTimeout = UNSET,
    ) -> AsyncIterator[TranscriptEntry]:
        """See `Client.transcript`: an async iterator."""
        request = pb.GetTranscriptRequest(agent_id=agent_id, conversation_id=conversation_id, page_size=page_size)
        timeout = self._timeout(call_timeout)

        async def entries() -> AsyncIterator[TranscriptEntry]:
            while True:
                response = await self._call(self._transcript, request, timeout, True)
                for entry in response.entries:
                    yield _convert.transcript_entry(entry)
                if not response.next_page_token:
                    return
                request.page_token = response.next_page_token

        return entries()

    async def server_info(self, *, call_timeout: CallTimeout = UNSET) -> ServerInfo:
        """See `Client.server_info`."""
        response = await self._call(
            self._server_info, pb.GetServerInfoRequest(), self._timeout(call_timeout), True
        )
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
    ) -> "AsyncWatch":
        """See `Client.watch`: an async iterator with the same resume rules."""
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
        return AsyncWatch(self._watch, request, self._metadata, _common.Deadline(timeout, self._retry))


class AsyncWatch(AsyncIterator[Event]):
    """A resuming WatchAgents stream for asyncio (see `Client.watch`)."""

    def __init__(
        self,
        rpc: grpc.aio.UnaryStreamMultiCallable[pb.WatchAgentsRequest, pb.WatchAgentsResponse],
        request: pb.WatchAgentsRequest,
        metadata: _common.Metadata,
        deadline: _common.Deadline,
    ) -> None:
        self._rpc = rpc
        self._position = _common.WatchPosition(request)
        self._metadata = metadata
        self._deadline = deadline
        self._call: Optional[grpc.aio.UnaryStreamCall[pb.WatchAgentsRequest, pb.WatchAgentsResponse]] = None
        self._closed = False

    @property
    def last_sequence(self) -> int:
        """The sequence of the last event received (where a resume starts)."""
        return self._position.last_sequence

    @property
    def resumes(self) -> int:
        """How many times the watch subscribed again."""
        return self._position.resumes

    def _open(self) -> grpc.aio.UnaryStreamCall[pb.WatchAgentsRequest, pb.WatchAgentsResponse]:
        self._call = self._rpc(self._position.request(), timeout=self._deadline.remaining(), metadata=self._metadata)
        return self._call

    async def subscribed(self) -> None:
        """Opens the stream if it is not open and waits for the server's
        response headers: the server subscribed, so every later event comes."""
        call = self._call if self._call is not None else self._open()
        await call.initial_metadata()

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._closed:
                raise StopAsyncIteration
            call = self._call if self._call is not None else self._open()
            err: Optional[errors.SubagentdError] = None
            try:
                message = await call.read()
            except asyncio.CancelledError:
                if self._closed:
                    raise StopAsyncIteration from None
                raise
            except grpc.aio.AioRpcError as e:
                if self._closed:
                    raise StopAsyncIteration from None
                err = errors.from_rpc_error(e)
                if not _common.watch_resumes(err):
                    raise err from e
            else:
                if isinstance(message, pb.WatchAgentsResponse):
                    self._position.received(message.sequence)
                    self._deadline.reset()
                    return _convert.event(message)
                # EOF: ended cleanly (a server's shutdown): resume.
            self._call = None
            self._position.ended(err)
            wait = self._deadline.next_backoff()
            if wait is None:
                raise err or errors.Unavailable(
                    "the watch ended and could not subscribe again", code=grpc.StatusCode.UNAVAILABLE
                )
            await asyncio.sleep(wait)

    def close(self) -> None:
        """Ends the watch; a pending iteration stops."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()
