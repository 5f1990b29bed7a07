// Errors a program can branch on: one class per google.rpc.ErrorInfo reason
// the server sends (src/api/status.rs, docs/errors.md), each carrying its
// metadata as typed attributes, all extending SubagentdError; errors the
// transport raised without an ErrorInfo get a class per gRPC code
// (DeadlineExceeded, Unavailable, …). REASONS is the one mapping table;
// test/errors.test.ts fails when the server has a reason it lacks.

import { createRegistry } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import { statusFromName } from "./convert.js";
import {
  type BadRequest,
  type ErrorInfo,
  ErrorInfoSchema,
  type PreconditionFailure,
  type QuotaFailure,
  type ResourceInfo,
  type RetryInfo,
  file_google_rpc_error_details,
} from "./gen/google/rpc/error_details_pb.js";
import type { AgentStatus } from "./types.js";

/** ErrorInfo domain of every subagentd error. */
export const DOMAIN = "subagentd";

/** The gRPC status code names, as `SubagentdError.code` spells them. */
export type GrpcCode =
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

const CODE_NAMES: Record<Code, GrpcCode> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** The google.rpc error details a status may carry, decoded. */
export type ErrorDetail = ErrorInfo | BadRequest | QuotaFailure | PreconditionFailure | ResourceInfo | RetryInfo;

const DETAILS = createRegistry(file_google_rpc_error_details);

/** What every SubagentdError is made from. */
export interface ErrorInit {
  readonly code: GrpcCode;
  /** The server's message (no code prefix). */
  readonly message: string;
  readonly reason: string | undefined;
  readonly domain: string | undefined;
  readonly metadata: Readonly<Record<string, string>>;
  readonly details: readonly ErrorDetail[];
  readonly cause?: unknown;
}

/** A failed call: the gRPC code, the server's message and, from its ErrorInfo, the reason and metadata. */
export class SubagentdError extends Error {
  /** The gRPC status code's name, e.g. "RESOURCE_EXHAUSTED". */
  readonly code: GrpcCode;
  /** The ErrorInfo reason (e.g. "GLOBAL_LIMIT_REACHED"); undefined for a transport error without one. */
  readonly reason: string | undefined;
  /** The ErrorInfo domain ("subagentd"); undefined without an ErrorInfo. */
  readonly domain: string | undefined;
  /** The ErrorInfo metadata as sent (strings); the subclasses also offer them typed. */
  readonly metadata: Readonly<Record<string, string>>;
  /** Every google.rpc detail of the status (ErrorInfo, BadRequest, QuotaFailure, …), in the order sent. */
  readonly details: readonly ErrorDetail[];

  constructor(init: ErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    // instanceof and the name hold for every subclass, whatever the compile target.
    Object.setPrototypeOf(this, new.target.prototype);
    this.name = new.target.name;
    this.code = init.code;
    this.reason = init.reason;
    this.domain = init.domain;
    this.metadata = Object.freeze({ ...init.metadata });
    this.details = Object.freeze([...init.details]);
  }

  /** The details of one type, e.g. `err.detailsOf("google.rpc.QuotaFailure")`. */
  detailsOf<T extends ErrorDetail["$typeName"]>(type: T): Extract<ErrorDetail, { $typeName: T }>[] {
    return this.details.filter((d): d is Extract<ErrorDetail, { $typeName: T }> => d.$typeName === type);
  }
}

const int = (s: string | undefined): number => (s === undefined || s === "" ? NaN : Number(s));
const list = (s: string | undefined): string[] => (s ? s.split(",").filter((x) => x !== "") : []);

/** INVALID_ARGUMENT: a malformed field; nothing changed. */
export class InvalidRequest extends SubagentdError {
  static readonly reason = "INVALID_REQUEST";
  /** The BadRequest field violations: which field, and what is wrong with it. */
  readonly violations: readonly { readonly field: string; readonly description: string }[];
  constructor(init: ErrorInit) {
    super(init);
    this.violations = fieldViolations(this);
  }
}

function fieldViolations(err: SubagentdError): { field: string; description: string }[] {
  return err
    .detailsOf("google.rpc.BadRequest")
    .flatMap((b) => b.fieldViolations.map((v) => ({ field: v.field, description: v.description })));
}

/** INVALID_ARGUMENT: `agent` names no configured type. */
export class UnknownAgentType extends SubagentdError {
  static readonly reason = "UNKNOWN_AGENT_TYPE";
  readonly agent: string;
  /** The configured types. */
  readonly known: readonly string[];
  readonly violations: readonly { readonly field: string; readonly description: string }[];
  constructor(init: ErrorInit) {
    super(init);
    this.agent = this.metadata.agent ?? "";
    this.known = list(this.metadata.known);
    this.violations = fieldViolations(this);
  }
}

/** NOT_FOUND: an id names no retained agent (`field`: which request field named it). */
export class AgentNotFound extends SubagentdError {
  static readonly reason = "AGENT_NOT_FOUND";
  readonly id: string;
  readonly field: string;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.field = this.metadata.field ?? "";
  }
}

/** FAILED_PRECONDITION: the parent of a Spawn, or the target of a Steer, has ended. */
export class AgentFinished extends SubagentdError {
  static readonly reason = "AGENT_FINISHED";
  readonly id: string;
  readonly field: string;
  readonly status: AgentStatus | undefined;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.field = this.metadata.field ?? "";
    this.status = statusFromName(this.metadata.status);
  }
}

/** FAILED_PRECONDITION: `continueFrom` names a live agent. */
export class AgentBusy extends SubagentdError {
  static readonly reason = "AGENT_BUSY";
  readonly id: string;
  readonly status: AgentStatus | undefined;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.status = statusFromName(this.metadata.status);
  }
}

/** FAILED_PRECONDITION: `continueFrom` names an agent a later agent continued (without `fork`). */
export class NotLatest extends SubagentdError {
  static readonly reason = "NOT_LATEST";
  readonly id: string;
  readonly conversationId: string;
  /** The conversation's latest agent: continue that one instead. */
  readonly latestId: string;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.conversationId = this.metadata.conversation_id ?? "";
    this.latestId = this.metadata.latest_id ?? "";
  }
}

/** NOT_FOUND: the transcript of the named agent or conversation is no longer retained. */
export class ConversationExpired extends SubagentdError {
  static readonly reason = "CONVERSATION_EXPIRED";
  readonly id: string;
  readonly field: string;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.field = this.metadata.field ?? "";
  }
}

/** FAILED_PRECONDITION: the agent type sets `continuable = false`. */
export class NotResumable extends SubagentdError {
  static readonly reason = "NOT_RESUMABLE";
  readonly id: string;
  readonly agent: string;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.agent = this.metadata.agent ?? "";
  }
}

/** RESOURCE_EXHAUSTED: `[limits] max_background_agents` live background agents. */
export class GlobalLimitReached extends SubagentdError {
  static readonly reason = "GLOBAL_LIMIT_REACHED";
  readonly limit: number;
  readonly live: number;
  /** "limits.max_background_agents". */
  readonly configKey: string;
  constructor(init: ErrorInit) {
    super(init);
    this.limit = int(this.metadata.limit);
    this.live = int(this.metadata.live);
    this.configKey = this.metadata.config_key ?? "";
  }
}

/** RESOURCE_EXHAUSTED: a tenant's `max_background_agents` live background agents. */
export class TenantLimitReached extends SubagentdError {
  static readonly reason = "TENANT_LIMIT_REACHED";
  readonly tenant: string;
  readonly limit: number;
  readonly live: number;
  readonly configKey: string;
  constructor(init: ErrorInit) {
    super(init);
    this.tenant = this.metadata.tenant ?? "";
    this.limit = int(this.metadata.limit);
    this.live = int(this.metadata.live);
    this.configKey = this.metadata.config_key ?? "";
  }
}

/** RESOURCE_EXHAUSTED: a tenant's `spawn_rate` passed; retry after `retryAfterMs`. */
export class RateLimited extends SubagentdError {
  static readonly reason = "RATE_LIMITED";
  readonly tenant: string;
  readonly spawnRate: string;
  readonly spawnBurst: number;
  readonly configKey: string;
  /** From the status's RetryInfo; undefined without one. */
  readonly retryAfterMs: number | undefined;
  constructor(init: ErrorInit) {
    super(init);
    this.tenant = this.metadata.tenant ?? "";
    this.spawnRate = this.metadata.spawn_rate ?? "";
    this.spawnBurst = int(this.metadata.spawn_burst);
    this.configKey = this.metadata.config_key ?? "";
    const delay = this.detailsOf("google.rpc.RetryInfo")[0]?.retryDelay;
    this.retryAfterMs = delay && Number(delay.seconds) * 1000 + Math.round(delay.nanos / 1e6);
  }
}

/** RESOURCE_EXHAUSTED: a tenant's `[limits] max_watchers_per_tenant` open watches. */
export class WatchLimitReached extends SubagentdError {
  static readonly reason = "WATCH_LIMIT_REACHED";
  readonly tenant: string;
  readonly limit: number;
  readonly open: number;
  readonly configKey: string;
  constructor(init: ErrorInit) {
    super(init);
    this.tenant = this.metadata.tenant ?? "";
    this.limit = int(this.metadata.limit);
    this.open = int(this.metadata.open);
    this.configKey = this.metadata.config_key ?? "";
  }
}

/** FAILED_PRECONDITION: a Spawn deeper than `[limits] max_depth`. */
export class DepthLimitReached extends SubagentdError {
  static readonly reason = "DEPTH_LIMIT_REACHED";
  readonly limit: number;
  readonly depth: number;
  readonly configKey: string;
  constructor(init: ErrorInit) {
    super(init);
    this.limit = int(this.metadata.limit);
    this.depth = int(this.metadata.depth);
    this.configKey = this.metadata.config_key ?? "";
  }
}

/** RESOURCE_EXHAUSTED: the tree has `max_live_descendants_per_root` live agents. */
export class DescendantLimitReached extends SubagentdError {
  static readonly reason = "DESCENDANT_LIMIT_REACHED";
  readonly limit: number;
  readonly live: number;
  readonly rootId: string;
  readonly configKey: string;
  constructor(init: ErrorInit) {
    super(init);
    this.limit = int(this.metadata.limit);
    this.live = int(this.metadata.live);
    this.rootId = this.metadata.root_id ?? "";
    this.configKey = this.metadata.config_key ?? "";
  }
}

/** UNAVAILABLE: the server is shutting down. */
export class ShuttingDown extends SubagentdError {
  static readonly reason = "SHUTTING_DOWN";
}

/** UNAVAILABLE: the store failed to keep a change; retry (a Spawn with the same idempotency key). */
export class StoreFailed extends SubagentdError {
  static readonly reason = "STORE_FAILED";
}

/** UNAVAILABLE: the server is reading its store at start (idempotent calls are retried). */
export class Recovering extends SubagentdError {
  static readonly reason = "RECOVERING";
  /** The agent whose worker has not re-attached yet, when that is the cause. */
  readonly agentId: string | undefined;
  constructor(init: ErrorInit) {
    super(init);
    this.agentId = this.metadata.agent_id;
  }
}

/** UNAVAILABLE: a standby that knows no reachable leader (idempotent calls are retried). */
export class NoLeader extends SubagentdError {
  static readonly reason = "NO_LEADER";
}

/** FAILED_PRECONDITION: Steer to an agent whose type takes no steer messages. */
export class SteerNotAccepted extends SubagentdError {
  static readonly reason = "STEER_NOT_ACCEPTED";
  readonly id: string;
  readonly agent: string;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.agent = this.metadata.agent ?? "";
  }
}

/** FAILED_PRECONDITION: Approve for an agent with no pending approval. */
export class NotAwaitingApproval extends SubagentdError {
  static readonly reason = "NOT_AWAITING_APPROVAL";
  readonly id: string;
  readonly status: AgentStatus | undefined;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.status = statusFromName(this.metadata.status);
  }
}

/** FAILED_PRECONDITION: Approve naming another approval than the pending one. */
export class ApprovalMismatch extends SubagentdError {
  static readonly reason = "APPROVAL_MISMATCH";
  readonly id: string;
  readonly approvalId: string;
  readonly pendingApprovalId: string;
  constructor(init: ErrorInit) {
    super(init);
    this.id = this.metadata.id ?? "";
    this.approvalId = this.metadata.approval_id ?? "";
    this.pendingApprovalId = this.metadata.pending_approval_id ?? "";
  }
}

/** RESOURCE_EXHAUSTED: a watch fell behind and was cut off (`watch()` resumes by itself). */
export class WatchLagged extends SubagentdError {
  static readonly reason = "WATCH_LAGGED";
  readonly missedEvents: number;
  readonly resumeAfterSequence: number;
  constructor(init: ErrorInit) {
    super(init);
    this.missedEvents = int(this.metadata.missed_events);
    this.resumeAfterSequence = int(this.metadata.resume_after_sequence);
  }
}

/** UNAUTHENTICATED: no credential or a bad one. */
export class Unauthenticated extends SubagentdError {
  static readonly reason = "UNAUTHENTICATED";
  /** Why the credential was refused (ErrorInfo metadata `cause`, e.g. "missing", "unknown"); `cause`
   *  itself is Error's (the underlying ConnectError). */
  readonly authCause: string;
  constructor(init: ErrorInit) {
    super(init);
    this.authCause = this.metadata.cause ?? "";
  }
}

/** PERMISSION_DENIED: the caller's roles (or tenants) do not allow the call. */
export class PermissionDenied extends SubagentdError {
  static readonly reason = "PERMISSION_DENIED";
  /** Roles any one of which would allow the call; empty when a tenant was refused. */
  readonly requiredRoles: readonly string[];
  /** The refused method, when the role was the problem. */
  readonly method: string | undefined;
  /** The tenants the credential is granted, when a tenant was refused. */
  readonly grantedTenants: readonly string[];
  /** The agent types a worker may not serve, when those were refused. */
  readonly agentTypes: readonly string[];
  constructor(init: ErrorInit) {
    super(init);
    this.requiredRoles = list(this.metadata.required_roles);
    this.method = this.metadata.method;
    this.grantedTenants = list(this.metadata.granted_tenants);
    this.agentTypes = list(this.metadata.agent_types);
  }
}

/** The class of each ErrorInfo reason the server sends: the one mapping table. */
export const REASONS = {
  INVALID_REQUEST: InvalidRequest,
  UNKNOWN_AGENT_TYPE: UnknownAgentType,
  AGENT_NOT_FOUND: AgentNotFound,
  AGENT_FINISHED: AgentFinished,
  AGENT_BUSY: AgentBusy,
  NOT_LATEST: NotLatest,
  CONVERSATION_EXPIRED: ConversationExpired,
  NOT_RESUMABLE: NotResumable,
  GLOBAL_LIMIT_REACHED: GlobalLimitReached,
  TENANT_LIMIT_REACHED: TenantLimitReached,
  RATE_LIMITED: RateLimited,
  WATCH_LIMIT_REACHED: WatchLimitReached,
  DEPTH_LIMIT_REACHED: DepthLimitReached,
  DESCENDANT_LIMIT_REACHED: DescendantLimitReached,
  SHUTTING_DOWN: ShuttingDown,
  STORE_FAILED: StoreFailed,
  RECOVERING: Recovering,
  NO_LEADER: NoLeader,
  STEER_NOT_ACCEPTED: SteerNotAccepted,
  NOT_AWAITING_APPROVAL: NotAwaitingApproval,
  APPROVAL_MISMATCH: ApprovalMismatch,
  WATCH_LAGGED: WatchLagged,
  UNAUTHENTICATED: Unauthenticated,
  PERMISSION_DENIED: PermissionDenied,
} as const satisfies Record<string, (new (init: ErrorInit) => SubagentdError) & { reason: string }>;

/** An ErrorInfo reason the server sends. */
export type Reason = keyof typeof REASONS;

// Errors without an ErrorInfo: the transport's (a deadline, a dropped
// connection, a cancelled call) or a proxy's.

/** CANCELLED without an ErrorInfo: the call was cancelled (e.g. its `signal` aborted). */
export class Cancelled extends SubagentdError {}
/** DEADLINE_EXCEEDED: the call's `timeoutMs` passed. */
export class DeadlineExceeded extends SubagentdError {}
/** UNAVAILABLE without an ErrorInfo: the server could not be reached, or the connection dropped. */
export class Unavailable extends SubagentdError {}
/** INTERNAL, UNKNOWN or ABORTED without an ErrorInfo: the stream broke (e.g. the connection reset). */
export class TransportError extends SubagentdError {}

const TRANSPORT: Partial<Record<GrpcCode, new (init: ErrorInit) => SubagentdError>> = {
  CANCELLED: Cancelled,
  DEADLINE_EXCEEDED: DeadlineExceeded,
  UNAVAILABLE: Unavailable,
  INTERNAL: TransportError,
  UNKNOWN: TransportError,
  ABORTED: TransportError,
  // Without an ErrorInfo (e.g. from a proxy) these still mean what the reasons do.
  UNAUTHENTICATED: Unauthenticated,
  PERMISSION_DENIED: PermissionDenied,
};

/**
 * The SubagentdError for `err`: the class of its ErrorInfo reason, else of its code. Errors that
 * are not from a call (a TypeError of the caller's own) are returned as they are.
 */
export function toSubagentdError(err: unknown): unknown {
  if (err instanceof SubagentdError || !(err instanceof ConnectError)) {
    return err;
  }
  let details: ErrorDetail[] = [];
  try {
    details = err.findDetails(DETAILS) as ErrorDetail[];
  } catch {
    // Undecodable details: keep the code and message.
  }
  const info = details.find((d): d is ErrorInfo => d.$typeName === ErrorInfoSchema.typeName);
  const code = CODE_NAMES[err.code] ?? "UNKNOWN";
  const init: ErrorInit = {
    code,
    message: err.rawMessage,
    reason: info?.reason,
    domain: info?.domain,
    metadata: info?.metadata ?? {},
    details,
    cause: err,
  };
  if (info !== undefined && info.domain === DOMAIN && Object.hasOwn(REASONS, info.reason)) {
    return new REASONS[info.reason as Reason](init);
  }
  const byCode = info === undefined ? TRANSPORT[code] : undefined;
  return byCode ? new byCode(init) : new SubagentdError(init);
}
