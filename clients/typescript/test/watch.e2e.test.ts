// watch(): events as they happen, resuming across a server restart on the
// same port (embedded store), ending promptly when its signal aborts, and
// giving up with the last error once the server stays away.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, it } from "node:test";

import { type AgentEvent, SubagentdClient, Unavailable } from "@subagentd/client";

import { Server, TIMEOUT_MS } from "./server.js";

/** Fails a test that would hang: a guard, not a wait. */
function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const guard = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([promise, guard]).finally(() => clearTimeout(timer));
}

/** Reads events until one of `kind` for agent `id`; returns those read. */
async function until(events: AsyncIterator<AgentEvent>, kind: string, id: string): Promise<AgentEvent[]> {
  const read: AgentEvent[] = [];
  for (;;) {
    const next = await within(TIMEOUT_MS, `a ${kind} event for ${id}`, events.next());
    assert.ok(!next.done, `the watch ended before a ${kind} event for ${id}`);
    read.push(next.value);
    if (next.value.kind === kind && next.value.agent.id === id) {
      return read;
    }
  }
}

describe("watch", () => {
  it("resumes after the server restarts on the same port, and events keep coming", async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "subagentd-ts-store-"));
    let server = await Server.start({ dataDir });
    const client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
    try {
      const leadId = `lead-${randomUUID()}`;
      const watch = client.watch({ leadId });
      await watch.opened;
      const events = watch[Symbol.asyncIterator]();

      const before = await client.spawn({ agent: "simulated", prompt: "output before", leadId, background: true });
      const first = await until(events, "done", before.id);
      assert.deepEqual(
        first.map((e) => e.kind),
        ["started", "done"],
      );
      assert.equal(watch.resumes, 0);
      const lastBefore = watch.lastSequence!;

      // The stream drops with the server; the watch reconnects to the new one.
      await server.stop();
      server = await Server.start({ dataDir, listen: server.addr });

      const after = await client.spawn({ agent: "simulated", prompt: "output after", leadId, background: true });
      const second = await until(events, "done", after.id);
      assert.ok(watch.resumes >= 1, "the watch subscribed again");
      // Nothing of before the restart again (a SNAPSHOT would be a state, not a repeat), then the
      // new agent's lifecycle; sequences keep increasing across the restart.
      assert.deepEqual(
        second.filter((e) => e.kind !== "snapshot").map((e) => [e.kind, e.agent.id]),
        [
          ["started", after.id],
          ["done", after.id],
        ],
      );
      const sequences = [...first, ...second].map((e) => e.sequence);
      assert.ok(second[0]!.sequence > lastBefore);
      assert.deepEqual(sequences, [...sequences].sort((a, b) => a - b));
      assert.equal(new Set(sequences).size, sequences.length);
      assert.equal(second.at(-1)!.agent.result, "after");
      watch.close();
      assert.deepEqual(await within(TIMEOUT_MS, "the end after close()", events.next()), { done: true, value: undefined });
    } finally {
      client.close();
      await server.stop();
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it("ends promptly, without an error, when its signal aborts while it waits for an event", async () => {
    const server = await Server.start();
    const client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
    try {
      const controller = new AbortController();
      const watch = client.watch({ leadId: `lead-${randomUUID()}` }, { signal: controller.signal });
      await watch.opened;
      const received: AgentEvent[] = [];
      const iterating = (async () => {
        for await (const event of watch) {
          received.push(event);
        }
      })();
      controller.abort();
      await within(5_000, "the watch's end after abort", iterating);
      assert.deepEqual(received, []);
      // The connection is still good for other calls.
      assert.ok((await client.serverInfo()).version);
    } finally {
      client.close();
      await server.stop();
    }
  });

  it("yields the snapshot first, and ends when the loop breaks", async () => {
    const server = await Server.start();
    const client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
    try {
      const leadId = `lead-${randomUUID()}`;
      const agent = await client.spawn({ agent: "simulated", prompt: "output x", leadId });
      const watch = client.watch({ leadId, includeSnapshot: true });
      for await (const event of watch) {
        assert.equal(event.kind, "snapshot");
        assert.equal(event.agent.id, agent.id);
        assert.equal(event.agent.status, "done");
        break;
      }
      assert.throws(() => watch[Symbol.asyncIterator](), TypeError, "a watch is iterated once");
    } finally {
      client.close();
      await server.stop();
    }
  });

  it("ends when the client is closed, and does not reconnect", async () => {
    const server = await Server.start();
    const client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
    try {
      const watch = client.watch({});
      await watch.opened;
      client.close();
      assert.deepEqual(await within(5_000, "the watch's end after close()", watch[Symbol.asyncIterator]().next()), {
        done: true,
        value: undefined,
      });
      assert.equal(watch.resumes, 0);
    } finally {
      await server.stop();
    }
  });

  it("gives up with Unavailable once the server stays away for watchResumeTimeoutMs", async () => {
    const server = await Server.start();
    const client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS, watchResumeTimeoutMs: 300 });
    try {
      const watch = client.watch({});
      await watch.opened;
      await server.stop();
      await within(TIMEOUT_MS, "the watch's error", assert.rejects(
        (async () => {
          for await (const _ of watch) {
            // no agents: no events
          }
        })(),
        (err: unknown) => {
          assert.ok(err instanceof Unavailable, String(err));
          return true;
        },
      ));
      assert.ok(watch.resumes >= 1);
    } finally {
      client.close();
      await server.stop();
    }
  });
});
