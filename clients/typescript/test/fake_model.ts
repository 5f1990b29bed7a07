// A scripted language model for the Vercel AI SDK (MockLanguageModelV3 of
// ai/test): each step's answer is a function of the tool results the model
// has been sent so far, so no real model and no network are involved.

import { MockLanguageModelV3 } from "ai/test";

export type CallOptions = Parameters<MockLanguageModelV3["doGenerate"]>[0];
type GenerateResult = Awaited<ReturnType<MockLanguageModelV3["doGenerate"]>>;

export interface ToolCall {
  readonly id: string;
  readonly name: string;
  readonly input: Readonly<Record<string, unknown>>;
}

/** One answer of the model: tool calls, or the final text. */
export type Turn = { readonly toolCalls: readonly ToolCall[] } | { readonly text: string };

/** A tool result as the model receives it: its output's kind and its text. */
export interface SeenResult {
  readonly toolName: string;
  /** "text", "error-text", "content", "json", … (LanguageModelV3ToolResultOutput's type). */
  readonly type: string;
  readonly text: string;
}

/** The tool results in a prompt, by tool call id (a later result of the same id wins). */
export function toolResults(prompt: CallOptions["prompt"]): Map<string, SeenResult> {
  const out = new Map<string, SeenResult>();
  for (const message of prompt) {
    if (message.role !== "tool") {
      continue;
    }
    for (const part of message.content) {
      if (part.type !== "tool-result") {
        continue;
      }
      const output = part.output;
      let text: string;
      switch (output.type) {
        case "text":
        case "error-text":
          text = output.value;
          break;
        case "content":
          text = output.value.map((c) => (c.type === "text" ? c.text : JSON.stringify(c))).join("\n");
          break;
        default:
          text = JSON.stringify(output);
      }
      out.set(part.toolCallId, { toolName: part.toolName, type: output.type, text });
    }
  }
  return out;
}

/** A model that answers each step with `script(results of the prompt, step number from 0)`. */
export function scriptedModel(script: (results: Map<string, SeenResult>, step: number) => Turn): MockLanguageModelV3 {
  let step = 0;
  return new MockLanguageModelV3({
    provider: "fake",
    modelId: "fake-lead",
    doGenerate: async (options): Promise<GenerateResult> => {
      const turn = script(toolResults(options.prompt), step++);
      const usage = {
        inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
        outputTokens: { total: 10, text: 10, reasoning: 0 },
      };
      if ("text" in turn) {
        return { content: [{ type: "text", text: turn.text }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      }
      return {
        content: turn.toolCalls.map((c) => ({
          type: "tool-call" as const,
          toolCallId: c.id,
          toolName: c.name,
          input: JSON.stringify(c.input),
        })),
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
    },
  });
}

/** agent_spawn's arguments: every one given, null where not used (strict mode). */
export function spawnArgs(prompt: string, more: Readonly<Record<string, unknown>> = {}): Record<string, unknown> {
  return {
    prompt,
    agent: "simulated",
    description: null,
    model: "acme/small",
    wait_seconds: null,
    timeout_minutes: null,
    continue_from: null,
    fork: null,
    ...more,
  };
}

/** agent_await's arguments. */
export function awaitArgs(timeoutSeconds: number, mode: "any" | "all" | null = null): Record<string, unknown> {
  return { ids: null, mode, timeout_seconds: timeoutSeconds };
}

/** The agent id in a tool's text (`id: <uuid>` on a line of its own). */
export function idIn(text: string): string {
  const id = /^id: ([0-9a-f-]{36})$/m.exec(text)?.[1];
  if (id === undefined) {
    throw new Error(`no "id: <uuid>" line in ${JSON.stringify(text)}`);
  }
  return id;
}
