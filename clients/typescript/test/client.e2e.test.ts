// SubagentdClient against the real server over loopback: every method, and
// the typed errors with their attributes.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";

import {
  type Agent,
  AgentNotFound,
  GlobalLimitReached,
  InvalidRequest,
  NotLatest,
  SubagentdClient,
  SubagentdError,
  UnknownAgentType,
} from "@subagentd/client";

import { Server, TIMEOUT_MS, config } from "./server.js";

const lead = () => `lead-${randomUUID()}`;

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) {
    out.push(item);
  }
  return out;
}

describe("SubagentdClient against subagentd", () => {
  let server: Server;
  let client: SubagentdClient;

  before(async () => {
    server = await Server.start({ config: config(5) });
    client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
  });

  after(async () => {
    client.close();
    await server.stop();
  });

  it("spawns in the foreground and returns the settled agent with typed fields", async () => {
    const leadId = lead();
    const agent = await client.spawn({ agent: "simulated", prompt: "output hello\nusage 3 4", leadId, labels: { k: "v" } });
    assert.equal(agent.status, "done");
    assert.equal(agent.result, "hello");
    assert.equal(agent.model, "acme/small", "the agent type's default model");
    assert.equal(agent.leadId, leadId);
    assert.equal(agent.parentId, undefined);
    assert.equal(agent.rootId, agent.id);
    assert.deepEqual(agent.labels, { k: "v" });
    assert.deepEqual(agent.usage, { inputTokens: 3, outputTokens: 4, toolCalls: 0 });
    assert.ok(agent.createdAt instanceof Date && agent.finishedAt instanceof Date);
    assert.ok(agent.finishedAt.getTime() >= agent.createdAt.getTime());
    assert.equal(agent.raw.id, agent.id, "the generated message stays reachable");
    assert.ok(Object.isFrozen(agent));
  });

  it("reads one agent or many by id, in the order given", async () => {
    const a = await client.spawn({ agent: "simulated", prompt: "output a" });
    const b = await client.spawn({ agent: "simulated", prompt: "output b" });
    const one = await client.status({ id: a.id });
    assert.equal(one.id, a.id);
    assert.equal(one.result, "a");
    const many = await client.status({ ids: [b.id, a.id] });
    assert.deepEqual(
      many.map((x) => x.id),
      [b.id, a.id],
    );
  });

  it("lists a lead's agents across pages, oldest first, and filters by status", async () => {
    const leadId = lead();
    const ids: string[] = [];
    for (const n of [1, 2, 3, 4, 5]) {
      ids.push((await client.spawn({ agent: "simulated", prompt: `output ${n}`, leadId })).id);
    }
    const listed = await collect(client.list({ leadId, pageSize: 2 }));
    assert.deepEqual(
      listed.map((a) => a.id),
      ids,
    );
    assert.deepEqual(await collect(client.list({ leadId, statuses: ["running", "queued"] })), []);
    assert.equal((await collect(client.list({ leadId, statuses: ["done"], pageSize: 1000 }))).length, 5);
  });

  it("awaits ids until settled, and reports a timeout of the Await's own wait", async () => {
    const leadId = lead();
    const waiting = await client.spawn({ agent: "simulated", prompt: "output w\nwait_steer\noutput x", leadId, background: true });
    const quick = await client.spawn({ agent: "simulated", prompt: "output q", leadId, background: true });
    const any = await client.awaitAgents({ ids: [waiting.id, quick.id], mode: "any", timeoutMs: TIMEOUT_MS });
    assert.equal(any.timedOut, false);
    assert.deepEqual(
      any.agents.map((a) => [a.id, a.status]),
      [
        [waiting.id, "running"],
        [quick.id, "done"],
      ],
    );
    const all = await client.awaitAgents({ ids: [waiting.id, quick.id], timeoutMs: 100 });
    assert.equal(all.timedOut, true);
    const steered = await client.steer({ id: waiting.id, message: "go on" });
    assert.equal(steered.delivery, "delivered");
    const done = await client.awaitAgents({ ids: [waiting.id], timeoutMs: TIMEOUT_MS });
    assert.equal(done.timedOut, false);
    assert.equal(done.agents[0]!.status, "done");
    assert.equal(done.agents[0]!.result, "w\nsteer: go on\nx");
  });

  it("collects a lead's inbox: each settled agent once, never the live ones", async () => {
    const leadId = lead();
    const spawn = (prompt: string) => client.spawn({ agent: "simulated", prompt, leadId, background: true });
    const first = await spawn("output one");
    const second = await spawn("output two");
    const held = await spawn("wait_steer\noutput three");
    const seen = new Map<string, Agent>();
    while (seen.size < 2) {
      const inbox = await client.awaitAgents({ leadId, mode: "any", collect: true, timeoutMs: TIMEOUT_MS });
      assert.equal(inbox.timedOut, false);
      for (const agent of inbox.agents) {
        assert.ok(!seen.has(agent.id), `${agent.id} returned twice`);
        assert.equal(agent.status, "done", "only settled agents are returned");
        assert.ok(agent.collectedAt instanceof Date);
        seen.set(agent.id, agent);
      }
    }
    assert.deepEqual([...seen.keys()].sort(), [first.id, second.id].sort());
    // The third is live: an inbox Await waits for it, returns nothing else.
    const empty = await client.awaitAgents({ leadId, mode: "any", collect: true, timeoutMs: 100 });
    assert.deepEqual(empty, { agents: [], timedOut: true });
    await client.steer({ id: held.id, message: "now" });
    const last = await client.awaitAgents({ leadId, collect: true, timeoutMs: TIMEOUT_MS });
    assert.deepEqual(
      last.agents.map((a) => a.id),
      [held.id],
    );
  });

  it("cancels a lead's live agents and returns those it cancelled", async () => {
    const leadId = lead();
    const live = await client.spawn({ agent: "simulated", prompt: "wait_steer", leadId, background: true });
    await client.spawn({ agent: "simulated", prompt: "output done", leadId });
    const cancelled = await client.cancel({ leadId, reason: "enough" });
    assert.deepEqual(
      cancelled.map((a) => [a.id, a.status, a.error?.code, a.error?.message]),
      [[live.id, "cancelled", "CANCELLED", "enough"]],
    );
    assert.deepEqual(await client.cancel({ id: live.id }), [], "an ended agent is not cancelled again");
  });

  it("approves a pending approval", async () => {
    const agent = await client.spawn({ agent: "simulated", prompt: "approve deploy\noutput after" });
    assert.equal(agent.status, "awaiting_approval");
    assert.equal(agent.approval?.toolName, "deploy");
    const approved = await client.approve({ id: agent.id, approvalId: agent.approval!.id, decision: "approve" });
    assert.ok(approved.status === "queued" || approved.status === "running");
    const done = await client.awaitAgents({ ids: [agent.id], timeoutMs: TIMEOUT_MS });
    assert.equal(done.agents[0]!.status, "done");
    assert.equal(done.agents[0]!.result, "approved: deploy\nafter");
  });

  it("reads a conversation's transcript across pages", async () => {
    const first = await client.spawn({ agent: "simulated", prompt: "output one" });
    const second = await client.spawn({ prompt: "output two", continueFrom: first.id });
    assert.equal(second.conversationId, first.id);
    assert.equal(second.continuesId, first.id);
    assert.equal(second.turn, 2);
    const entries = await collect(client.transcript({ conversationId: first.id, pageSize: 1 }));
    assert.deepEqual(
      entries.map((e) => [e.kind, e.agentId, e.turn, e.text, e.status]),
      [
        ["prompt", first.id, 1, "output one", undefined],
        ["result", first.id, 1, "one", "done"],
        ["prompt", second.id, 2, "output two", undefined],
        ["result", second.id, 2, "two", "done"],
      ],
    );
    assert.ok(entries.every((e) => e.time instanceof Date));
  });

  it("describes the server", async () => {
    const info = await client.serverInfo();
    assert.match(info.version, /^\d+\.\d+\.\d+/);
    assert.deepEqual(
      info.agentTypes.map((t) => [t.name, t.runner, t.defaultModel, t.continuable]),
      [["simulated", "simulated", "acme/small", true]],
    );
    assert.ok(info.mcp.maxAwaitMs > 0);
  });

  it("throws GlobalLimitReached with the limit, the live count and the config key", async () => {
    const leadId = lead();
    const spawned: string[] = [];
    try {
      for (;;) {
        spawned.push((await client.spawn({ agent: "simulated", prompt: "wait_steer", leadId, background: true })).id);
        assert.ok(spawned.length <= 5, "the sixth background spawn is refused");
      }
    } catch (err) {
      assert.ok(err instanceof GlobalLimitReached, String(err));
      assert.ok(err instanceof SubagentdError && err instanceof Error);
      assert.equal(err.name, "GlobalLimitReached");
      assert.equal(err.code, "RESOURCE_EXHAUSTED");
      assert.equal(err.reason, "GLOBAL_LIMIT_REACHED");
      assert.equal(err.limit, 5);
      assert.equal(err.live, 5);
      assert.equal(err.configKey, "limits.max_background_agents");
      assert.deepEqual(
        err.detailsOf("google.rpc.QuotaFailure").flatMap((q) => q.violations.map((v) => v.subject)),
        ["limits.max_background_agents"],
      );
    } finally {
      await client.cancel({ leadId });
    }
    assert.equal(spawned.length, 5);
  });

  it("throws InvalidRequest with the field violations", async () => {
    await assert.rejects(
      client.spawn({ agent: "simulated", model: "no-slash", prompt: "" }),
      (err: unknown) => {
        assert.ok(err instanceof InvalidRequest, String(err));
        assert.equal(err.code, "INVALID_ARGUMENT");
        const fields = err.violations.map((v) => v.field).sort();
        assert.deepEqual(fields, ["model", "prompt"]);
        assert.ok(err.violations.every((v) => v.description.length > 0));
        return true;
      },
    );
  });

  it("throws UnknownAgentType naming the known types", async () => {
    await assert.rejects(client.spawn({ agent: "nope", prompt: "x" }), (err: unknown) => {
      assert.ok(err instanceof UnknownAgentType, String(err));
      assert.equal(err.agent, "nope");
      assert.deepEqual(err.known, ["simulated"]);
      return true;
    });
  });

  it("throws AgentNotFound with the id and the field that named it", async () => {
    const missing = "01900000-0000-7000-8000-000000000000";
    await assert.rejects(client.status({ id: missing }), (err: unknown) => {
      assert.ok(err instanceof AgentNotFound, String(err));
      assert.equal(err.code, "NOT_FOUND");
      assert.equal(err.id, missing);
      assert.equal(err.field, "ids");
      return true;
    });
  });

  it("throws NotLatest naming the conversation's latest agent", async () => {
    const first = await client.spawn({ agent: "simulated", prompt: "output one" });
    const second = await client.spawn({ prompt: "output two", continueFrom: first.id });
    await assert.rejects(client.spawn({ prompt: "output three", continueFrom: first.id }), (err: unknown) => {
      assert.ok(err instanceof NotLatest, String(err));
      assert.equal(err.code, "FAILED_PRECONDITION");
      assert.equal(err.id, first.id);
      assert.equal(err.conversationId, first.id);
      assert.equal(err.latestId, second.id);
      return true;
    });
  });
});
