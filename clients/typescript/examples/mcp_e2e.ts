// subagentd's MCP lead tools from the official MCP TypeScript SDK, over both
// transports: stdio (the SDK starts `subagentd mcp`, a client of the running
// server) and streamable HTTP (the server's own /mcp on its [http] listener).
// Over each: list the tools, spawn a `simulated` agent that waits for its
// result (wait_seconds), then collect the inbox once more (nothing is
// returned twice). Exits non-zero on any failed check.
//
//   subagentd serve &     # gRPC on 127.0.0.1:50051, /mcp on 127.0.0.1:50080
//   npm run build && node dist/examples/mcp_e2e.js --bin subagentd \
//       --addr 127.0.0.1:50051 --http 127.0.0.1:50080
//
// Prints one line per transport: `<transport> <lead> <agent id> <status> <result as JSON>`.

import { parseArgs } from "node:util";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";

const EXPECTED_TOOLS = ["agent_spawn", "agent_status", "agent_await", "agent_result", "agent_cancel", "agent_steer"];
// Guards against hangs only.
const REQUEST_TIMEOUT_MS = 30_000;

const failures: string[] = [];

function check(ok: boolean, what: string): void {
  if (!ok) {
    failures.push(what);
    process.stderr.write(`FAILED: ${what}\n`);
  }
}

interface SpawnResult {
  id: string;
  status: string;
  agent: string;
  model: string;
  result: string | null;
}

/** The text of a tool result's text content blocks. */
function textOf(result: Record<string, unknown>): string {
  const content = (Array.isArray(result.content) ? result.content : []) as Array<{ type: string; text?: string }>;
  return content
    .filter((c) => c.type === "text")
    .map((c) => c.text ?? "")
    .join("\n");
}

/** Lists the tools, spawns `output <word>` with wait_seconds 10, then awaits the inbox once. */
async function exercise(transportName: string, lead: string, transport: Transport): Promise<void> {
  const client = new Client({ name: "subagentd-mcp-e2e", version: "0.0.0" });
  await client.connect(transport, { timeout: REQUEST_TIMEOUT_MS });
  try {
    check(client.getServerVersion()?.name === "subagentd", `${transportName}: server name is subagentd`);
    check(
      (client.getInstructions() ?? "").includes("agent_await"),
      `${transportName}: the instructions mention agent_await`,
    );

    const tools = await client.listTools(undefined, { timeout: REQUEST_TIMEOUT_MS });
    const names = tools.tools.map((t) => t.name);
    check(
      JSON.stringify(names) === JSON.stringify(EXPECTED_TOOLS),
      `${transportName}: tools ${JSON.stringify(names)} are ${JSON.stringify(EXPECTED_TOOLS)}`,
    );
    const spawnTool = tools.tools.find((t) => t.name === "agent_spawn");
    check(
      JSON.stringify(spawnTool?.inputSchema.required ?? []) ===
        JSON.stringify(["prompt", "agent", "description", "model", "wait_seconds", "timeout_minutes", "continue_from", "fork"]),
      `${transportName}: agent_spawn requires every argument (strict mode)`,
    );

    const word = `ts-${transportName}`;
    const spawned = await client.callTool(
      {
        name: "agent_spawn",
        arguments: {
          prompt: `output ${word}`,
          agent: "simulated",
          description: `ts ${transportName}`,
          model: "acme/small",
          wait_seconds: 10,
          timeout_minutes: null,
          continue_from: null,
          fork: null,
        },
      },
      undefined,
      { timeout: REQUEST_TIMEOUT_MS },
    );
    check(spawned.isError !== true, `${transportName}: agent_spawn succeeded: ${textOf(spawned)}`);
    const agent = spawned.structuredContent as SpawnResult | undefined;
    check(agent !== undefined, `${transportName}: agent_spawn has structuredContent`);
    check(/^[0-9a-f-]{36}$/.test(agent?.id ?? ""), `${transportName}: agent id ${agent?.id} is a UUID`);
    check(agent?.status === "done", `${transportName}: status ${agent?.status} is done`);
    check(agent?.result === word, `${transportName}: result ${JSON.stringify(agent?.result)} is ${JSON.stringify(word)}`);
    check(agent?.agent === "simulated" && agent?.model === "acme/small", `${transportName}: agent type and model`);
    check(textOf(spawned).includes(`id: ${agent?.id}`), `${transportName}: the text content names the id`);

    // The result came back with the spawn: is it in the inbox again?
    const awaited = await client.callTool(
      { name: "agent_await", arguments: { ids: null, mode: "all", timeout_seconds: 0 } },
      undefined,
      { timeout: REQUEST_TIMEOUT_MS },
    );
    const awaitText = textOf(awaited);
    check(awaited.isError !== true, `${transportName}: agent_await succeeded: ${awaitText}`);
    check(
      !awaitText.includes(agent?.id ?? "(no id)"),
      `${transportName}: agent_await does not return the spawn's result again: ${JSON.stringify(awaitText)}`,
    );

    process.stdout.write(
      `${transportName} ${lead} ${agent?.id} ${agent?.status} ${JSON.stringify(agent?.result)}\n`,
    );
  } finally {
    await client.close();
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      bin: { type: "string", default: "subagentd" },
      addr: { type: "string", default: "127.0.0.1:50051" },
      http: { type: "string", default: "127.0.0.1:50080" },
      "lead-id": { type: "string", default: "ts-mcp" },
    },
  });
  const lead = values["lead-id"]!;

  await exercise(
    "stdio",
    lead,
    new StdioClientTransport({
      command: values.bin!,
      args: ["mcp", "--addr", `http://${values.addr}`, "--lead-id", lead],
      stderr: "inherit",
    }),
  );

  const httpLead = `${lead}-http`;
  await exercise(
    "http",
    httpLead,
    new StreamableHTTPClientTransport(new URL(`http://${values.http}/mcp`), {
      requestInit: { headers: { "subagentd-lead-id": httpLead } },
    }),
  );

  if (failures.length > 0) {
    process.stderr.write(`${failures.length} check(s) failed\n`);
    process.exitCode = 1;
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`mcp_e2e: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
