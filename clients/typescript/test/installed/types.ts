// Type-checked (tsc --noEmit, strict) by .ci/typescript-client.sh against the
// installed package: its `exports` and `types` give a consumer these types.

import {
  type Agent,
  type AgentEvent,
  type AgentStatus,
  GlobalLimitReached,
  SubagentdClient,
  SubagentdError,
} from "@subagentd/client";
import { type AnthropicTool, type OpenAITool, type ToolCallResult, leadTools } from "@subagentd/client/tools";

const settled: readonly AgentStatus[] = ["done", "failed", "cancelled", "awaiting_approval"];

export async function lead(client: SubagentdClient): Promise<Agent[]> {
  const agent: Agent = await client.spawn({ agent: "simulated", prompt: "output x", background: true });
  const created: Date = agent.createdAt;
  void created;
  const watch = client.watch({ ids: [agent.id] });
  for await (const event of watch) {
    const e: AgentEvent = event;
    if (settled.includes(e.agent.status)) {
      break;
    }
  }
  try {
    const { agents } = await client.awaitAgents({ ids: [agent.id], mode: "any", timeoutMs: 1_000 });
    return [...agents];
  } catch (err) {
    if (err instanceof GlobalLimitReached) {
      const n: number = err.limit;
      void n;
    } else if (err instanceof SubagentdError) {
      const code: string = err.code;
      void code;
    }
    throw err;
  }
}

export async function ownLoop(url: string): Promise<ToolCallResult> {
  const tools = await leadTools({ url, token: "key", leadId: "lead-1" });
  try {
    const openai: OpenAITool[] = tools.openai();
    const anthropic: AnthropicTool[] = tools.anthropic();
    const strict: true = openai[0]!.function.strict;
    void [anthropic[0]!.input_schema, strict];
    const result = await tools.call("agent_await", '{"ids":null,"mode":"any","timeout_seconds":5}', { toolCallId: "call_1" });
    const flagged: boolean = result.isError;
    void flagged;
    return result;
  } finally {
    await tools.close();
  }
}
