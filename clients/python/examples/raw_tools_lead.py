"""A lead agent in your own model loop: subagentd's lead tools (read from
the server's /mcp) as OpenAI chat-completions tools, each tool call
dispatched back to /mcp with `LeadTools.call`.

    pip install 'subagentd[tools]'
    OPENAI_API_KEY=... python examples/raw_tools_lead.py --url http://127.0.0.1:50080/mcp "Review ..."

Any OpenAI-compatible endpoint works (`--base-url`, default OPENAI_BASE_URL).
`--fake` uses a scripted model instead (no network): one sub-agent per line
of the task, then agent_await, then an answer that quotes it. It prints the
answer; the sub-agents still running at the end are cancelled.
"""

import argparse
import json
import os
import sys
import urllib.request
import uuid
from typing import Any, Callable, Dict, List, Optional

from subagentd.tools import LeadTools

Message = Dict[str, Any]
Model = Callable[[List[Message], List[Dict[str, Any]]], Message]

INSTRUCTIONS = (
    "You lead sub-agents. Delegate each independent piece of the task with agent_spawn (it returns at once), "
    "then collect the results with agent_await (mode all), again until nothing runs. Answer from the results."
)


def openai_model(base_url: str, api_key: str, model: str) -> Model:
    """A chat-completions endpoint, over plain HTTP."""

    def chat(messages: List[Message], tools: List[Dict[str, Any]]) -> Message:
        body = json.dumps({"model": model, "messages": messages, "tools": tools}).encode()
        request = urllib.request.Request(
            base_url.rstrip("/") + "/chat/completions",
            data=body,
            headers={"content-type": "application/json", "authorization": f"Bearer {api_key}"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            message: Message = json.load(response)["choices"][0]["message"]
        return message

    return chat


def fake_model(agent: Optional[str], model: Optional[str]) -> Model:
    """Scripted: spawn one agent per line of the task, await them all, answer."""

    def call(call_id: str, name: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}

    def chat(messages: List[Message], tools: List[Dict[str, Any]]) -> Message:
        results = [m for m in messages if m["role"] == "tool"]
        if not results:
            task = [m["content"] for m in messages if m["role"] == "user"][0]
            spawns = [
                call(f"call_{n}", "agent_spawn", {"prompt": line, "agent": agent, "description": None, "model": model,
                                        "wait_seconds": None, "timeout_minutes": None, "continue_from": None, "fork": None})
                for n, line in enumerate(task.splitlines())
            ]
            return {"role": "assistant", "content": None, "tool_calls": spawns}
        if messages[-1]["tool_call_id"] != "call_await":
            wait = {"ids": None, "mode": "all", "timeout_seconds": 30}
            return {"role": "assistant", "content": None, "tool_calls": [call("call_await", "agent_await", wait)]}
        return {"role": "assistant", "content": "RESULTS: " + results[-1]["content"]}

    return chat


def lead(tools: LeadTools, model: Model, task: str, max_turns: int = 20) -> str:
    """The model loop: the model's tool calls go to subagentd until it answers."""
    messages: List[Message] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": task}]
    for _ in range(max_turns):
        message = model(messages, tools.openai())
        messages.append(message)
        if not message.get("tool_calls"):
            return str(message.get("content") or "")
        for call in message["tool_calls"]:
            result = tools.call(call["function"]["name"], call["function"]["arguments"], tool_call_id=call["id"])
            messages.append(result.openai_message())
    raise SystemExit(f"no answer in {max_turns} turns")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("task", nargs="?", default="Write a slogan for a bakery.\nWrite a slogan for a bookshop.")
    parser.add_argument("--url", default="http://127.0.0.1:50080/mcp", help="subagentd's MCP endpoint")
    parser.add_argument("--lead-id", default=None, help="the lead the sub-agents belong to (default: a new one)")
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "gpt-4.1"), help="the lead's model")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"))
    parser.add_argument("--fake", action="store_true", help="a scripted model (no network)")
    parser.add_argument("--agent", default=None, help="the scripted model's agent type (--fake)")
    parser.add_argument("--sub-model", default=None, help="the scripted model's sub-agent model (--fake)")
    args = parser.parse_args(argv)

    lead_id = args.lead_id or f"raw-tools-{uuid.uuid4()}"
    print(f"lead {lead_id}", file=sys.stderr)
    if args.fake:
        model = fake_model(args.agent, args.sub_model)
    else:
        model = openai_model(args.base_url, os.environ.get("OPENAI_API_KEY", ""), args.model)
    with LeadTools(args.url, lead_id=lead_id) as tools:  # SUBAGENTD_TOKEN
        try:
            print(lead(tools, model, args.task))
        finally:
            tools.call("agent_cancel", {"id": None, "all": True, "reason": "the lead ended"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
