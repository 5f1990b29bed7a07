// @subagentd/client/tools: subagentd's MCP lead tools for a program that runs
// its own model loop. The tools are read from the server's /mcp (tools/list,
// so the agent-type enum is the server's) and handed out in the shapes of the
// OpenAI chat completions, Anthropic and Vercel AI SDK tool APIs; a tool call
// is sent back to /mcp. The tools' behaviour lives in the server alone.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ErrorCode, McpError } from "@modelcontextprotocol/sdk/types.js";
import type { ToolSet } from "ai";

/** `[http] listen`'s default, with the MCP path. */
export const DEFAULT_MCP_URL = "http://127.0.0.1:50080/mcp";
/** The `_meta` key of a tool call that makes a retried `agent_spawn` start no second agent. */
export const TOOL_CALL_ID_META = "subagentd/toolCallId";
/** The header that names the lead the tools act for. */
export const LEAD_ID_HEADER = "subagentd-lead-id";

/** A JSON Schema object, as the server sends it. */
export type JsonSchema = { readonly [key: string]: unknown };

export interface LeadToolsOptions {
  /** The server's MCP endpoint, `http(s)://HOST:PORT/mcp` (default DEFAULT_MCP_URL). */
  readonly url?: string | URL;
  /** Sent as `authorization: Bearer <token>` (default SUBAGENTD_TOKEN; empty: none). */
  readonly token?: string;
  /** The lead the tools act for (the `subagentd-lead-id` header); default the credential's principal. */
  readonly leadId?: string;
  /** More HTTP headers for every request (e.g. `subagentd-tenant`). */
  readonly headers?: Readonly<Record<string, string>>;
  /**
   * How long a request may go without an answer or a progress notification, in milliseconds
   * (default 60 s; `agent_await` sends progress every 5 s, so it may wait longer than this).
   */
  readonly timeoutMs?: number;
  /** Aborting it abandons connecting. */
  readonly signal?: AbortSignal;
}

/** One tool as `tools/list` describes it. */
export interface LeadTool {
  readonly name: string;
  readonly description: string;
  readonly inputSchema: JsonSchema;
  readonly outputSchema?: JsonSchema;
}

/** What a tool call answered: `text` is what the model should read. */
export interface ToolCallResult {
  /** The text content of the MCP result (its text blocks, joined by newlines). */
  readonly text: string;
  /** A refusal (e.g. `Refused (GLOBAL_LIMIT_REACHED): …`) or a malformed call: show it to the model as an error. */
  readonly isError: boolean;
  /** The same fields as structured data, for the tools that have them (spawn, status, cancel, steer, approve). */
  readonly structuredContent?: Readonly<Record<string, unknown>>;
}

export interface CallToolOptions {
  /** The model's id of this tool call, sent as `_meta` `subagentd/toolCallId`: the same id twice spawns once. */
  readonly toolCallId?: string;
  readonly signal?: AbortSignal;
  /** As LeadToolsOptions.timeoutMs, for this call. */
  readonly timeoutMs?: number;
}

/** An OpenAI chat completions tool (`tools` of a chat completion request). */
export interface OpenAITool {
  readonly type: "function";
  readonly function: {
    readonly name: string;
    readonly description: string;
    readonly parameters: JsonSchema;
    readonly strict: true;
  };
}

/** An Anthropic Messages API tool (`tools` of a messages request). */
export interface AnthropicTool {
  readonly name: string;
  readonly description: string;
  readonly input_schema: JsonSchema;
}

/** Connects to the server's /mcp and reads its tools. */
export async function leadTools(options: LeadToolsOptions = {}): Promise<LeadTools> {
  const url = new URL(options.url ?? DEFAULT_MCP_URL);
  const headers: Record<string, string> = { ...options.headers };
  const token = (options.token ?? (process.env.SUBAGENTD_TOKEN || "")).trim();
  if (token !== "") {
    headers.authorization = `Bearer ${token}`;
  }
  if (options.leadId !== undefined && options.leadId !== "") {
    headers[LEAD_ID_HEADER] = options.leadId;
  }
  const transport = new StreamableHTTPClientTransport(url, { requestInit: { headers } });
  const client = new Client({ name: "@subagentd/client", version: "0.1.0" });
  const requestOptions = { timeout: options.timeoutMs, signal: options.signal };
  await client.connect(transport, requestOptions);
  try {
    const tools: LeadTool[] = [];
    let cursor: string | undefined;
    do {
      const page = await client.listTools(cursor === undefined ? undefined : { cursor }, requestOptions);
      for (const t of page.tools) {
        tools.push(
          Object.freeze({
            name: t.name,
            description: t.description ?? "",
            inputSchema: t.inputSchema as JsonSchema,
            ...(t.outputSchema === undefined ? {} : { outputSchema: t.outputSchema as JsonSchema }),
          }),
        );
      }
      cursor = page.nextCursor;
    } while (cursor !== undefined);
    return new LeadTools(client, transport, Object.freeze(tools), options.leadId, options.timeoutMs);
  } catch (err) {
    await client.close();
    throw err;
  }
}

/** The server's lead tools over one MCP session. Make one with `leadTools()`; `close()` it. */
export class LeadTools {
  /** @internal Use `leadTools()`. */
  constructor(
    private readonly client: Client,
    private readonly transport: StreamableHTTPClientTransport,
    /** The tools in the server's order. */
    readonly tools: readonly LeadTool[],
    /** The lead id sent, if any. */
    readonly leadId: string | undefined,
    private readonly timeoutMs: number | undefined,
  ) {}

  /** The server's instructions for the model (how to use the tools): a good part of a system prompt. */
  get instructions(): string | undefined {
    return this.client.getInstructions();
  }

  /** The tools' names, in the server's order. */
  get names(): string[] {
    return this.tools.map((t) => t.name);
  }

  /** OpenAI chat completions tools, in strict mode (the schemas are written for it). */
  openai(): OpenAITool[] {
    return this.tools.map((t) => ({
      type: "function",
      function: { name: t.name, description: t.description, parameters: structuredClone(t.inputSchema), strict: true },
    }));
  }

  /** Anthropic Messages API tools. */
  anthropic(): AnthropicTool[] {
    return this.tools.map((t) => ({ name: t.name, description: t.description, input_schema: structuredClone(t.inputSchema) }));
  }

  /**
   * Vercel AI SDK tools (`generateText({ tools: await lead.aiSdk() })`), built with the `ai`
   * package's `tool()` and `jsonSchema()` (`ai` is an optional peer dependency, loaded here).
   * Each executes with `call()`, passing the AI SDK's tool call id; its output is the
   * ToolCallResult, which the model reads as text (an error text when `isError`).
   */
  async aiSdk(): Promise<ToolSet> {
    const { jsonSchema, tool } = await import("ai").catch((err: unknown) => {
      throw new Error("LeadTools.aiSdk() needs the `ai` package (version 6): npm install ai@6", { cause: err });
    });
    const tools: ToolSet = {};
    for (const t of this.tools) {
      tools[t.name] = tool<Record<string, unknown>, ToolCallResult>({
        description: t.description,
        inputSchema: jsonSchema<Record<string, unknown>>(structuredClone(t.inputSchema) as Parameters<typeof jsonSchema>[0]),
        strict: true,
        execute: (input, { toolCallId, abortSignal }) => this.call(t.name, input, { toolCallId, signal: abortSignal }),
        toModelOutput: ({ output }) => ({ type: output.isError ? "error-text" : "text", value: output.text }),
      });
    }
    return tools;
  }

  /**
   * Calls a tool on the server: `args` as an object or as the JSON text a model produced.
   * A refusal, or a call the server finds malformed (an unknown tool or argument, a wrong type,
   * arguments that are not JSON), is answered with `isError: true` and the text saying why;
   * a failure to reach the server throws.
   */
  async call(name: string, args: Readonly<Record<string, unknown>> | string, options: CallToolOptions = {}): Promise<ToolCallResult> {
    let parsed: Record<string, unknown>;
    if (typeof args === "string") {
      try {
        parsed = JSON.parse(args === "" ? "{}" : args) as Record<string, unknown>;
      } catch (err) {
        return { text: `The arguments of ${name} are not valid JSON: ${(err as Error).message}`, isError: true };
      }
    } else {
      parsed = { ...args };
    }
    const toolCallId = options.toolCallId;
    let result;
    try {
      result = await this.client.callTool(
        {
          name,
          arguments: parsed,
          ...(toolCallId === undefined || toolCallId === "" ? {} : { _meta: { [TOOL_CALL_ID_META]: toolCallId } }),
        },
        undefined,
        {
          signal: options.signal,
          timeout: options.timeoutMs ?? this.timeoutMs,
          // A progress token: agent_await then reports progress, and each report restarts the timeout.
          onprogress: () => {},
          resetTimeoutOnProgress: true,
        },
      );
    } catch (err) {
      if (err instanceof McpError && err.code === ErrorCode.InvalidParams) {
        // The server's words, without the SDK's "MCP error -32602: ".
        return { text: `Error: ${err.message.replace(/^MCP error -?\d+: /, "")}`, isError: true };
      }
      throw err;
    }
    const content = Array.isArray(result.content) ? (result.content as Array<{ type: string; text?: unknown }>) : [];
    const text = content
      .filter((c) => c.type === "text" && typeof c.text === "string")
      .map((c) => c.text as string)
      .join("\n");
    const structured = result.structuredContent as Record<string, unknown> | undefined;
    return {
      text,
      isError: result.isError === true,
      ...(structured === undefined ? {} : { structuredContent: structured }),
    };
  }

  /** Ends the MCP session and closes the connection. */
  async close(): Promise<void> {
    try {
      // Best effort: a server that is gone has no session left to end.
      await this.transport.terminateSession().catch(() => {});
    } finally {
      await this.client.close();
    }
  }
}
