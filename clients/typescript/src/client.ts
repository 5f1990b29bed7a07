// SubagentdClient: the AgentService as promises and async iterables of the
// types in src/types.ts, with the loops every caller would otherwise write —
// paging, retrying NO_LEADER/RECOVERING, resuming a watch — done once.

import { randomUUID } from "node:crypto";

import { create } from "@bufbuild/protobuf";
import { type Client, type Transport, createClient } from "@connectrpc/connect";

import { type ConnectionOptions, type TlsOptions, connect } from "./connection.js";
import {
  AWAIT_MODE,
  DECISION,
  DELIVERY,
  STATUS,
  agentFromPb,
  durationFromMs,
  requiredAgent,
  serverInfoFromPb,
  transcriptEntryFromPb,
} from "./convert.js";
import { NoLeader, Recovering, toSubagentdError } from "./errors.js";
import * as pb from "./gen/subagents/v1/subagents_pb.js";
import type {
  Agent,
  AgentStatus,
  ApprovalDecision,
  AwaitMode,
  AwaitResult,
  ServerInfo,
  SteerResult,
  TranscriptEntry,
} from "./types.js";
import { INITIAL_BACKOFF_MS, MAX_BACKOFF_MS, jitter, sleep } from "./retry.js";
import { AgentWatch, type WatchRequest } from "./watch.js";

/** Call deadline of every call that sets none, unless the client sets another. */
export const DEFAULT_TIMEOUT_MS = 30_000;
/** How long a watch keeps trying to resume before it gives up with the last error. */
export const DEFAULT_WATCH_RESUME_TIMEOUT_MS = 60_000;
/** Await's own wait when the request sets none (the server's default). */
export const DEFAULT_AWAIT_TIMEOUT_MS = 30_000;

/** Options of every call; the last argument of each method. */
export interface CallOptions {
  /** Aborting it cancels the call (it rejects with `Cancelled`; a watch just ends). */
  readonly signal?: AbortSignal;
  /**
   * The call's deadline in milliseconds (default: the client's `timeoutMs`; for `awaitAgents`, the
   * Await's own wait plus that; a watch has none). Retries of NO_LEADER and RECOVERING happen
   * within it. For `list` and `transcript`, per page.
   */
  readonly timeoutMs?: number;
}

export interface ClientOptions extends ConnectionOptions {
  /** Default call deadline (default DEFAULT_TIMEOUT_MS). */
  readonly timeoutMs?: number;
  /**
   * How long a watch keeps trying to resume (reconnecting with backoff) after its stream broke,
   * without getting a stream that stays open, before it throws the last error (default
   * DEFAULT_WATCH_RESUME_TIMEOUT_MS).
   */
  readonly watchResumeTimeoutMs?: number;
  /** A Connect transport to use instead of the address and TLS (another runtime, or tests). */
  readonly transport?: Transport;
}

export type { ConnectionOptions, TlsOptions };

/** Spawn's request; `prompt` is required, the rest as SpawnRequest in subagents.proto. */
export interface SpawnRequest {
  readonly prompt: string;
  /** Agent type (`[agents.NAME]`); with `continueFrom` the continued agent's by default. */
  readonly agent?: string;
  /** "provider/model"; default the agent type's `default_model` (or the continued agent's). */
  readonly model?: string;
  readonly description?: string;
  readonly parentId?: string;
  readonly leadId?: string;
  /** True: queue if needed and return at once. False (default): return once settled. */
  readonly background?: boolean;
  readonly labels?: Readonly<Record<string, string>>;
  /** The run's deadline from its start (default: the server's `[runs] default_timeout`). */
  readonly timeoutMs?: number;
  /** Deduplicates retries under the same parent or lead (default: a fresh random UUID, so that a
   *  Spawn refused with NO_LEADER or RECOVERING can be retried safely). */
  readonly idempotencyKey?: string;
  readonly detached?: boolean;
  /** Continue the conversation of this finished agent. */
  readonly continueFrom?: string;
  /** With `continueFrom`: start a new conversation from a copy of its history. */
  readonly fork?: boolean;
  /** For an agent type with a workspace: the branch, tag or commit its worktree starts at. */
  readonly workspaceBase?: string;
}

/** Filters of `list`; they combine with AND. */
export interface ListRequest {
  readonly parentId?: string;
  readonly rootId?: string;
  readonly leadId?: string;
  readonly statuses?: readonly AgentStatus[];
  /** Only an admin may name another tenant than its own. */
  readonly tenant?: string;
  readonly conversationId?: string;
  /** Only settled agents no Await has collected. */
  readonly uncollected?: boolean;
  /** Agents per page (default 100, at most 1000). */
  readonly pageSize?: number;
}

/** Await's request: exactly one of `ids`, `leadId` (the lead's inbox) and `parentId` (its children's). */
export interface AwaitRequest {
  readonly ids?: readonly string[];
  readonly leadId?: string;
  readonly parentId?: string;
  /** "all" (default) or "any". */
  readonly mode?: AwaitMode;
  /** The Await's own wait (default DEFAULT_AWAIT_TIMEOUT_MS, at most 1 h); when it passes the result
   *  has `timedOut` true. Not the call's deadline (CallOptions.timeoutMs). */
  readonly timeoutMs?: number;
  /** Mark the settled agents returned as collected, so an inbox Await never returns one twice. */
  readonly collect?: boolean;
}

/** Cancel one agent (`id`) or every live agent under a lead (`leadId`), with their descendants. */
export type CancelRequest = ({ readonly id: string; readonly leadId?: never } | { readonly leadId: string; readonly id?: never }) & {
  /** Recorded as the cancellation's error message. */
  readonly reason?: string;
};

export interface SteerRequest {
  readonly id: string;
  readonly message: string;
}

export interface ApproveRequest {
  readonly id: string;
  /** The pending approval's id (`agent.approval.id`). */
  readonly approvalId: string;
  readonly decision: ApprovalDecision;
  readonly note?: string;
}

/** A transcript: up to an agent's turn (`agentId`) or a whole conversation (`conversationId`). */
export type TranscriptRequest = (
  | { readonly agentId: string; readonly conversationId?: never }
  | { readonly conversationId: string; readonly agentId?: never }
) & {
  /** Entries per page (default 100, at most 1000). */
  readonly pageSize?: number;
};

export type { WatchRequest };

/**
 * A client of subagentd's AgentService. One HTTP/2 connection, opened on the first call; `close()`
 * ends it. Every method takes one request object and optional CallOptions, and throws a
 * SubagentdError subclass (see errors.ts) when the call fails.
 */
export class SubagentdClient {
  /** The generated Connect client, for what this class does not wrap. */
  readonly rpc: Client<typeof pb.AgentService>;
  private readonly timeoutMs: number;
  private readonly watchResumeTimeoutMs: number;
  private readonly closeTransport: () => void;
  private readonly closed = new AbortController();

  constructor(options: ClientOptions = {}) {
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.watchResumeTimeoutMs = options.watchResumeTimeoutMs ?? DEFAULT_WATCH_RESUME_TIMEOUT_MS;
    if (options.transport !== undefined) {
      this.rpc = createClient(pb.AgentService, options.transport);
      this.closeTransport = () => {};
    } else {
      const { transport, close } = connect(options);
      this.rpc = createClient(pb.AgentService, transport);
      this.closeTransport = close;
    }
  }

  /** Ends the connection and every watch of this client; calls in flight fail. */
  close(): void {
    this.closed.abort();
    this.closeTransport();
  }

  /**
   * Creates an agent. A background spawn returns at once (running or queued); a foreground one
   * once the agent is settled. Retried on NO_LEADER/RECOVERING under its idempotency key.
   */
  async spawn(request: SpawnRequest, options: CallOptions = {}): Promise<Agent> {
    const message = create(pb.SpawnRequestSchema, {
      agent: request.agent ?? "",
      model: request.model ?? "",
      prompt: request.prompt,
      description: request.description ?? "",
      parentId: request.parentId ?? "",
      leadId: request.leadId ?? "",
      background: request.background ?? false,
      labels: { ...request.labels },
      timeout: request.timeoutMs === undefined ? undefined : durationFromMs(request.timeoutMs),
      idempotencyKey: request.idempotencyKey ?? randomUUID(),
      detached: request.detached ?? false,
      continueFrom: request.continueFrom ?? "",
      fork: request.fork ?? false,
      workspaceBase: request.workspaceBase ?? "",
    });
    const response = await this.call(true, options, (o) => this.rpc.spawn(message, o));
    return requiredAgent(response.agent, "Spawn");
  }

  /** One agent by id. */
  status(request: { readonly id: string }, options?: CallOptions): Promise<Agent>;
  /** Agents by id (at most 100), in the order given. */
  status(request: { readonly ids: readonly string[] }, options?: CallOptions): Promise<Agent[]>;
  async status(
    request: { readonly id: string } | { readonly ids: readonly string[] },
    options: CallOptions = {},
  ): Promise<Agent | Agent[]> {
    const one = "id" in request;
    const ids = one ? [request.id] : [...request.ids];
    const response = await this.call(true, options, (o) => this.rpc.status({ ids }, o));
    const agents = response.agents.map(agentFromPb);
    if (!one) {
      return agents;
    }
    if (agents.length !== 1) {
      throw new TypeError(`Status: the server answered ${agents.length} agents for one id`);
    }
    return agents[0]!;
  }

  /** The agents matching the filters, oldest first, following page tokens. */
  async *list(request: ListRequest = {}, options: CallOptions = {}): AsyncGenerator<Agent, void, undefined> {
    let pageToken = "";
    do {
      const message = create(pb.StatusRequestSchema, {
        parentId: request.parentId ?? "",
        rootId: request.rootId ?? "",
        leadId: request.leadId ?? "",
        statuses: (request.statuses ?? []).map((s) => STATUS.value(s)),
        pageSize: request.pageSize ?? 0,
        pageToken,
        tenant: request.tenant ?? "",
        conversationId: request.conversationId ?? "",
        uncollected: request.uncollected ?? false,
      });
      const page = await this.call(true, options, (o) => this.rpc.status(message, o));
      for (const agent of page.agents) {
        yield agentFromPb(agent);
      }
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  /**
   * Waits until the agents are settled (all, or any), or the Await's own `timeoutMs` passes
   * (`timedOut`). With `leadId` or `parentId` it reads an inbox and returns only the settled agents
   * not yet collected; with `collect` they are marked so no inbox Await returns them again.
   */
  async awaitAgents(request: AwaitRequest, options: CallOptions = {}): Promise<AwaitResult> {
    const waitMs = request.timeoutMs ?? DEFAULT_AWAIT_TIMEOUT_MS;
    const message = create(pb.AwaitRequestSchema, {
      ids: [...(request.ids ?? [])],
      leadId: request.leadId ?? "",
      parentId: request.parentId ?? "",
      mode: AWAIT_MODE.value(request.mode ?? "all"),
      timeout: durationFromMs(waitMs),
      collect: request.collect ?? false,
    });
    const callOptions = { ...options, timeoutMs: options.timeoutMs ?? waitMs + this.timeoutMs };
    const response = await this.call(true, callOptions, (o) => this.rpc.await(message, o));
    return Object.freeze({ agents: Object.freeze(response.agents.map(agentFromPb)), timedOut: response.timedOut });
  }

  /** Cancels an agent (or a lead's live agents) with their live descendants; returns those it cancelled. */
  async cancel(request: CancelRequest, options: CallOptions = {}): Promise<Agent[]> {
    const message = create(pb.CancelRequestSchema, {
      id: request.id ?? "",
      leadId: request.leadId ?? "",
      reason: request.reason ?? "",
    });
    const response = await this.call(true, options, (o) => this.rpc.cancel(message, o));
    return response.agents.map(agentFromPb);
  }

  /** Sends a message to an agent's run: delivered now if it runs, buffered otherwise. Not retried. */
  async steer(request: SteerRequest, options: CallOptions = {}): Promise<SteerResult> {
    const response = await this.call(false, options, (o) =>
      this.rpc.steer({ id: request.id, message: request.message }, o),
    );
    return Object.freeze({
      agent: requiredAgent(response.agent, "Steer"),
      delivery: DELIVERY.literal(response.delivery),
    });
  }

  /** Decides an agent's pending approval; returns the agent (queued or running). Not retried. */
  async approve(request: ApproveRequest, options: CallOptions = {}): Promise<Agent> {
    const message = create(pb.ApproveRequestSchema, {
      id: request.id,
      approvalId: request.approvalId,
      decision: DECISION.value(request.decision),
      note: request.note ?? "",
    });
    const response = await this.call(false, options, (o) => this.rpc.approve(message, o));
    return requiredAgent(response.agent, "Approve");
  }

  /** A transcript's entries, oldest first, following page tokens. */
  async *transcript(request: TranscriptRequest, options: CallOptions = {}): AsyncGenerator<TranscriptEntry, void, undefined> {
    let pageToken = "";
    do {
      const message = create(pb.GetTranscriptRequestSchema, {
        agentId: request.agentId ?? "",
        conversationId: request.conversationId ?? "",
        pageSize: request.pageSize ?? 0,
        pageToken,
      });
      const page = await this.call(true, options, (o) => this.rpc.getTranscript(message, o));
      for (const entry of page.entries) {
        yield transcriptEntryFromPb(entry);
      }
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  /** The server's version and configured agent types. */
  async serverInfo(_request: Record<string, never> = {}, options: CallOptions = {}): Promise<ServerInfo> {
    const response = await this.call(true, options, (o) => this.rpc.getServerInfo({}, o));
    return serverInfoFromPb(response);
  }

  /**
   * Lifecycle events of the matching agents as they happen. The stream opens at once (`opened`
   * resolves once the server has subscribed it, so no later event is missed); iterate it once.
   * When the stream breaks (a dropped connection, a restart, a standby's UNAVAILABLE or NO_LEADER,
   * a failover, WATCH_LAGGED) it resumes with `afterSequence` = the last sequence received; the
   * SNAPSHOT events the server may answer a resume with are yielded like any other. It ends when
   * `options.signal` aborts, `close()` is called or the loop breaks; it throws other errors, and
   * the last error once resuming failed for the client's `watchResumeTimeoutMs`.
   */
  watch(request: WatchRequest = {}, options: CallOptions = {}): AgentWatch {
    return new AgentWatch(
      (message, callOptions) => this.rpc.watchAgents(message, callOptions),
      request,
      options,
      this.watchResumeTimeoutMs,
      this.closed.signal,
    );
  }

  /**
   * Runs `attempt` within the call's deadline; an idempotent call is retried with backoff while
   * the server answers NO_LEADER or RECOVERING and the deadline leaves room.
   */
  private async call<T>(
    idempotent: boolean,
    options: CallOptions,
    attempt: (o: { signal?: AbortSignal; timeoutMs: number }) => Promise<T>,
  ): Promise<T> {
    const deadline = Date.now() + (options.timeoutMs ?? this.timeoutMs);
    let backoff = INITIAL_BACKOFF_MS;
    for (;;) {
      try {
        return await attempt({ signal: options.signal, timeoutMs: Math.max(1, deadline - Date.now()) });
      } catch (e) {
        const err = toSubagentdError(e);
        if (!idempotent || !(err instanceof NoLeader || err instanceof Recovering)) {
          throw err;
        }
        const wait = jitter(backoff);
        if (Date.now() + wait >= deadline) {
          throw err;
        }
        await sleep(wait, options.signal);
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
      }
    }
  }
}
