// A lead agent on the Vercel AI SDK, with subagentd as its MCP server: the
// model delegates pieces of its task to sub-agents with agent_spawn (they run
// in the background, under subagentd's limits) and collects their results
// with agent_await. The AI SDK's MCP client reads the tools from the server's
// /mcp (streamable HTTP). Requirements (exact versions: package.json):
//
//   npm install ai @ai-sdk/mcp
//
// Run it against a server, with a model through the AI Gateway
// (AI_GATEWAY_API_KEY), or pass any LanguageModel to `lead()`:
//
//   subagentd serve &     # /mcp on 127.0.0.1:50080
//   npm run build && AI_GATEWAY_API_KEY=... node dist/examples/ai_sdk_lead.js \
//       --url http://127.0.0.1:50080/mcp --model openai/gpt-4.1 "Review the three modules of ..."
//
// It prints the lead's final answer. With --agent and --sub-model the lead is
// told which agent type and model its sub-agents use (otherwise it passes null
// and the server's defaults apply). SUBAGENTD_TOKEN, when set, is the key.
// (The AI SDK's MCP client sends no tool call id with a call; the tools of
// `leadTools(...).aiSdk()` from @subagentd/client/tools do, so that a retried
// agent_spawn starts no second agent.)

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";
import { pathToFileURL } from "node:url";

import { createMCPClient } from "@ai-sdk/mcp";
import { type LanguageModel, generateText, stepCountIs } from "ai";

export const INSTRUCTIONS = `\
You lead a team of sub-agents that subagentd runs for you. Split the task into
independent pieces and delegate each one with agent_spawn: one call per piece,
with a complete, self-contained prompt (a sub-agent does not see this
conversation). agent_spawn returns at once with the agent's id; start every
piece before you wait for any. Then call agent_await with mode "all" to collect
the results; a timed-out agent_await is a normal answer: call it again until
nothing is running. Never poll agent_status. Finally answer the task from the
results you collected.
`;

export interface LeadOptions {
  readonly model: LanguageModel;
  readonly task: string;
  /** The server's MCP endpoint. */
  readonly url: string;
  readonly leadId: string;
  readonly token?: string;
  readonly agent?: string;
  readonly subModel?: string;
}

/** Runs the lead to its final answer. */
export async function lead(options: LeadOptions) {
  const headers: Record<string, string> = { "subagentd-lead-id": options.leadId };
  if (options.token) {
    headers.authorization = `Bearer ${options.token}`;
  }
  let system = INSTRUCTIONS;
  if (options.agent || options.subModel) {
    system += `\nIn every agent_spawn pass agent ${JSON.stringify(options.agent ?? null)} and model ${JSON.stringify(options.subModel ?? null)}.\n`;
  }
  const subagentd = await createMCPClient({ transport: { type: "http", url: options.url, headers } });
  try {
    return await generateText({
      model: options.model,
      system,
      prompt: options.task,
      tools: await subagentd.tools(),
      stopWhen: stepCountIs(20),
    });
  } finally {
    await subagentd.close();
  }
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      url: { type: "string", default: "http://127.0.0.1:50080/mcp" },
      model: { type: "string", default: "openai/gpt-4.1" },
      "lead-id": { type: "string", default: `ai-sdk-${randomUUID()}` },
      agent: { type: "string" },
      "sub-model": { type: "string" },
    },
  });
  const leadId = values["lead-id"]!;
  process.stderr.write(`lead ${leadId}\n`);
  const result = await lead({
    model: values.model!,
    task: positionals[0] ?? "Write three one-line slogans for a bakery, each by a different sub-agent.",
    url: values.url!,
    leadId,
    token: process.env.SUBAGENTD_TOKEN,
    agent: values.agent,
    subModel: values["sub-model"],
  });
  process.stdout.write(`${result.text}\n`);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  main().catch((err: unknown) => {
    process.stderr.write(`ai_sdk_lead: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  });
}
