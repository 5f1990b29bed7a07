"""The values a client gets back: frozen dataclasses and enums.

Times are UTC-aware `datetime`s (None when the server left them unset),
durations are `timedelta`s, enums are `IntEnum`s whose values are the
proto's numbers (so `AgentStatus.RUNNING == subagents_pb2.AGENT_STATUS_RUNNING`).
Every value read from a response message keeps that message in `proto`
(left out of `repr` and `==`), for fields a newer server adds before this
library knows them.

`subagentd._convert` builds these from messages; nothing here imports the
generated modules at run time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Mapping, Optional, Tuple

if TYPE_CHECKING:
    from subagents.v1 import subagents_pb2

__all__ = [
    "Agent",
    "AgentError",
    "AgentStatus",
    "AgentTypeInfo",
    "Approval",
    "ApprovalDecision",
    "Attempt",
    "AwaitMode",
    "AwaitResult",
    "Event",
    "EventKind",
    "McpSettings",
    "ServerInfo",
    "SteerDelivery",
    "SteerResult",
    "ToolCall",
    "TranscriptEntry",
    "TranscriptEntryKind",
    "Usage",
    "Workspace",
]


class AgentStatus(enum.IntEnum):
    """An agent's lifecycle state (`subagents.v1.AgentStatus`)."""

    UNSPECIFIED = 0
    QUEUED = 1
    RUNNING = 2
    AWAITING_APPROVAL = 3
    DONE = 4
    FAILED = 5
    CANCELLED = 6

    @property
    def terminal(self) -> bool:
        """DONE, FAILED or CANCELLED: the agent will not change again."""
        return self in (AgentStatus.DONE, AgentStatus.FAILED, AgentStatus.CANCELLED)


class EventKind(enum.IntEnum):
    """What a watch event says happened (`subagents.v1.AgentEventKind`)."""

    UNSPECIFIED = 0
    SNAPSHOT = 1
    QUEUED = 2
    STARTED = 3
    STEERED = 4
    AWAITING_APPROVAL = 5
    DONE = 6
    FAILED = 7
    CANCELLED = 8
    RETRYING = 9
    OUTPUT = 10
    TOOL_CALL = 11
    WORKSPACE_SAVED = 12


class AwaitMode(enum.IntEnum):
    """Whether an Await returns when all or any of its agents settled."""

    UNSPECIFIED = 0
    ALL = 1
    ANY = 2


class SteerDelivery(enum.IntEnum):
    """Whether a steer message reached the run or waits for it."""

    UNSPECIFIED = 0
    DELIVERED = 1
    BUFFERED = 2


class ApprovalDecision(enum.IntEnum):
    """An Approve's decision."""

    UNSPECIFIED = 0
    APPROVE = 1
    DENY = 2


class TranscriptEntryKind(enum.IntEnum):
    """What a transcript entry records."""

    UNSPECIFIED = 0
    PROMPT = 1
    STEER = 2
    TOOL_CALL = 3
    RESULT = 4
    ELIDED = 5


@dataclass(frozen=True)
class Usage:
    """Tokens and tool calls a run reported."""

    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0


@dataclass(frozen=True)
class AgentError:
    """Why an agent (or an attempt) failed or was cancelled."""

    code: str
    message: str


@dataclass(frozen=True)
class Approval:
    """A pending approval request of an AWAITING_APPROVAL agent."""

    id: str
    tool_name: str
    detail: str


@dataclass(frozen=True)
class Attempt:
    """One attempt (model) of an agent's run."""

    attempt: int
    model: str
    error: Optional[AgentError]
    started_at: Optional[datetime]
    ended_at: Optional[datetime]


@dataclass(frozen=True)
class ToolCall:
    """A tool call a run reported."""

    name: str
    input_digest: str


@dataclass(frozen=True)
class Workspace:
    """A run's branch and what it changed, from the commit its worktree
    started at to the branch's head (`subagents.v1.Workspace`)."""

    branch: str
    #: Whether the branch still exists (`[agents.NAME] keep`).
    kept: bool
    base_commit: str
    head_commit: str
    files_changed: int
    insertions: int
    deletions: int


@dataclass(frozen=True)
class Agent:
    """An agent as the server showed it (`subagents.v1.Agent`).

    `elapsed` is the proto's `elapsed_ms`; `error` and `approval` are None
    when unset; `attempts` is oldest first."""

    id: str
    agent: str
    model: str
    description: str
    parent_id: str
    root_id: str
    lead_id: str
    depth: int
    status: AgentStatus
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    elapsed: timedelta
    result: str
    error: Optional[AgentError]
    approval: Optional[Approval]
    usage: Usage
    labels: Mapping[str, str]
    background: bool
    detached: bool
    queue_reason: str
    bucket: str
    worker_id: str
    attempt: int
    total_usage: Usage
    trace_id: str
    tenant: str
    conversation_id: str
    continues_id: str
    turn: int
    attempts: Tuple[Attempt, ...]
    collected_time: Optional[datetime]
    #: What its run left in its workspace (types with `workspace =
    #: "worktree"`), once saved; None until then and for other types.
    workspace: Optional["Workspace"]
    proto: "subagents_pb2.Agent" = field(repr=False, compare=False)


@dataclass(frozen=True)
class Event:
    """One WatchAgents event. `output` is the chunk of an OUTPUT event,
    `tool_call` the call of a TOOL_CALL event (None otherwise)."""

    sequence: int
    kind: EventKind
    agent: Agent
    output: str
    tool_call: Optional[ToolCall]
    proto: "subagents_pb2.WatchAgentsResponse" = field(repr=False, compare=False)


@dataclass(frozen=True)
class AwaitResult:
    """What an Await returned: the agents (in the order asked, or the inbox
    order) and whether its `timeout` passed first."""

    agents: Tuple[Agent, ...]
    timed_out: bool
    proto: "subagents_pb2.AwaitResponse" = field(repr=False, compare=False)


@dataclass(frozen=True)
class SteerResult:
    """The agent after a Steer, and whether the message reached the run."""

    agent: Agent
    delivery: SteerDelivery
    proto: "subagents_pb2.SteerResponse" = field(repr=False, compare=False)


@dataclass(frozen=True)
class TranscriptEntry:
    """One entry of a conversation's transcript. `status`, `error` and
    `workspace` are set on RESULT entries; `elided_*` on ELIDED ones."""

    kind: TranscriptEntryKind
    agent_id: str
    turn: int
    time: Optional[datetime]
    text: str
    status: AgentStatus
    error: Optional[AgentError]
    elided_entries: int
    elided_bytes: int
    #: RESULT of a turn whose type has a workspace: what its run left there.
    workspace: Optional[Workspace]
    proto: "subagents_pb2.TranscriptEntry" = field(repr=False, compare=False)


@dataclass(frozen=True)
class AgentTypeInfo:
    """A configured agent type."""

    name: str
    description: str
    runner: str
    default_model: str
    continuable: bool


@dataclass(frozen=True)
class McpSettings:
    """The server's MCP settings. `max_await` is None when unset."""

    approvals: str
    max_await: Optional[timedelta]
    max_result_chars: int


@dataclass(frozen=True)
class ServerInfo:
    """GetServerInfo: the server's version and agent types."""

    version: str
    agent_types: Tuple[AgentTypeInfo, ...]
    mcp: Optional[McpSettings]
    proto: "subagents_pb2.GetServerInfoResponse" = field(repr=False, compare=False)
