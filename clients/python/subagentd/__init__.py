"""Typed Python client and worker library for subagentd (`subagents.v1`).

    from subagentd import Client

    with Client() as client:            # SUBAGENTD_ADDR, SUBAGENTD_TOKEN, TLS files
        for n in range(3):
            client.spawn("coder", f"part {n}", background=True, lead_id="lead-1")
        settled = client.await_(lead_id="lead-1", mode="any", collect=True, timeout=600)

`Client` (sync) and `subagentd.aio.AsyncClient` (asyncio) call AgentService;
`subagentd.types` holds the values they return, `subagentd.errors` the
exceptions they raise; `subagentd.worker.Worker` serves runs of worker agent
types. The generated stubs are in the `subagents.v1` package (built into the
wheel from the protos). `subagentd.tools.LeadTools` (the `tools` extra) gives
a model loop of your own the server's MCP lead tools; it is not imported here.
"""

from . import errors, types
from .aio import AsyncClient, AsyncWatch
from .client import Client, RetryPolicy, Watch
from .errors import (
    AgentBusy,
    AgentFinished,
    AgentNotFound,
    ApprovalMismatch,
    ConversationExpired,
    DeadlineExceeded,
    DepthLimitReached,
    DescendantLimitReached,
    FieldViolation,
    GlobalLimitReached,
    InvalidRequest,
    NoLeader,
    NotAwaitingApproval,
    NotLatest,
    NotResumable,
    PermissionDenied,
    RateLimited,
    Recovering,
    ShuttingDown,
    SteerNotAccepted,
    StoreFailed,
    SubagentdError,
    TenantLimitReached,
    Unauthenticated,
    Unavailable,
    UnknownAgentType,
    WatchLagged,
    WatchLimitReached,
)
from .types import (
    Agent,
    AgentError,
    AgentStatus,
    AgentTypeInfo,
    Approval,
    ApprovalDecision,
    Attempt,
    AwaitMode,
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
from .worker import ApprovalOutcome, Cancelled, Run, RunFailed, Worker

__all__ = [
    "Agent",
    "AgentBusy",
    "AgentError",
    "AgentFinished",
    "AgentNotFound",
    "AgentStatus",
    "AgentTypeInfo",
    "Approval",
    "ApprovalDecision",
    "ApprovalMismatch",
    "ApprovalOutcome",
    "AsyncClient",
    "AsyncWatch",
    "Attempt",
    "AwaitMode",
    "AwaitResult",
    "Cancelled",
    "Client",
    "ConversationExpired",
    "DeadlineExceeded",
    "DepthLimitReached",
    "DescendantLimitReached",
    "Event",
    "EventKind",
    "FieldViolation",
    "GlobalLimitReached",
    "InvalidRequest",
    "McpSettings",
    "NoLeader",
    "NotAwaitingApproval",
    "NotLatest",
    "NotResumable",
    "PermissionDenied",
    "RateLimited",
    "Recovering",
    "RetryPolicy",
    "Run",
    "RunFailed",
    "ServerInfo",
    "ShuttingDown",
    "SteerDelivery",
    "SteerNotAccepted",
    "SteerResult",
    "StoreFailed",
    "SubagentdError",
    "TenantLimitReached",
    "ToolCall",
    "TranscriptEntry",
    "TranscriptEntryKind",
    "Unauthenticated",
    "Unavailable",
    "UnknownAgentType",
    "Usage",
    "Workspace",
    "WatchLagged",
    "WatchLimitReached",
    "Watch",
    "Worker",
    "errors",
    "types",
]
