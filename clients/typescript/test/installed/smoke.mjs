// Run by .ci/typescript-client.sh in a fresh directory outside the
// repository, where `npm install <the packed tarball>` put @subagentd/client:
// against the binary (SUBAGENTD_BIN) with max_background_agents = 1, spawn
// and await an agent, then check that a second background spawn while one
// is live throws GlobalLimitReached (instanceof) with its attributes. Then
// @subagentd/client/tools on the server's /mcp: the tools, a spawn that waits
// for its result, and aiSdk()'s error without the optional `ai` package.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { createInterface } from "node:readline";

import { GlobalLimitReached, SubagentdClient, SubagentdError } from "@subagentd/client";
import { leadTools } from "@subagentd/client/tools";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "subagentd-smoke-"));
fs.writeFileSync(
  path.join(dir, "config.toml"),
  '[limits]\nmax_background_agents = 1\n\n[agents.simulated]\nrunner = "simulated"\ndefault_model = "acme/small"\n',
);
const server = spawn(process.env.SUBAGENTD_BIN, ["serve", "--config", path.join(dir, "config.toml"), "--listen", "127.0.0.1:0"], {
  stdio: ["ignore", "ignore", "pipe"],
  env: {
    ...process.env,
    SUBAGENTD_TELEMETRY__METRICS_LISTEN: "127.0.0.1:0",
    SUBAGENTD_HTTP__LISTEN: "127.0.0.1:0",
    SUBAGENTD_SERVER__SHUTDOWN_GRACE: "0s",
    SUBAGENTD_STORE__BACKEND: "memory",
  },
});
const exited = new Promise((resolve) => server.once("exit", resolve));
let http;
const address = await new Promise((resolve, reject) => {
  const log = [];
  createInterface({ input: server.stderr }).on("line", (line) => {
    log.push(line);
    const addr = /subagentd listening.* addr=(\S+)/.exec(line)?.[1];
    if (addr) {
      http = / http=(\S+)/.exec(line)?.[1];
      resolve(addr);
    }
  });
  server.once("exit", (code) => reject(new Error(`subagentd exited (${code}):\n${log.join("\n")}`)));
});

const client = new SubagentdClient({ address });
try {
  const leadId = "smoke";
  const waiting = await client.spawn({ agent: "simulated", prompt: "wait_steer\noutput ok", leadId, background: true });
  assert.equal(waiting.status, "running");
  const refused = await client.spawn({ agent: "simulated", prompt: "output no", leadId, background: true }).catch((e) => e);
  assert.ok(refused instanceof GlobalLimitReached, `GlobalLimitReached, not ${refused}`);
  assert.ok(refused instanceof SubagentdError);
  assert.deepEqual([refused.code, refused.limit, refused.live, refused.configKey], ["RESOURCE_EXHAUSTED", 1, 1, "limits.max_background_agents"]);
  await client.steer({ id: waiting.id, message: "go" });
  const { agents, timedOut } = await client.awaitAgents({ leadId, collect: true, timeoutMs: 30_000 });
  assert.equal(timedOut, false);
  assert.deepEqual(agents.map((a) => [a.id, a.status, a.result]), [[waiting.id, "done", "steer: go\nok"]]);
  console.log(`installed @subagentd/client: spawned, refused (${refused.name}), awaited ${agents[0].id}`);

  const tools = await leadTools({ url: `http://${http}/mcp`, leadId: "smoke-tools" });
  try {
    assert.deepEqual(tools.openai().map((t) => t.function.name).slice(0, 3), ["agent_spawn", "agent_status", "agent_await"]);
    const spawned = await tools.call(
      "agent_spawn",
      { prompt: "output tools", agent: "simulated", description: null, model: null, wait_seconds: 20, timeout_minutes: null, continue_from: null, fork: null },
      { toolCallId: "smoke-1" },
    );
    assert.equal(spawned.isError, false, spawned.text);
    assert.deepEqual([spawned.structuredContent.status, spawned.structuredContent.result], ["done", "tools"]);
    await assert.rejects(tools.aiSdk(), /needs the `ai` package/);
    console.log(`installed @subagentd/client/tools: ${tools.names.length} tools, spawned ${spawned.structuredContent.id}`);
  } finally {
    await tools.close();
  }
} finally {
  client.close();
  server.kill("SIGTERM");
  await exited;
  fs.rmSync(dir, { recursive: true, force: true });
}
