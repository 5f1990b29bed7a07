// One lead's whole workflow with @subagentd/client — the same steps and
// output lines as clients/python/examples/lead_workflow.py.
//
// As one lead (`leadId`): watch the lead's agents, spawn three background
// `simulated` agents that wait for a steer message, hit the global cap with a
// fourth spawn (GlobalLimitReached), steer one agent (it finishes), Await all
// three with a short timeout (it times out with two still running), cancel
// the lead's remaining agents, and print every agent's final state.
//
// Run it against a server whose global cap is 3, so the fourth spawn is
// rejected:
//
//   SUBAGENTD_LIMITS__MAX_BACKGROUND_AGENTS=3 subagentd serve &
//   npm run build && node dist/examples/lead_workflow.js --addr 127.0.0.1:50051

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";

import { type AgentEvent, type AgentWatch, GlobalLimitReached, SubagentdClient } from "@subagentd/client";

function say(...words: unknown[]): void {
  process.stdout.write(words.join(" ") + "\n");
}

/** Prints the watch's events as they come and lets the workflow wait for one. */
class EventLog {
  private readonly seen = new Set<string>();
  private readonly waiters = new Set<() => void>();
  private failure: unknown;
  readonly done: Promise<void>;

  constructor(watch: AgentWatch) {
    this.done = (async () => {
      try {
        for await (const event of watch) {
          this.record(event);
        }
      } catch (err) {
        this.failure = err ?? new Error("the watch failed");
      }
      this.failure ??= new Error("the watch ended");
      this.waiters.forEach((wake) => wake());
    })();
  }

  private record(event: AgentEvent): void {
    say("event", event.kind.toUpperCase(), event.agent.id, event.agent.status.toUpperCase());
    this.seen.add(`${event.kind} ${event.agent.id}`);
    this.waiters.forEach((wake) => wake());
  }

  /** Resolves once a `kind` event was seen for each of `ids`. */
  waitFor(kind: AgentEvent["kind"], ids: readonly string[]): Promise<void> {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (ids.every((id) => this.seen.has(`${kind} ${id}`))) {
          this.waiters.delete(check);
          resolve();
        } else if (this.failure !== undefined) {
          this.waiters.delete(check);
          reject(this.failure);
        }
      };
      this.waiters.add(check);
      check();
    });
  }
}

async function workflow(client: SubagentdClient, events: EventLog, leadId: string): Promise<void> {
  const spawn = (n: number) =>
    client.spawn({
      agent: "simulated",
      model: "acme/small",
      prompt: `output agent ${n} waiting\nwait_steer\noutput agent ${n} finished`,
      description: `lead_workflow agent ${n}`,
      leadId,
      background: true,
      labels: { example: "lead_workflow" },
    });

  // 2. Three background agents, each waiting for a steer message.
  const ids: string[] = [];
  for (const n of [1, 2, 3]) {
    const agent = await spawn(n);
    ids.push(agent.id);
    say("spawned", agent.id, agent.status.toUpperCase());
  }
  await events.waitFor("started", ids);

  // 3. A fourth spawn while the three are live: with max_background_agents = 3
  //    the global cap is full and Spawn fails at once.
  try {
    const extra = await spawn(4);
    ids.push(extra.id); // the lead cancel below cleans it up
    say("spawned", extra.id, extra.status.toUpperCase());
    process.stderr.write("note: the fourth spawn was accepted; run the server with max_background_agents = 3\n");
  } catch (err) {
    if (!(err instanceof GlobalLimitReached)) {
      throw err;
    }
    say(
      "rejected",
      err.reason,
      `code=${err.code}`,
      `domain=${err.domain}`,
      `limit=${err.limit}`,
      `live=${err.live}`,
      `config_key=${err.configKey}`,
    );
    for (const quota of err.detailsOf("google.rpc.QuotaFailure")) {
      for (const v of quota.violations) {
        say("quota", v.subject, JSON.stringify(v.description));
      }
    }
  }

  // 4. Steer the first agent: its run takes the message and finishes.
  const steered = await client.steer({ id: ids[0]!, message: "go on" });
  say("steered", steered.agent.id, steered.delivery.toUpperCase());
  await events.waitFor("done", ids.slice(0, 1));

  // 5. Await all of them briefly: one is done, the others still wait.
  const awaited = await client.awaitAgents({ ids, timeoutMs: 500 });
  const count = (status: string) => awaited.agents.filter((a) => a.status === status).length;
  say("await", `timed_out=${awaited.timedOut}`, `done=${count("done")}`, `running=${count("running")}`);

  // 6. Cancel everything still live under the lead.
  const cancelled = (await client.cancel({ leadId, reason: "lead_workflow finished" })).map((a) => a.id);
  say("cancelled", cancelled.length, ...cancelled);
  await events.waitFor("cancelled", cancelled);

  // 7. Final states, oldest first.
  for await (const a of client.list({ leadId })) {
    say("final", a.id, a.status.toUpperCase(), `error=${a.error?.code ?? "-"}`, `result=${JSON.stringify(a.result)}`);
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      addr: { type: "string", default: "127.0.0.1:50051" },
      lead: { type: "string", default: "" },
    },
  });
  const leadId = values.lead || `lead-${randomUUID()}`;
  // TLS and the API key come from SUBAGENTD_CA_FILE, SUBAGENTD_TOKEN, … when set.
  const client = new SubagentdClient({ address: values.addr });
  try {
    say("lead", leadId);
    // 1. Watch the lead's agents before spawning, so no event is missed.
    const watch = client.watch({ leadId });
    const events = new EventLog(watch);
    await watch.opened;
    say("watching", leadId);
    try {
      await workflow(client, events, leadId);
    } finally {
      watch.close();
      await events.done;
    }
  } finally {
    client.close();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`lead_workflow: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
