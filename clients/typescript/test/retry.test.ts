// Retries and watch resumes against an in-memory AgentService (a Connect
// router transport) that answers as a standby or a recovering server would:
// what the real server does only in a failover or at start.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createRouterTransport } from "@connectrpc/connect";

import { type AgentEvent, NoLeader, Recovering, SubagentdClient, pb } from "@subagentd/client";

import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";

function refusal(reason: string, code = Code.Unavailable, metadata: Record<string, string> = {}): ConnectError {
  return new ConnectError(reason.toLowerCase(), code, undefined, [
    { desc: ErrorInfoSchema, value: { reason, domain: "subagentd", metadata } },
  ]);
}

function agent(id: string, status = pb.AgentStatus.RUNNING): pb.Agent {
  return create(pb.AgentSchema, { id, rootId: id, status, createdAt: timestampFromDate(new Date()) });
}

function event(sequence: number, kind: pb.AgentEventKind, id: string): pb.WatchAgentsResponse {
  return create(pb.WatchAgentsResponseSchema, { sequence: BigInt(sequence), kind, agent: agent(id) });
}

describe("retries", () => {
  it("retry an idempotent call while the server answers NO_LEADER or RECOVERING", async () => {
    const answers = [refusal("NO_LEADER"), refusal("RECOVERING")];
    let calls = 0;
    const client = new SubagentdClient({
      transport: createRouterTransport(({ service }) =>
        service(pb.AgentService, {
          status() {
            calls += 1;
            const next = answers.shift();
            if (next) {
              throw next;
            }
            return { agents: [agent("a1")] };
          },
        }),
      ),
    });
    const got = await client.status({ id: "a1" });
    assert.equal(got.id, "a1");
    assert.equal(calls, 3);
  });

  it("retry a Spawn under the same idempotency key, set by default", async () => {
    const keys: string[] = [];
    const client = new SubagentdClient({
      transport: createRouterTransport(({ service }) =>
        service(pb.AgentService, {
          spawn(request) {
            keys.push(request.idempotencyKey);
            if (keys.length === 1) {
              throw refusal("NO_LEADER");
            }
            return { agent: agent("a1") };
          },
        }),
      ),
    });
    await client.spawn({ agent: "simulated", prompt: "x" });
    assert.equal(keys.length, 2);
    assert.match(keys[0]!, /^[0-9a-f-]{36}$/);
    assert.equal(keys[1], keys[0]);
    await client.spawn({ agent: "simulated", prompt: "x", idempotencyKey: "mine" });
    assert.equal(keys.at(-1), "mine");
    assert.notEqual(keys[0], "mine");
  });

  it("do not retry a call that is not idempotent, nor after the deadline", async () => {
    let steers = 0;
    let statuses = 0;
    const client = new SubagentdClient({
      transport: createRouterTransport(({ service }) =>
        service(pb.AgentService, {
          steer() {
            steers += 1;
            throw refusal("NO_LEADER");
          },
          status() {
            statuses += 1;
            throw refusal("RECOVERING");
          },
        }),
      ),
    });
    await assert.rejects(client.steer({ id: "a1", message: "m" }), NoLeader);
    assert.equal(steers, 1);
    await assert.rejects(client.status({ id: "a1" }, { timeoutMs: 300 }), Recovering);
    assert.ok(statuses >= 2, `retried within the deadline (${statuses} calls)`);
  });
});

describe("watch resume", () => {
  it("resumes after NO_LEADER and WATCH_LAGGED with afterSequence = the last sequence, yielding SNAPSHOT events", async () => {
    const requests: { after: bigint; snapshot: boolean }[] = [];
    const client = new SubagentdClient({
      transport: createRouterTransport(({ service }) =>
        service(pb.AgentService, {
          async *watchAgents(request) {
            requests.push({ after: request.afterSequence, snapshot: request.includeSnapshot });
            switch (requests.length) {
              case 1:
                yield event(1, pb.AgentEventKind.SNAPSHOT, "a1");
                yield event(2, pb.AgentEventKind.STARTED, "a1");
                throw refusal("NO_LEADER");
              case 2:
                throw refusal("RECOVERING");
              case 3:
                // Evicted history: the server answers the resume with snapshots.
                yield event(7, pb.AgentEventKind.SNAPSHOT, "a1");
                yield event(8, pb.AgentEventKind.DONE, "a1");
                throw refusal("WATCH_LAGGED", Code.ResourceExhausted, { resume_after_sequence: "8", missed_events: "3" });
              default:
                yield event(12, pb.AgentEventKind.QUEUED, "a2");
                // The stream stays open until the watch is closed.
                await new Promise(() => {});
            }
          },
        }),
      ),
    });
    const watch = client.watch({ leadId: "l", includeSnapshot: true });
    const seen: AgentEvent[] = [];
    for await (const e of watch) {
      seen.push(e);
      if (e.sequence === 12) {
        break;
      }
    }
    assert.deepEqual(
      seen.map((e) => [e.sequence, e.kind]),
      [
        [1, "snapshot"],
        [2, "started"],
        [7, "snapshot"],
        [8, "done"],
        [12, "queued"],
      ],
    );
    assert.deepEqual(requests, [
      { after: 0n, snapshot: true },
      // A live event came: the replay from 2 covers everything, no second snapshot asked for.
      { after: 2n, snapshot: false },
      { after: 2n, snapshot: false },
      { after: 8n, snapshot: false },
    ]);
    assert.equal(watch.resumes, 3);
  });

  it("throws an error that is not a stream break, without resuming", async () => {
    let calls = 0;
    const client = new SubagentdClient({
      transport: createRouterTransport(({ service }) =>
        service(pb.AgentService, {
          async *watchAgents() {
            calls += 1;
            throw refusal("PERMISSION_DENIED", Code.PermissionDenied, { required_roles: "viewer" });
          },
        }),
      ),
    });
    const watch = client.watch({});
    await assert.rejects(async () => {
      for await (const _ of watch) {
        // nothing
      }
    }, (err: unknown) => err instanceof Error && err.name === "PermissionDenied");
    assert.equal(calls, 1);
  });
});
