// examples/inbox_workflow.ts, the README-sized lead workflow, against the
// server: three background agents, the first to settle collected through the
// lead's inbox and continued, the other two cancelled. And docs/clients.md
// shows exactly the example's code.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, describe, it } from "node:test";

import { SubagentdClient } from "@subagentd/client";

import { REPO, Server, TIMEOUT_MS, config } from "./server.js";

const DIST = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const PACKAGE = path.dirname(DIST);

/** The example's source below its leading comment: what docs/clients.md shows. */
async function exampleCode(): Promise<string> {
  const text = await readFile(path.join(PACKAGE, "examples", "inbox_workflow.ts"), "utf8");
  return text.slice(text.indexOf("\nimport ")).trim();
}

describe("examples/inbox_workflow.ts", () => {
  let server: Server;
  let client: SubagentdClient;

  before(async () => {
    server = await Server.start({ config: config() });
    client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
  });

  after(async () => {
    client.close();
    await server.stop();
  });

  it("collects the first to settle, continues it and cancels the rest", async () => {
    const { stdout } = await promisify(execFile)(process.execPath, [path.join(DIST, "examples", "inbox_workflow.js")], {
      env: { ...process.env, SUBAGENTD_ADDR: server.addr },
      timeout: TIMEOUT_MS,
    });
    const lines = stdout.trim().split("\n");
    assert.equal(lines.length, 4, stdout);
    const [, first, firstStatus, ...firstResult] = lines[0].split(" ");
    assert.deepEqual([firstStatus, firstResult.join(" ")], ["done", "the summary"]);
    const [, more, moreStatus, ...moreResult] = lines[1].split(" ");
    assert.deepEqual([moreStatus, moreResult.join(" ")], ["done", "the details"]);
    const cancelled = lines.slice(2).map((line) => line.split(" "));
    assert.deepEqual(cancelled.map(([word]) => word), ["cancelled", "cancelled"]);

    const underLead = new Map<string, string>();
    for await (const agent of client.list({ leadId: "lead-42" })) underLead.set(agent.id, agent.status);
    assert.equal(underLead.get(first), "done");
    assert.equal((await client.status({ id: more })).continuesId, first);
    for (const [, id] of cancelled) assert.equal(underLead.get(id), "cancelled");
  });

  it("is what docs/clients.md shows", async () => {
    const docs = await readFile(path.join(REPO, "docs", "clients.md"), "utf8");
    assert.ok(docs.includes("```typescript\n" + (await exampleCode()) + "\n```"), "docs/clients.md does not show examples/inbox_workflow.ts as it is");
  });
});
