// examples/ai_sdk_lead.ts end to end: the Vercel AI SDK's MCP client on the
// real server's /mcp, driven by a scripted fake model (the same script as the
// Python test of examples/openai_agents_lead.py): three agent_spawn calls,
// then agent_await (all), then a final answer quoting what agent_await
// returned.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { SubagentdClient } from "@subagentd/client";

import { INSTRUCTIONS, lead } from "../examples/ai_sdk_lead.js";
import { awaitArgs, idIn, scriptedModel, spawnArgs } from "./fake_model.js";
import { Server, TIMEOUT_MS, config } from "./server.js";

const WORDS = ["alpha", "beta", "gamma"];
const TOOLS = ["agent_spawn", "agent_status", "agent_await", "agent_result", "agent_cancel", "agent_steer"];

describe("examples/ai_sdk_lead.ts", () => {
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

  it("delegates with agent_spawn and collects with agent_await", async () => {
    const model = scriptedModel((results) => {
      if (results.size === 0) {
        return {
          toolCalls: WORDS.map((w) => ({ id: `call_spawn_${w}`, name: "agent_spawn", input: spawnArgs(`output ${w}`) })),
        };
      }
      const awaited = results.get("call_await");
      if (awaited === undefined) {
        return { toolCalls: [{ id: "call_await", name: "agent_await", input: awaitArgs(20, "all") }] };
      }
      return { text: `RESULTS: ${awaited.text}` };
    });
    const leadId = "ai-sdk-lead";
    const result = await lead({
      model,
      task: "Say alpha, beta and gamma, each by its own sub-agent.",
      url: server.mcpUrl,
      leadId,
      agent: "simulated",
      subModel: "acme/small",
    });

    // Three model calls: the spawns, the await, the answer.
    const calls = model.doGenerateCalls;
    assert.equal(calls.length, 3);
    const first = calls[0]!;
    assert.deepEqual(
      (first.tools ?? []).map((t) => t.name),
      TOOLS,
      "the AI SDK's MCP client read the server's tools",
    );
    const system = first.prompt[0]!;
    assert.equal(system.role, "system");
    assert.equal(
      system.content,
      `${INSTRUCTIONS}\nIn every agent_spawn pass agent "simulated" and model "acme/small".\n`,
    );

    // The three spawns' results reached the model, each naming its agent.
    const ids = new Map<string, string>();
    for (const w of WORDS) {
      const seen = result.steps[0]!.toolResults.find((r) => r.toolCallId === `call_spawn_${w}`);
      assert.ok(seen, `the result of call_spawn_${w}`);
      const text = (seen.output as { content: Array<{ text: string }> }).content.map((c) => c.text).join("\n");
      assert.match(text, /^agent: simulated$/m);
      assert.match(text, /^model: acme\/small$/m);
      ids.set(w, idIn(text));
    }
    assert.equal(new Set(ids.values()).size, 3);

    // agent_await (all) returned every result, once each; the answer quotes it.
    const awaited = (result.steps[1]!.toolResults[0]!.output as { content: Array<{ text: string }> }).content
      .map((c) => c.text)
      .join("\n");
    for (const [w, id] of ids) {
      assert.equal(awaited.split(id).length - 1, 1, awaited);
      assert.match(awaited, new RegExp(`## ${id} \\[done\\] \\(simulated[^\\n]*\\)\\n${w}\\n?`));
    }
    assert.equal(result.text, `RESULTS: ${awaited}`);

    // The server agrees: the lead's three agents, done, with those results, collected.
    const agents = new Map<string, { status: string; result: string; collected: boolean }>();
    for await (const a of client.list({ leadId })) {
      agents.set(a.id, { status: a.status, result: a.result, collected: a.collectedAt !== undefined });
    }
    assert.deepEqual([...agents.keys()].sort(), [...ids.values()].sort());
    for (const [w, id] of ids) {
      assert.deepEqual(agents.get(id), { status: "done", result: w, collected: true });
    }
  });
});
