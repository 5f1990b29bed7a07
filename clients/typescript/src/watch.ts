// A WatchAgents subscription that resumes by itself: when its stream breaks
// it subscribes again with after_sequence = the last sequence received, so
// the server replays what was missed (or, where it no longer retains those
// events, sends SNAPSHOT events, which are yielded as they come).

import { create } from "@bufbuild/protobuf";

import { eventFromPb } from "./convert.js";
import {
  Cancelled,
  SubagentdError,
  TransportError,
  Unavailable,
  WatchLagged,
  toSubagentdError,
} from "./errors.js";
import * as pb from "./gen/subagents/v1/subagents_pb.js";
import { INITIAL_BACKOFF_MS, MAX_BACKOFF_MS, jitter, sleep } from "./retry.js";
import type { AgentEvent } from "./types.js";

/** Filters of a watch (combined with AND; none: every agent the caller may see). */
export interface WatchRequest {
  /** Only these agents (at most 100). */
  readonly ids?: readonly string[];
  /** Only direct children of this agent. */
  readonly parentId?: string;
  /** Only agents of this tree. */
  readonly rootId?: string;
  /** Only agents under this lead. */
  readonly leadId?: string;
  /** Replay retained events with a larger sequence first (0, the default: no replay). */
  readonly afterSequence?: number;
  /** First one SNAPSHOT event per matching agent that exists now. */
  readonly includeSnapshot?: boolean;
  /** Also "output" and "tool_call" progress events (live only: a resume does not replay them). */
  readonly includeProgress?: boolean;
  readonly tenant?: string;
  readonly conversationId?: string;
}

/** How long a resumed stream must stay open to count as recovered (the resume window restarts). */
const STABLE_MS = 1_000;

type OpenStream = (
  request: pb.WatchAgentsRequest,
  options: { signal: AbortSignal; timeoutMs?: number; onHeader: (headers: Headers) => void },
) => AsyncIterable<pb.WatchAgentsResponse>;

/** A stream break after which the watch subscribes again (see SubagentdClient.watch). */
export function resumable(err: unknown): boolean {
  if (!(err instanceof SubagentdError)) {
    return false;
  }
  if (err.reason !== undefined) {
    // A standby's NO_LEADER, RECOVERING, SHUTTING_DOWN, STORE_FAILED; a lagging subscriber.
    return err.code === "UNAVAILABLE" || err instanceof WatchLagged;
  }
  // The connection dropped or was refused, or the stream was reset under us.
  return err instanceof Unavailable || err instanceof TransportError || err instanceof Cancelled;
}

/**
 * The events of one watch, an AsyncIterable to iterate once. It subscribes when created; `opened`
 * resolves once the server has (so no later event is missed) and rejects when the first
 * subscription fails for good.
 */
export class AgentWatch implements AsyncIterable<AgentEvent> {
  /** Resolves once a stream is open; rejects with the error that ended the watch before that. */
  readonly opened: Promise<void>;
  private resolveOpened!: () => void;
  private rejectOpened!: (err: unknown) => void;
  private readonly controller = new AbortController();
  private readonly unlink: () => void;
  private readonly events: AsyncGenerator<AgentEvent, void, undefined>;
  private first: Promise<IteratorResult<AgentEvent, void>> | undefined;
  private iterated = false;
  private last: number | undefined;
  private sawLive = false;
  private resumeCount = 0;

  constructor(
    private readonly open: OpenStream,
    private readonly request: WatchRequest,
    private readonly options: { readonly signal?: AbortSignal; readonly timeoutMs?: number },
    private readonly resumeTimeoutMs: number,
    /** Aborts when the client is closed: the watch ends with it. */
    clientClosed?: AbortSignal,
  ) {
    this.opened = new Promise((resolve, reject) => {
      this.resolveOpened = resolve;
      this.rejectOpened = reject;
    });
    // Nobody need wait for `opened`: its rejection is also thrown by the iteration.
    this.opened.catch(() => {});
    const signals = [options.signal, clientClosed].filter((s): s is AbortSignal => s !== undefined);
    const abort = () => this.controller.abort();
    for (const signal of signals) {
      if (signal.aborted) {
        abort();
      }
      signal.addEventListener("abort", abort, { once: true });
    }
    this.unlink = () => signals.forEach((signal) => signal.removeEventListener("abort", abort));
    this.events = this.run();
    // Subscribe now, not when the iteration starts: pull up to the first event.
    this.first = this.events.next();
    this.first.catch(() => {});
  }

  /** The sequence of the last event received; undefined before the first. */
  get lastSequence(): number | undefined {
    return this.last;
  }

  /** How many times the watch subscribed again after its stream broke. */
  get resumes(): number {
    return this.resumeCount;
  }

  /** Ends the watch: the iteration ends (promptly, also while it waits for an event). */
  close(): void {
    this.controller.abort();
  }

  [Symbol.asyncIterator](): AsyncIterator<AgentEvent, void, undefined> {
    if (this.iterated) {
      throw new TypeError("a watch can be iterated once");
    }
    this.iterated = true;
    return {
      next: () => {
        const first = this.first;
        if (first !== undefined) {
          this.first = undefined;
          return first;
        }
        return this.events.next();
      },
      return: async () => {
        this.close();
        // Waits for a pending next(), which the abort ends.
        await this.events.return();
        return { done: true, value: undefined };
      },
    };
  }

  private requestNow(): pb.WatchAgentsRequest {
    const r = this.request;
    const after = this.last ?? r.afterSequence ?? 0;
    return create(pb.WatchAgentsRequestSchema, {
      ids: [...(r.ids ?? [])],
      parentId: r.parentId ?? "",
      rootId: r.rootId ?? "",
      leadId: r.leadId ?? "",
      afterSequence: BigInt(after),
      // Until a live event came, the snapshot may be incomplete: ask for it again (its events
      // are states, so one seen twice does no harm). After that, the replay covers everything.
      includeSnapshot: (r.includeSnapshot ?? false) && !this.sawLive,
      includeProgress: r.includeProgress ?? false,
      tenant: r.tenant ?? "",
      conversationId: r.conversationId ?? "",
    });
  }

  private async *run(): AsyncGenerator<AgentEvent, void, undefined> {
    const signal = this.controller.signal;
    const deadline = this.options.timeoutMs === undefined ? undefined : Date.now() + this.options.timeoutMs;
    let failingSince: number | undefined;
    let backoff = INITIAL_BACKOFF_MS;
    try {
      for (;;) {
        if (signal.aborted) {
          return;
        }
        let openedAt: number | undefined;
        let lastError: unknown = undefined;
        try {
          const stream = this.open(this.requestNow(), {
            signal,
            timeoutMs: deadline === undefined ? undefined : Math.max(1, deadline - Date.now()),
            onHeader: (headers) => {
              // A trailers-only answer is an error, not an open stream.
              if (!headers.has("grpc-status")) {
                openedAt = Date.now();
                this.resolveOpened();
              }
            },
          });
          for await (const message of stream) {
            const event = eventFromPb(message);
            this.last = event.sequence;
            if (event.kind !== "snapshot") {
              this.sawLive = true;
            }
            failingSince = undefined;
            backoff = INITIAL_BACKOFF_MS;
            yield event;
          }
          // The server ended the stream (e.g. shutting down): a watch has no end of its own.
          lastError = new Unavailable({
            code: "UNAVAILABLE",
            message: "the server ended the watch stream",
            reason: undefined,
            domain: undefined,
            metadata: {},
            details: [],
          });
        } catch (e) {
          if (signal.aborted) {
            return;
          }
          const err = toSubagentdError(e);
          if (!resumable(err)) {
            throw err;
          }
          if (err instanceof WatchLagged && this.last === undefined && Number.isFinite(err.resumeAfterSequence)) {
            this.last = err.resumeAfterSequence;
          }
          lastError = err;
        }
        const now = Date.now();
        if (openedAt !== undefined && now - openedAt >= STABLE_MS) {
          failingSince = undefined;
          backoff = INITIAL_BACKOFF_MS;
        }
        failingSince ??= now;
        const wait = jitter(backoff);
        if (now + wait - failingSince > this.resumeTimeoutMs || (deadline !== undefined && now + wait >= deadline)) {
          throw lastError;
        }
        try {
          await sleep(wait, signal);
        } catch {
          return;
        }
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
        this.resumeCount += 1;
      }
    } catch (err) {
      this.rejectOpened(err);
      throw err;
    } finally {
      this.unlink();
      // Ends the stream in flight (the loop may have been left at a yield).
      this.controller.abort();
      this.rejectOpened(new Error("the watch ended before it opened"));
    }
  }
}
