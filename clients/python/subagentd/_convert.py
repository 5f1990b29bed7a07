"""The one place protobuf messages become `subagentd.types` values and
Python values become protobuf fields.

An enum number this library does not know (a newer server) reads as
UNSPECIFIED; the raw message stays in the value's `proto`.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Optional, Type, TypeVar, Union

from google.protobuf import duration_pb2, timestamp_pb2

from subagents.v1 import subagents_pb2 as pb

from .types import (
    Agent,
    AgentError,
    AgentStatus,
    AgentTypeInfo,
    Approval,
    Attempt,
    AwaitResult,
    Event,
    EventKind,
    McpSettings,
    ServerInfo,
    SteerDelivery,
    SteerResult,
    ToolCall,
    TranscriptEntry,
    TranscriptEntryKind,
    Usage,
    Workspace,
)

#: A span of time a caller passes: seconds, or a timedelta.
Seconds = Union[float, int, timedelta]

E = TypeVar("E", AgentStatus, EventKind, SteerDelivery, TranscriptEntryKind)


def _enum(cls: Type[E], value: int) -> E:
    try:
        return cls(value)
    except ValueError:
        return cls(0)


def to_timedelta(value: Seconds) -> timedelta:
    """`value` (seconds or a timedelta) as a timedelta."""
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def to_seconds(value: Seconds) -> float:
    """`value` (seconds or a timedelta) in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def duration(value: Seconds) -> duration_pb2.Duration:
    """A `google.protobuf.Duration` of `value` (seconds or a timedelta)."""
    out = duration_pb2.Duration()
    out.FromTimedelta(to_timedelta(value))
    return out


def _time(message: pb.Agent | pb.AgentAttempt | pb.TranscriptEntry, name: str) -> Optional[datetime]:
    if not message.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=timezone.utc)


def _error(error: pb.AgentError) -> AgentError:
    return AgentError(code=error.code, message=error.message)


def usage(message: pb.Usage) -> Usage:
    return Usage(
        input_tokens=message.input_tokens, output_tokens=message.output_tokens, tool_calls=message.tool_calls
    )


def attempt(message: pb.AgentAttempt) -> Attempt:
    return Attempt(
        attempt=message.attempt,
        model=message.model,
        error=_error(message.error) if message.HasField("error") else None,
        started_at=_time(message, "started_at"),
        ended_at=_time(message, "ended_at"),
    )


def agent(message: pb.Agent) -> Agent:
    """`subagents.v1.Agent` → `Agent`."""
    return Agent(
        id=message.id,
        agent=message.agent,
        model=message.model,
        description=message.description,
        parent_id=message.parent_id,
        root_id=message.root_id,
        lead_id=message.lead_id,
        depth=message.depth,
        status=_enum(AgentStatus, message.status),
        created_at=_time(message, "created_at"),
        started_at=_time(message, "started_at"),
        finished_at=_time(message, "finished_at"),
        elapsed=timedelta(milliseconds=message.elapsed_ms),
        result=message.result,
        error=_error(message.error) if message.HasField("error") else None,
        approval=(
            Approval(id=message.approval.id, tool_name=message.approval.tool_name, detail=message.approval.detail)
            if message.HasField("approval")
            else None
        ),
        usage=usage(message.usage),
        labels=dict(message.labels),
        background=message.background,
        detached=message.detached,
        queue_reason=message.queue_reason,
        bucket=message.bucket,
        worker_id=message.worker_id,
        attempt=message.attempt,
        total_usage=usage(message.total_usage),
        trace_id=message.trace_id,
        tenant=message.tenant,
        conversation_id=message.conversation_id,
        continues_id=message.continues_id,
        turn=message.turn,
        attempts=tuple(attempt(a) for a in message.attempts),
        collected_time=_time(message, "collected_time"),
        workspace=workspace(message.workspace) if message.HasField("workspace") else None,
        proto=message,
    )


def workspace(message: pb.Workspace) -> Workspace:
    return Workspace(
        branch=message.branch,
        kept=message.kept,
        base_commit=message.base_commit,
        head_commit=message.head_commit,
        files_changed=message.files_changed,
        insertions=message.insertions,
        deletions=message.deletions,
    )


def event(message: pb.WatchAgentsResponse) -> Event:
    """`subagents.v1.WatchAgentsResponse` → `Event`."""
    return Event(
        sequence=message.sequence,
        kind=_enum(EventKind, message.kind),
        agent=agent(message.agent),
        output=message.output,
        tool_call=(
            ToolCall(name=message.tool_call.name, input_digest=message.tool_call.input_digest)
            if message.HasField("tool_call")
            else None
        ),
        proto=message,
    )


def await_result(message: pb.AwaitResponse) -> AwaitResult:
    return AwaitResult(agents=tuple(agent(a) for a in message.agents), timed_out=message.timed_out, proto=message)


def steer_result(message: pb.SteerResponse) -> SteerResult:
    return SteerResult(
        agent=agent(message.agent), delivery=_enum(SteerDelivery, message.delivery), proto=message
    )


def transcript_entry(message: pb.TranscriptEntry) -> TranscriptEntry:
    """`subagents.v1.TranscriptEntry` → `TranscriptEntry` (also what
    `subagentd.worker.Run.history` holds)."""
    return TranscriptEntry(
        kind=_enum(TranscriptEntryKind, message.kind),
        agent_id=message.agent_id,
        turn=message.turn,
        time=_time(message, "time"),
        text=message.text,
        status=_enum(AgentStatus, message.status),
        error=_error(message.error) if message.HasField("error") else None,
        elided_entries=message.elided_entries,
        elided_bytes=message.elided_bytes,
        workspace=workspace(message.workspace) if message.HasField("workspace") else None,
        proto=message,
    )


def server_info(message: pb.GetServerInfoResponse) -> ServerInfo:
    mcp = None
    if message.HasField("mcp"):
        m = message.mcp
        mcp = McpSettings(
            approvals=m.approvals,
            max_await=m.max_await.ToTimedelta() if m.HasField("max_await") else None,
            max_result_chars=m.max_result_chars,
        )
    return ServerInfo(
        version=message.version,
        agent_types=tuple(
            AgentTypeInfo(
                name=t.name,
                description=t.description,
                runner=t.runner,
                default_model=t.default_model,
                continuable=t.continuable,
            )
            for t in message.agent_types
        ),
        mcp=mcp,
        proto=message,
    )
