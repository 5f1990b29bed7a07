"""A lead agent built on the OpenAI Agents SDK, with subagentd as its MCP
server: the model delegates pieces of its task to sub-agents with
`agent_spawn` (they run in the background, under subagentd's limits) and
collects their results with `agent_await`.

The SDK starts `subagentd mcp` as a stdio MCP server, a client of a running
subagentd server. Requirements (exact versions: requirements-mcp.txt):

    pip install openai-agents

Run it against a server and any OpenAI-compatible chat completions endpoint
(OPENAI_API_KEY, and OPENAI_BASE_URL for one other than OpenAI's):

    subagentd serve &
    OPENAI_API_KEY=... python examples/openai_agents_lead.py \\
        --addr 127.0.0.1:50051 --model gpt-4.1 "Review the three modules of ..."

It prints the lead's final answer. With --agent and --sub-model the lead is
told which agent type and model its sub-agents use (otherwise it passes null
and the server's defaults apply). The sub-agents the lead left running when
it ends are cancelled (`subagentd mcp --cancel-on-exit`).
"""

import argparse
import asyncio
import json
import os
import shutil
import sys
import uuid
from typing import Any

from agents import Agent, Runner, set_default_openai_api, set_tracing_disabled
from agents.mcp import MCPServerStdio
from agents.mcp.util import MCPToolMetaContext

INSTRUCTIONS = """\
You lead a team of sub-agents that subagentd runs for you. Split the task into
independent pieces and delegate each one with agent_spawn: one call per piece,
with a complete, self-contained prompt (a sub-agent does not see this
conversation). agent_spawn returns at once with the agent's id; start every
piece before you wait for any. Then call agent_await with mode "all" to collect
the results; a timed-out agent_await is a normal answer: call it again until
nothing is running. Never poll agent_status. Finally answer the task from the
results you collected.
"""

# agent_await waits up to the server's [mcp] max_await (50 s by default):
# the MCP session's read timeout must be longer.
MCP_TIMEOUT_SECONDS = 70.0


def tool_call_meta(context: MCPToolMetaContext) -> "dict[str, Any] | None":
    """`_meta` of each MCP tool call: the model's tool call id makes
    agent_spawn idempotent, so a retried call starts no second agent."""
    call_id = getattr(context.run_context, "tool_call_id", None)
    return {"subagentd/toolCallId": call_id} if call_id else None


def parse_args(argv: "list[str] | None") -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("task", nargs="?", default="Write three one-line slogans for a bakery, each by a different sub-agent.")
    parser.add_argument("--addr", default=os.environ.get("SUBAGENTD_ADDR", "127.0.0.1:50051"),
                        help="the subagentd server's gRPC address")
    parser.add_argument("--subagentd", default=os.environ.get("SUBAGENTD_BIN") or shutil.which("subagentd") or "subagentd",
                        help="the subagentd binary (default: SUBAGENTD_BIN, else subagentd on PATH)")
    parser.add_argument("--lead-id", default=None, help="the lead the sub-agents belong to (default: a new one)")
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "gpt-4.1"), help="the lead's model")
    parser.add_argument("--agent", default=None, help="the agent type to tell the lead to use")
    parser.add_argument("--sub-model", default=None, help='the model ("provider/model") to tell the lead to use')
    return parser.parse_args(argv)


async def main(argv: "list[str] | None" = None) -> int:
    args = parse_args(argv)
    # Chat completions: what every OpenAI-compatible endpoint serves.
    set_default_openai_api("chat_completions")
    # Traces would go to OpenAI's platform, with OPENAI_API_KEY.
    set_tracing_disabled(True)

    lead_id = args.lead_id or f"agents-sdk-{uuid.uuid4()}"
    print(f"lead {lead_id}", file=sys.stderr)
    instructions = INSTRUCTIONS
    if args.agent or args.sub_model:
        instructions += (
            f"\nIn every agent_spawn pass agent {json.dumps(args.agent)} and model {json.dumps(args.sub_model)}.\n"
        )

    # `subagentd mcp` reads SUBAGENTD_TOKEN and the TLS variables itself;
    # the SDK passes only a few safe variables on unless told.
    env = {k: v for k, v in os.environ.items() if k.startswith("SUBAGENTD_")}
    async with MCPServerStdio(
        name="subagentd",
        params={
            "command": args.subagentd,
            "args": ["mcp", "--addr", args.addr, "--lead-id", lead_id, "--cancel-on-exit"],
            "env": env,
        },
        cache_tools_list=True,
        client_session_timeout_seconds=MCP_TIMEOUT_SECONDS,
        tool_meta_resolver=tool_call_meta,
    ) as subagentd:
        lead = Agent(
            name="lead",
            instructions=instructions,
            model=args.model,
            mcp_servers=[subagentd],
            # The tools' schemas are written for strict mode (every argument
            # required, nullable where optional).
            mcp_config={"convert_schemas_to_strict": True},
        )
        result = await Runner.run(lead, args.task, max_turns=20)
    print(result.final_output)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
