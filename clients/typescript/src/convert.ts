// The one module that converts between the generated messages (src/gen) and
// the types of src/types.ts: enums <-> lower-case literals, Timestamp -> Date,
// Duration <-> milliseconds, 64-bit integers -> number, "" -> undefined where
// the proto says empty means none.

import { create } from "@bufbuild/protobuf";
import { type Duration, DurationSchema, type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";

import * as pb from "./gen/subagents/v1/subagents_pb.js";
import type {
  Agent,
  AgentError,
  AgentEvent,
  AgentEventKind,
  AgentStatus,
  ApprovalDecision,
  Attempt,
  AwaitMode,
  ServerInfo,
  SteerDelivery,
  TranscriptEntry,
  TranscriptEntryKind,
  Usage,
  Workspace,
} from "./types.js";

/** A literal for each value of a generated enum, and back; `UNSPECIFIED` (0) has none. */
class EnumMap<E extends number, L extends string> {
  private readonly toLiteral = new Map<number, L>();
  private readonly toValue = new Map<string, E>();

  constructor(
    private readonly name: string,
    pairs: ReadonlyArray<readonly [E, L]>,
  ) {
    for (const [value, literal] of pairs) {
      this.toLiteral.set(value, literal);
      this.toValue.set(literal, value);
    }
  }

  literal(value: E): L {
    const literal = this.toLiteral.get(value);
    if (literal === undefined) {
      throw new TypeError(`${this.name}: unknown value ${value} from the server`);
    }
    return literal;
  }

  value(literal: L): E {
    const value = this.toValue.get(literal);
    if (value === undefined) {
      throw new TypeError(`${this.name}: ${JSON.stringify(literal)} is not one of ${[...this.toValue.keys()].join(", ")}`);
    }
    return value;
  }
}

export const STATUS = new EnumMap<pb.AgentStatus, AgentStatus>("AgentStatus", [
  [pb.AgentStatus.QUEUED, "queued"],
  [pb.AgentStatus.RUNNING, "running"],
  [pb.AgentStatus.AWAITING_APPROVAL, "awaiting_approval"],
  [pb.AgentStatus.DONE, "done"],
  [pb.AgentStatus.FAILED, "failed"],
  [pb.AgentStatus.CANCELLED, "cancelled"],
]);

export const EVENT_KIND = new EnumMap<pb.AgentEventKind, AgentEventKind>("AgentEventKind", [
  [pb.AgentEventKind.SNAPSHOT, "snapshot"],
  [pb.AgentEventKind.QUEUED, "queued"],
  [pb.AgentEventKind.STARTED, "started"],
  [pb.AgentEventKind.STEERED, "steered"],
  [pb.AgentEventKind.AWAITING_APPROVAL, "awaiting_approval"],
  [pb.AgentEventKind.DONE, "done"],
  [pb.AgentEventKind.FAILED, "failed"],
  [pb.AgentEventKind.CANCELLED, "cancelled"],
  [pb.AgentEventKind.RETRYING, "retrying"],
  [pb.AgentEventKind.OUTPUT, "output"],
  [pb.AgentEventKind.TOOL_CALL, "tool_call"],
  [pb.AgentEventKind.WORKSPACE_SAVED, "workspace_saved"],
]);

export const TRANSCRIPT_KIND = new EnumMap<pb.TranscriptEntryKind, TranscriptEntryKind>("TranscriptEntryKind", [
  [pb.TranscriptEntryKind.PROMPT, "prompt"],
  [pb.TranscriptEntryKind.STEER, "steer"],
  [pb.TranscriptEntryKind.TOOL_CALL, "tool_call"],
  [pb.TranscriptEntryKind.RESULT, "result"],
  [pb.TranscriptEntryKind.ELIDED, "elided"],
]);

export const DELIVERY = new EnumMap<pb.SteerDelivery, SteerDelivery>("SteerDelivery", [
  [pb.SteerDelivery.DELIVERED, "delivered"],
  [pb.SteerDelivery.BUFFERED, "buffered"],
]);

export const DECISION = new EnumMap<pb.ApprovalDecision, ApprovalDecision>("ApprovalDecision", [
  [pb.ApprovalDecision.APPROVE, "approve"],
  [pb.ApprovalDecision.DENY, "deny"],
]);

export const AWAIT_MODE = new EnumMap<pb.AwaitMode, AwaitMode>("AwaitMode", [
  [pb.AwaitMode.ALL, "all"],
  [pb.AwaitMode.ANY, "any"],
]);

/** The status a server's enum name (e.g. "AGENT_STATUS_DONE", from error metadata) stands for. */
export function statusFromName(name: string | undefined): AgentStatus | undefined {
  if (!name) {
    return undefined;
  }
  const value = (pb.AgentStatus as unknown as Record<string, number>)[name.replace(/^AGENT_STATUS_/, "")];
  return value === undefined || value === pb.AgentStatus.UNSPECIFIED ? undefined : STATUS.literal(value);
}

const orUndefined = (s: string): string | undefined => (s === "" ? undefined : s);

function date(ts: Timestamp | undefined): Date | undefined {
  return ts === undefined ? undefined : timestampDate(ts);
}

/** Milliseconds of a Duration. */
export function durationMs(d: Duration | undefined): number {
  return d === undefined ? 0 : Number(d.seconds) * 1000 + Math.round(d.nanos / 1e6);
}

/** A Duration of `ms` milliseconds (non-negative, finite). */
export function durationFromMs(ms: number): Duration {
  if (!Number.isFinite(ms) || ms < 0) {
    throw new RangeError(`a duration must be a finite, non-negative number of milliseconds, not ${ms}`);
  }
  const whole = Math.floor(ms);
  return create(DurationSchema, {
    seconds: BigInt(Math.floor(whole / 1000)),
    nanos: (whole % 1000) * 1_000_000 + Math.round((ms - whole) * 1e6),
  });
}

function agentError(e: pb.AgentError | undefined): AgentError | undefined {
  return e === undefined ? undefined : { code: e.code, message: e.message };
}

function usage(u: pb.Usage | undefined): Usage {
  return {
    inputTokens: Number(u?.inputTokens ?? 0n),
    outputTokens: Number(u?.outputTokens ?? 0n),
    toolCalls: Number(u?.toolCalls ?? 0n),
  };
}

function attempt(a: pb.AgentAttempt): Attempt {
  return Object.freeze({
    attempt: a.attempt,
    model: a.model,
    error: agentError(a.error),
    startedAt: date(a.startedAt),
    endedAt: date(a.endedAt),
  });
}

export function agentFromPb(a: pb.Agent): Agent {
  return Object.freeze({
    id: a.id,
    agent: a.agent,
    model: a.model,
    description: a.description,
    parentId: orUndefined(a.parentId),
    rootId: a.rootId,
    leadId: orUndefined(a.leadId),
    depth: a.depth,
    status: STATUS.literal(a.status),
    createdAt: date(a.createdAt) ?? new Date(0),
    startedAt: date(a.startedAt),
    finishedAt: date(a.finishedAt),
    elapsedMs: Number(a.elapsedMs),
    result: a.result,
    error: agentError(a.error),
    approval: a.approval && { id: a.approval.id, toolName: a.approval.toolName, detail: a.approval.detail },
    usage: usage(a.usage),
    totalUsage: usage(a.totalUsage),
    labels: Object.freeze({ ...a.labels }),
    background: a.background,
    detached: a.detached,
    queueReason: orUndefined(a.queueReason),
    bucket: a.bucket,
    workerId: orUndefined(a.workerId),
    attempt: a.attempt,
    attempts: Object.freeze(a.attempts.map(attempt)),
    traceId: a.traceId,
    tenant: a.tenant,
    conversationId: a.conversationId,
    continuesId: orUndefined(a.continuesId),
    turn: a.turn,
    collectedAt: date(a.collectedTime),
    workspace: a.workspace && workspaceFromPb(a.workspace),
    raw: a,
  });
}

/** The agent of a response that must carry one (Spawn, Steer, Approve). */
export function requiredAgent(a: pb.Agent | undefined, method: string): Agent {
  if (a === undefined) {
    throw new TypeError(`${method}: the server's response carries no agent`);
  }
  return agentFromPb(a);
}

export function eventFromPb(e: pb.WatchAgentsResponse): AgentEvent {
  const kind = EVENT_KIND.literal(e.kind);
  return Object.freeze({
    sequence: Number(e.sequence),
    kind,
    agent: requiredAgent(e.agent, "WatchAgents"),
    output: kind === "output" ? e.output : undefined,
    toolCall: e.toolCall && { name: e.toolCall.name, inputDigest: e.toolCall.inputDigest },
    raw: e,
  });
}

function workspaceFromPb(w: pb.Workspace): Workspace {
  return Object.freeze({
    branch: w.branch,
    kept: w.kept,
    baseCommit: w.baseCommit,
    headCommit: w.headCommit,
    filesChanged: w.filesChanged,
    insertions: w.insertions,
    deletions: w.deletions,
  });
}

export function transcriptEntryFromPb(e: pb.TranscriptEntry): TranscriptEntry {
  return Object.freeze({
    kind: TRANSCRIPT_KIND.literal(e.kind),
    agentId: orUndefined(e.agentId),
    turn: e.turn,
    time: date(e.time),
    text: e.text,
    status: e.status === pb.AgentStatus.UNSPECIFIED ? undefined : STATUS.literal(e.status),
    error: agentError(e.error),
    elidedEntries: Number(e.elidedEntries),
    elidedBytes: Number(e.elidedBytes),
    workspace: e.workspace && workspaceFromPb(e.workspace),
    raw: e,
  });
}

export function serverInfoFromPb(r: pb.GetServerInfoResponse): ServerInfo {
  return Object.freeze({
    version: r.version,
    agentTypes: Object.freeze(
      r.agentTypes.map((t) =>
        Object.freeze({
          name: t.name,
          description: t.description,
          runner: t.runner,
          defaultModel: orUndefined(t.defaultModel),
          continuable: t.continuable,
        }),
      ),
    ),
    mcp: Object.freeze({
      approvals: r.mcp?.approvals ?? "",
      maxAwaitMs: durationMs(r.mcp?.maxAwait),
      maxResultChars: r.mcp?.maxResultChars ?? 0,
    }),
    raw: r,
  });
}
