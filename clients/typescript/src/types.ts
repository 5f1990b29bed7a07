// The types a program leans on: plain readonly objects with lower-case string
// literals for enums, `Date` for times and milliseconds for durations. Each
// keeps the generated message it was made from as `raw`. src/convert.ts is
// the one place that converts between these and the generated messages.

import type * as pb from "./gen/subagents/v1/subagents_pb.js";

/** An agent's lifecycle state; "done", "failed" and "cancelled" are terminal. */
export type AgentStatus = "queued" | "running" | "awaiting_approval" | "done" | "failed" | "cancelled";

/** The terminal states. */
export const TERMINAL_STATUSES: readonly AgentStatus[] = ["done", "failed", "cancelled"];

/** What a watch event reports ("snapshot": the agent's state when the watch (re)subscribed). */
export type AgentEventKind =
  | "snapshot"
  | "queued"
  | "started"
  | "steered"
  | "awaiting_approval"
  | "done"
  | "failed"
  | "cancelled"
  | "retrying"
  | "output"
  | "tool_call"
  | "workspace_saved";

/** What a transcript entry records. */
export type TranscriptEntryKind = "prompt" | "steer" | "tool_call" | "result" | "elided";

/** How a steer message was handled: handed to the running run now, or kept for when it (re)starts. */
export type SteerDelivery = "delivered" | "buffered";

/** A decision on a pending approval. */
export type ApprovalDecision = "approve" | "deny";

/** Await's condition: every agent settled ("all", the default) or at least one ("any"). */
export type AwaitMode = "all" | "any";

/** Why an agent failed or was cancelled (`code` e.g. "CANCELLED", "RUN_FAILED", "DEADLINE_EXCEEDED"). */
export interface AgentError {
  readonly code: string;
  readonly message: string;
}

/** A tool call waiting for a decision. */
export interface Approval {
  readonly id: string;
  readonly toolName: string;
  readonly detail: string;
}

/** Resources a run used. */
export interface Usage {
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly toolCalls: number;
}

/** One attempt (run) of an agent. */
export interface Attempt {
  /** 1, 2, … */
  readonly attempt: number;
  /** The model it ran on ("provider/model"). */
  readonly model: string;
  /** Why it ended without success; undefined while it runs or when it ended done. */
  readonly error: AgentError | undefined;
  readonly startedAt: Date | undefined;
  readonly endedAt: Date | undefined;
}

/** A sub-agent, as the server reported it (see `Agent` in subagents.proto for every field). */
export interface Agent {
  readonly id: string;
  /** Agent type (`[agents.NAME]`). */
  readonly agent: string;
  /** "provider/model". */
  readonly model: string;
  readonly description: string;
  /** The parent agent's id; undefined for a root agent. */
  readonly parentId: string | undefined;
  readonly rootId: string;
  /** The lead (frontend run) the tree belongs to; undefined when none was given. */
  readonly leadId: string | undefined;
  /** 1 for a root agent. */
  readonly depth: number;
  readonly status: AgentStatus;
  readonly createdAt: Date;
  readonly startedAt: Date | undefined;
  readonly finishedAt: Date | undefined;
  /** Running time so far, or the total once finished; 0 while never started. */
  readonly elapsedMs: number;
  /** Output so far; final once done. */
  readonly result: string;
  readonly error: AgentError | undefined;
  /** The pending approval; set only while awaiting approval. */
  readonly approval: Approval | undefined;
  readonly usage: Usage;
  /** This agent's and all its descendants' usage. */
  readonly totalUsage: Usage;
  readonly labels: Readonly<Record<string, string>>;
  readonly background: boolean;
  readonly detached: boolean;
  /** Which limit holds a queued agent; undefined unless queued. */
  readonly queueReason: string | undefined;
  readonly bucket: string;
  /** The worker session holding the run; undefined when none does. */
  readonly workerId: string | undefined;
  /** 1 for the first run, + 1 per retry; 0 before the first start. */
  readonly attempt: number;
  readonly attempts: readonly Attempt[];
  readonly traceId: string;
  readonly tenant: string;
  readonly conversationId: string;
  /** The agent this one continues or forked from; undefined for a conversation's first agent. */
  readonly continuesId: string | undefined;
  readonly turn: number;
  /** When an Await with `collect` returned it; undefined until then. */
  readonly collectedAt: Date | undefined;
  /** What its run left in its workspace (types with `workspace = "worktree"`), once saved. */
  readonly workspace: Workspace | undefined;
  /** The message this was converted from. */
  readonly raw: pb.Agent;
}

/** A run's branch and what it changed, from the commit its worktree started at to the branch's head. */
export interface Workspace {
  readonly branch: string;
  /** Whether the branch still exists (`keep`). */
  readonly kept: boolean;
  readonly baseCommit: string;
  readonly headCommit: string;
  readonly filesChanged: number;
  readonly insertions: number;
  readonly deletions: number;
}

/** A tool call a run reported. */
export interface ToolCall {
  readonly name: string;
  readonly inputDigest: string;
}

/** One watch event. */
export interface AgentEvent {
  /** Server-wide, strictly increasing along a watch (also across its resumes). */
  readonly sequence: number;
  readonly kind: AgentEventKind;
  /** The agent after the event (for "output" and "tool_call" events its `result` is empty). */
  readonly agent: Agent;
  /** "output" events: the chunk of output; undefined otherwise. */
  readonly output: string | undefined;
  /** "tool_call" events: the call; undefined otherwise. */
  readonly toolCall: ToolCall | undefined;
  readonly raw: pb.WatchAgentsResponse;
}

/** One entry of a conversation's transcript. */
export interface TranscriptEntry {
  readonly kind: TranscriptEntryKind;
  /** The agent (turn) it belongs to; undefined for "elided". */
  readonly agentId: string | undefined;
  readonly turn: number;
  readonly time: Date | undefined;
  /** The prompt, steer message, tool name, output or elision notice. */
  readonly text: string;
  /** "result" entries: how the turn ended; undefined otherwise. */
  readonly status: AgentStatus | undefined;
  readonly error: AgentError | undefined;
  readonly elidedEntries: number;
  readonly elidedBytes: number;
  /** "result" entries of a type with a workspace: what the turn's run left there, once saved. */
  readonly workspace: Workspace | undefined;
  readonly raw: pb.TranscriptEntry;
}

/** One configured agent type. */
export interface AgentTypeInfo {
  readonly name: string;
  readonly description: string;
  /** "simulated", "command", "openai" or "worker". */
  readonly runner: string;
  /** The model a Spawn that names none gets; undefined when the type has none. */
  readonly defaultModel: string | undefined;
  readonly continuable: boolean;
}

/** What the server is and is configured with. */
export interface ServerInfo {
  readonly version: string;
  readonly agentTypes: readonly AgentTypeInfo[];
  /** The `[mcp]` settings. */
  readonly mcp: {
    readonly approvals: string;
    readonly maxAwaitMs: number;
    readonly maxResultChars: number;
  };
  readonly raw: pb.GetServerInfoResponse;
}

/** What Await returned. */
export interface AwaitResult {
  /** With `ids`: those agents in that order, as they are now. With `leadId` or `parentId` (an
   *  inbox): the settled, uncollected agents only. */
  readonly agents: readonly Agent[];
  /** True when the Await's own timeout passed before its condition held. */
  readonly timedOut: boolean;
}

/** What Steer returned. */
export interface SteerResult {
  readonly agent: Agent;
  readonly delivery: SteerDelivery;
}
