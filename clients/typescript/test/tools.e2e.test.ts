// @subagentd/client/tools against the real server's /mcp: the tools it lists
// (with the configured agent types), their OpenAI, Anthropic and AI SDK
// shapes, and tool calls: results, refusals, malformed calls, the tool call
// id that makes a retried spawn start no second agent, the lead header and
// the token.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";

import { type Agent, SubagentdClient } from "@subagentd/client";
import { type LeadTools, leadTools } from "@subagentd/client/tools";
import { type Tool, generateText, stepCountIs } from "ai";

import { awaitArgs, idIn, scriptedModel, spawnArgs } from "./fake_model.js";
import { REPO, Server, TIMEOUT_MS, config, newKey } from "./server.js";

/** tools/list without `[mcp] approvals = "lead"`, in the catalogue's order. */
const TOOLS = ["agent_spawn", "agent_status", "agent_await", "agent_result", "agent_cancel", "agent_steer"];

interface CatalogueTool {
  name: string;
  description: string;
  inputSchema: Record<string, unknown>;
  outputSchema?: Record<string, unknown>;
}
const CATALOGUE = (JSON.parse(fs.readFileSync(path.join(REPO, "mcp", "tools.json"), "utf8")) as { tools: CatalogueTool[] }).tools;

/** Two agent types: the enum of agent_spawn's `agent` must name both. */
const TWO_TYPES = `
[agents.reviewer]
runner = "simulated"
default_model = "acme/small"
description = "reviews code"
`;

const lead = () => `tools-${randomUUID()}`;

async function agentsOf(client: SubagentdClient, leadId: string): Promise<Agent[]> {
  const out: Agent[] = [];
  for await (const agent of client.list({ leadId })) {
    out.push(agent);
  }
  return out;
}

describe("leadTools against subagentd's /mcp", () => {
  let server: Server;
  let client: SubagentdClient;

  before(async () => {
    server = await Server.start({ config: config(20, TWO_TYPES) });
    client = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
  });

  after(async () => {
    client.close();
    await server.stop();
  });

  async function withTools<T>(leadId: string, body: (tools: LeadTools) => Promise<T>): Promise<T> {
    const tools = await leadTools({ url: server.mcpUrl, leadId, timeoutMs: TIMEOUT_MS });
    try {
      return await body(tools);
    } finally {
      await tools.close();
    }
  }

  it("lists exactly the server's tools, with the configured agent types in agent_spawn's enum", async () => {
    await withTools(lead(), async (tools) => {
      assert.deepEqual(tools.names, TOOLS);
      assert.match(tools.instructions ?? "", /agent_await/);
      for (const tool of tools.tools) {
        const entry = CATALOGUE.find((t) => t.name === tool.name);
        assert.ok(entry, `${tool.name} is in mcp/tools.json`);
        assert.deepEqual(tool.outputSchema, entry.outputSchema, tool.name);
        if (tool.name !== "agent_spawn") {
          assert.deepEqual(tool, { name: entry.name, description: entry.description, inputSchema: entry.inputSchema, ...(entry.outputSchema ? { outputSchema: entry.outputSchema } : {}) });
        }
      }
      // agent_spawn: the catalogue's schema with the server's agent types (and null) as `agent`'s enum.
      const spawn = tools.tools[0]!;
      const entry = CATALOGUE[0]!;
      const props = entry.inputSchema.properties as Record<string, Record<string, unknown>>;
      assert.equal(props.agent!.enum, undefined, "the catalogue itself has no enum");
      assert.deepEqual(spawn.inputSchema, {
        ...entry.inputSchema,
        properties: { ...props, agent: { ...props.agent, enum: ["reviewer", "simulated", null] } },
      });
      assert.ok(spawn.description.startsWith(entry.description));
      assert.match(spawn.description, /- reviewer: reviews code/);
    });
  });

  it("gives the tools as OpenAI chat completions, Anthropic and AI SDK tools", async () => {
    await withTools(lead(), async (tools) => {
      assert.deepEqual(
        tools.openai(),
        tools.tools.map((t) => ({
          type: "function",
          function: { name: t.name, description: t.description, parameters: t.inputSchema, strict: true },
        })),
      );
      assert.deepEqual(
        tools.anthropic(),
        tools.tools.map((t) => ({ name: t.name, description: t.description, input_schema: t.inputSchema })),
      );
      // Copies: a caller that edits a schema does not change the next call's.
      const first = tools.openai()[0]!;
      (first.function.parameters as Record<string, unknown>).changed = true;
      assert.equal(tools.openai()[0]!.function.parameters.changed, undefined);

      const set = await tools.aiSdk();
      assert.deepEqual(Object.keys(set), TOOLS);
      for (const t of tools.tools) {
        const tool = set[t.name] as Tool & { inputSchema: { jsonSchema: unknown } };
        assert.equal(tool.description, t.description);
        assert.equal(tool.strict, true);
        assert.deepEqual(tool.inputSchema.jsonSchema, t.inputSchema, `${t.name}: ai's jsonSchema() of the server's schema`);
        assert.equal(typeof tool.execute, "function");
      }
    });
  });

  it("calls agent_spawn and agent_await: the texts the model reads, not errors", async () => {
    const leadId = lead();
    await withTools(leadId, async (tools) => {
      const spawned = await tools.call("agent_spawn", spawnArgs("output hello from ts"));
      assert.equal(spawned.isError, false, spawned.text);
      const id = idIn(spawned.text);
      assert.match(spawned.text, /^agent: simulated$/m);
      assert.deepEqual(
        [spawned.structuredContent?.id, spawned.structuredContent?.agent, spawned.structuredContent?.model],
        [id, "simulated", "acme/small"],
      );

      // Arguments as the JSON text a model produced.
      const awaited = await tools.call("agent_await", JSON.stringify(awaitArgs(TIMEOUT_MS / 1000, "all")));
      assert.equal(awaited.isError, false, awaited.text);
      assert.ok(awaited.text.startsWith(`## ${id} [done] (simulated`), awaited.text);
      assert.equal(awaited.text.split("\n")[1], "hello from ts", awaited.text);
      assert.equal(awaited.structuredContent, undefined, "agent_await answers in prose");

      // The lead header named the lead; agent_await collected the result.
      const agents = await agentsOf(client, leadId);
      assert.deepEqual(
        agents.map((a) => [a.id, a.status, a.result, a.collectedAt instanceof Date]),
        [[id, "done", "hello from ts", true]],
      );
    });
  });

  it("answers a refusal and a malformed call with isError and the reason", async () => {
    await withTools(lead(), async (tools) => {
      const unknown = await tools.call("agent_spawn", spawnArgs("output x", { agent: "nope" }));
      assert.deepEqual(unknown, {
        text: 'Refused (UNKNOWN_AGENT_TYPE): there is no agent type "nope". Known types: reviewer,simulated.',
        isError: true,
      });
      const bogus = await tools.call("agent_spawn", { ...spawnArgs("output x"), bogus: 1 });
      assert.equal(bogus.isError, true);
      assert.match(bogus.text, /^Error: unknown argument "bogus"/);
      const noTool = await tools.call("agent_nope", {});
      assert.deepEqual(noTool, { text: 'Error: no tool named "agent_nope"', isError: true });
      const notJson = await tools.call("agent_spawn", "{not json");
      assert.equal(notJson.isError, true);
      assert.match(notJson.text, /^The arguments of agent_spawn are not valid JSON/);
    });
  });

  it("spawns once for the same tool call id, twice for two ids", async () => {
    const leadId = lead();
    await withTools(leadId, async (tools) => {
      const args = spawnArgs("wait_steer\noutput once");
      const first = await tools.call("agent_spawn", args, { toolCallId: "call-1" });
      const retried = await tools.call("agent_spawn", args, { toolCallId: "call-1" });
      const other = await tools.call("agent_spawn", args, { toolCallId: "call-2" });
      for (const r of [first, retried, other]) {
        assert.equal(r.isError, false, r.text);
      }
      assert.equal(idIn(retried.text), idIn(first.text), "the retried call answers with the first agent");
      assert.notEqual(idIn(other.text), idIn(first.text));
      const agents = await agentsOf(client, leadId);
      assert.deepEqual(agents.map((a) => a.id).sort(), [idIn(first.text), idIn(other.text)].sort());
      await client.cancel({ leadId, reason: "test over" });
    });
  });

  it("is the tools of an AI SDK generateText loop: the tool call id reaches the server, refusals are error text", async () => {
    const leadId = lead();
    await withTools(leadId, async (tools) => {
      const model = scriptedModel((results, step) => {
        switch (step) {
          case 0:
            return { toolCalls: [{ id: "spawn-1", name: "agent_spawn", input: spawnArgs("output via ai sdk", { wait_seconds: 20 }) }] };
          case 1:
            // The same call again (a retry), and one the server refuses.
            return {
              toolCalls: [
                { id: "spawn-1", name: "agent_spawn", input: spawnArgs("output via ai sdk", { wait_seconds: 20 }) },
                { id: "bad-1", name: "agent_spawn", input: spawnArgs("output no", { agent: "nope" }) },
              ],
            };
          default:
            return { text: `seen: ${[...results.entries()].map(([id, r]) => `${id}=${r.type}`).join(",")}` };
        }
      });
      const result = await generateText({ model, prompt: "delegate", tools: await tools.aiSdk(), stopWhen: stepCountIs(5) });
      assert.equal(result.text, "seen: spawn-1=text,bad-1=error-text");

      // What the model was sent: the server's tools, strict, with their schemas.
      const sent = model.doGenerateCalls[0]!.tools ?? [];
      assert.deepEqual(
        sent.map((t) => (t.type === "function" ? [t.name, t.strict, t.inputSchema] : [t.type])),
        tools.tools.map((t) => [t.name, true, t.inputSchema]),
      );
      const [step1, step2] = [result.steps[0]!, result.steps[1]!];
      const spawned = step1.toolResults[0]!.output as { text: string; isError: boolean };
      assert.equal(spawned.isError, false);
      assert.match(spawned.text, /^status: done$/m);
      assert.match(spawned.text, /via ai sdk/);
      const again = step2.toolResults.find((r) => r.toolCallId === "spawn-1")!.output as { text: string };
      assert.equal(idIn(again.text), idIn(spawned.text), "the same tool call id: the same agent");
      const refused = step2.toolResults.find((r) => r.toolCallId === "bad-1")!.output as { text: string; isError: boolean };
      assert.equal(refused.isError, true);
      assert.match(refused.text, /^Refused \(UNKNOWN_AGENT_TYPE\)/);

      const agents = await agentsOf(client, leadId);
      assert.deepEqual(
        agents.map((a) => [a.id, a.status, a.result]),
        [[idIn(spawned.text), "done", "via ai sdk"]],
      );
    });
  });
});

describe("leadTools with max_background_agents = 1", () => {
  let server: Server;

  before(async () => {
    server = await Server.start({ config: config(1) });
  });

  after(async () => {
    await server.stop();
  });

  it("answers a spawn over the limit with the refusal, isError", async () => {
    const leadId = lead();
    const tools = await leadTools({ url: server.mcpUrl, leadId, timeoutMs: TIMEOUT_MS });
    try {
      const running = await tools.call("agent_spawn", spawnArgs("wait_steer\noutput later"));
      assert.equal(running.isError, false, running.text);
      const refused = await tools.call("agent_spawn", spawnArgs("output no"));
      assert.equal(refused.isError, true);
      assert.match(refused.text, /^Refused \(GLOBAL_LIMIT_REACHED\): 1 of 1 background agents are live \(limits\.max_background_agents\)/);
      const cancelled = await tools.call("agent_cancel", { id: null, all: true, reason: "test over" });
      assert.equal(cancelled.isError, false, cancelled.text);
      assert.deepEqual(cancelled.structuredContent?.cancelled, [idIn(running.text)]);
    } finally {
      await tools.close();
    }
  });
});

describe("leadTools with approvals by the lead", () => {
  it("lists agent_approve too", async () => {
    const server = await Server.start({ config: config(5, '\n[mcp]\napprovals = "lead"\n') });
    try {
      const tools = await leadTools({ url: server.mcpUrl, timeoutMs: TIMEOUT_MS });
      try {
        assert.deepEqual(tools.names, [...TOOLS, "agent_approve"]);
        assert.deepEqual(tools.anthropic().map((t) => t.name), [...TOOLS, "agent_approve"]);
      } finally {
        await tools.close();
      }
    } finally {
      await server.stop();
    }
  });
});

describe("leadTools on a server that requires keys", () => {
  let server: Server;
  let key: string;

  before(async () => {
    const f = newKey("front1", "team-a", "frontend");
    key = f.key;
    server = await Server.start({ config: config(5, `\n[auth]\nmode = "required"\n${f.entry}`) });
  });

  after(async () => {
    await server.stop();
  });

  it("is refused without the token", async () => {
    await assert.rejects(leadTools({ url: server.mcpUrl, token: "", timeoutMs: TIMEOUT_MS }), (err: unknown) => {
      // The MCP SDK's StreamableHTTPError, with the HTTP status as its code.
      assert.equal((err as { code?: unknown }).code, 401, String(err));
      assert.match(String(err), /this call needs a credential/);
      return true;
    });
  });

  it("sends the token as a bearer key; without a lead id the lead is the key's principal", async () => {
    const tools = await leadTools({ url: server.mcpUrl, token: key, timeoutMs: TIMEOUT_MS });
    let id: string;
    try {
      const spawned = await tools.call("agent_spawn", spawnArgs("output keyed", { wait_seconds: 20 }));
      assert.equal(spawned.isError, false, spawned.text);
      id = idIn(spawned.text);
    } finally {
      await tools.close();
    }
    const client = new SubagentdClient({ address: server.addr, token: key, timeoutMs: TIMEOUT_MS });
    try {
      const agent = await client.status({ id });
      assert.deepEqual([agent.leadId, agent.result, agent.tenant], ["key:front1", "keyed", "team-a"]);
    } finally {
      client.close();
    }
  });
});
