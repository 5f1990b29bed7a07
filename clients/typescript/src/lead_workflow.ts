// One lead's whole workflow against subagentd's AgentService — the same
// steps and output lines as clients/python/examples/lead_workflow.py.
//
// As one lead (`leadId`): watch the lead's agents, spawn three background
// `simulated` agents that wait for a steer message, hit the global cap with a
// fourth spawn and read the ErrorInfo reason of the RESOURCE_EXHAUSTED, steer
// one agent (it finishes), Await all three with a short timeout (it times out
// with two still running), cancel the lead's remaining agents, and print every
// agent's final state.
//
// Run it against a server whose global cap is 3, so the fourth spawn is
// rejected:
//
//   SUBAGENTD_LIMITS__MAX_BACKGROUND_AGENTS=3 subagentd serve &
//   npm run build && node dist/lead_workflow.js --addr 127.0.0.1:50051

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";

import {
  Agent,
  AgentServiceClient,
  WatchAgentsResponse,
  connect,
  errorDetails,
  errorInfo,
  unary,
} from "./subagentd";

// Guards against hangs only: every wait below ends on an event, not a time.
const RPC_TIMEOUT_MS = 30_000;
const MODEL = "acme/small";
const STEER_MESSAGE = "go on";
const AWAIT_TIMEOUT = { seconds: 0, nanos: 500_000_000 };

function say(...words: unknown[]): void {
  process.stdout.write(words.join(" ") + "\n");
}

const statusName = (status: string) => status.replace(/^AGENT_STATUS_/, "");
const kindName = (kind: string) => kind.replace(/^AGENT_EVENT_KIND_/, "");

/** A WatchAgents stream for one lead: prints each event and lets the workflow wait for a given event. */
class Watcher {
  private readonly call: grpc.ClientReadableStream<WatchAgentsResponse>;
  private readonly seen = new Set<string>();
  private error: Error | null = null;
  private readonly waiters = new Set<() => void>();
  private readonly closed: Promise<void>;

  private constructor(client: AgentServiceClient, leadId: string) {
    this.call = client.WatchAgents({ leadId }) as grpc.ClientReadableStream<WatchAgentsResponse>;
    this.call.on("data", (event: WatchAgentsResponse) => {
      const kind = kindName(event.kind);
      say("event", kind, event.agent.id, statusName(event.agent.status));
      this.seen.add(`${kind} ${event.agent.id}`);
      this.wake();
    });
    this.call.on("error", (err: grpc.ServiceError) => {
      if (err.code !== grpc.status.CANCELLED) {
        this.error = err;
        this.wake();
      }
    });
    this.closed = new Promise((resolve) => this.call.on("status", () => resolve()));
  }

  /** Opens the stream and resolves once the server has subscribed it. */
  static async open(client: AgentServiceClient, leadId: string): Promise<Watcher> {
    const watcher = new Watcher(client, leadId);
    // The server subscribes before it answers with response headers, so once
    // they are here no later event can be missed.
    await new Promise<void>((resolve, reject) => {
      watcher.call.once("metadata", () => resolve());
      watcher.call.once("error", reject);
    });
    return watcher;
  }

  private wake(): void {
    for (const waiter of [...this.waiters]) {
      waiter();
    }
  }

  /** Resolves once a `kind` event was seen for every id. */
  waitFor(kind: string, ids: string[]): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        const missing = ids.filter((id) => !this.seen.has(`${kind} ${id}`));
        reject(new Error(`no ${kind} event within ${RPC_TIMEOUT_MS} ms for ${missing.join(", ")}`));
      }, RPC_TIMEOUT_MS);
      const check = () => {
        if (this.error !== null || ids.every((id) => this.seen.has(`${kind} ${id}`))) {
          clearTimeout(timer);
          this.waiters.delete(check);
          if (this.error !== null) {
            reject(this.error);
          } else {
            resolve();
          }
        }
      };
      this.waiters.add(check);
      check();
    });
  }

  async close(): Promise<void> {
    this.call.cancel();
    await this.closed;
  }
}

function spawn(client: AgentServiceClient, leadId: string, n: number): Promise<{ agent: Agent }> {
  return unary(
    client,
    "Spawn",
    {
      agent: "simulated",
      model: MODEL,
      prompt: `output agent ${n} waiting\nwait_steer\noutput agent ${n} finished`,
      description: `lead_workflow agent ${n}`,
      leadId,
      background: true,
      labels: { example: "lead_workflow" },
    },
    RPC_TIMEOUT_MS,
  );
}

async function workflow(client: AgentServiceClient, watcher: Watcher, leadId: string): Promise<void> {
  // 2. Three background agents, each waiting for a steer message.
  const ids: string[] = [];
  for (const n of [1, 2, 3]) {
    const { agent } = await spawn(client, leadId, n);
    ids.push(agent.id);
    say("spawned", agent.id, statusName(agent.status));
  }
  await watcher.waitFor("STARTED", ids);

  // 3. A fourth spawn while the three are live: with max_background_agents = 3
  //    the global cap is full and Spawn fails at once with RESOURCE_EXHAUSTED.
  try {
    const { agent: extra } = await spawn(client, leadId, 4);
    // The server's cap is above 3: nothing to reject. The lead cancel below
    // cleans this agent up too.
    ids.push(extra.id);
    say("spawned", extra.id, statusName(extra.status));
    process.stderr.write("note: the fourth spawn was accepted; run the server with max_background_agents = 3\n");
  } catch (err) {
    const info = errorInfo(err);
    if (info === null) {
      throw err;
    }
    const meta = info.metadata;
    say(
      "rejected",
      info.reason,
      `code=${grpc.status[(err as grpc.ServiceError).code]}`,
      `domain=${info.domain}`,
      `limit=${meta.limit ?? ""}`,
      `live=${meta.live ?? ""}`,
      `config_key=${meta.config_key ?? ""}`,
    );
    for (const detail of errorDetails(err)) {
      if (detail.type === "google.rpc.QuotaFailure") {
        for (const v of detail.value.violations) {
          say("quota", v.subject, JSON.stringify(v.description));
        }
      }
    }
  }

  // 4. Steer the first agent: its run takes the message and finishes.
  const steered = await unary<{ agent: Agent; delivery: string }>(
    client,
    "Steer",
    { id: ids[0], message: STEER_MESSAGE },
    RPC_TIMEOUT_MS,
  );
  say("steered", steered.agent.id, steered.delivery.replace(/^STEER_DELIVERY_/, ""));
  await watcher.waitFor("DONE", ids.slice(0, 1));

  // 5. Await all of them briefly: one is DONE, the others still wait.
  const awaited = await unary<{ agents: Agent[]; timedOut: boolean }>(
    client,
    "Await",
    { ids, timeout: AWAIT_TIMEOUT },
    RPC_TIMEOUT_MS,
  );
  const count = (status: string) => awaited.agents.filter((a) => statusName(a.status) === status).length;
  say("await", `timed_out=${awaited.timedOut}`, `done=${count("DONE")}`, `running=${count("RUNNING")}`);

  // 6. Cancel everything still live under the lead.
  const cancelled = await unary<{ agents: Agent[] }>(
    client,
    "Cancel",
    { leadId, reason: "lead_workflow finished" },
    RPC_TIMEOUT_MS,
  );
  const cancelledIds = cancelled.agents.map((a) => a.id);
  say("cancelled", cancelledIds.length, ...cancelledIds);
  await watcher.waitFor("CANCELLED", cancelledIds);

  // 7. Final states, oldest first.
  const final = await unary<{ agents: Agent[] }>(client, "Status", { leadId }, RPC_TIMEOUT_MS);
  for (const a of final.agents) {
    say(
      "final",
      a.id,
      statusName(a.status),
      `error=${a.error?.code || "-"}`,
      `result=${JSON.stringify(a.result)}`,
    );
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      addr: { type: "string", default: "127.0.0.1:50051" },
      lead: { type: "string", default: "" },
    },
  });
  const addr = values.addr as string;
  const leadId = (values.lead as string) || `lead-${randomUUID()}`;

  const client = connect(addr);
  try {
    say("lead", leadId);
    // 1. Watch the lead's agents before spawning, so no event is missed.
    const watcher = await Watcher.open(client, leadId);
    say("watching", leadId);
    try {
      await workflow(client, watcher, leadId);
    } finally {
      await watcher.close();
    }
  } finally {
    client.close();
  }
}

main().catch((err) => {
  process.stderr.write(`lead_workflow: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exitCode = 1;
});
