"""End to end: `subagentd.tools` (LeadTools, AsyncLeadTools) and
examples/raw_tools_lead.py against the real binary's `/mcp`.

The tools come from the server (tools/list), calls go back to it: these
tests check that what a model sees and reads is the server's, in the OpenAI
and Anthropic shapes, that a scripted model loop delegates and collects
through `call()`, that refusals reach the model as errors, that the model's
tool-call id makes agent_spawn idempotent, and that the token is sent.

Needs the `tools` extra (pinned in requirements-mcp.txt); without it these
tests are skipped unless SUBAGENTD_REQUIRE_MCP is set (CI sets it), except
the one that checks `import subagentd` does not need it.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest -v clients/python/tests/test_lead_tools_e2e.py
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import unittest
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_auth_e2e import new_key  # noqa: E402
from test_mcp_e2e import MCP_MISSING, REQUIRE_MCP, SPAWN_ARGS, TOOL_CALL_ID, UUID, FakeModel, await_args, spawn_args  # noqa: E402
from test_workers_e2e import EXAMPLES, ROOT, TIMEOUT, Server  # noqa: E402

from subagentd import Client, errors  # noqa: E402
from subagentd.types import AgentStatus  # noqa: E402

if not MCP_MISSING:
    from subagentd.tools import AsyncLeadTools, LeadTools, ToolResult

REPO = Path(os.environ.get("SUBAGENTD_REPO", str(ROOT)))
EXAMPLE = EXAMPLES / "raw_tools_lead.py"


def catalogue() -> "list[str]":
    """The tool names of mcp/tools.json, in its order."""
    return [t["name"] for t in json.loads((REPO / "mcp" / "tools.json").read_text())["tools"]]


class LeadToolsCase(unittest.TestCase):
    def setUp(self):
        if MCP_MISSING:
            if REQUIRE_MCP:
                self.fail(MCP_MISSING + " (SUBAGENTD_REQUIRE_MCP is set)")
            self.skipTest(MCP_MISSING + " (set SUBAGENTD_REQUIRE_MCP=1 to make this a failure)")

    def server(self, **kwargs) -> Server:
        server = Server(**kwargs)
        self.addCleanup(server.stop)
        self.assertIsNotNone(server.http, f"no http= in the listening line: {server.seen}")
        return server

    def tools(self, server: Server, token=None, lead_id=None) -> "LeadTools":
        tools = LeadTools(f"http://{server.http}/mcp", token=token, lead_id=lead_id)
        self.addCleanup(tools.close)
        return tools

    def lead_agents(self, server: Server, lead: str) -> list:
        with Client(server.addr) as client:
            return list(client.list(lead_id=lead))


class Listing(LeadToolsCase):
    def test_the_tools_are_the_servers_in_catalogue_order_with_its_agent_types(self):
        names = catalogue()
        # The default test config: three types, approvals by people (no agent_approve).
        tools = self.tools(self.server(), lead_id="listing")
        self.assertEqual([t.name for t in tools.tools], [n for n in names if n != "agent_approve"])
        self.assertEqual(tools.agent_types, ["coder", "planner", "simulated"])
        spawn = tools.tools[0]
        self.assertEqual(spawn.input_schema["properties"]["agent"]["enum"], ["coder", "planner", "simulated", None])
        self.assertEqual(spawn.input_schema["required"], SPAWN_ARGS)

        # Another config, another listing: its types, and agent_approve with approvals = "lead".
        other = self.server(config='[mcp]\napprovals = "lead"\n\n[agents.alpha]\nrunner = "simulated"\n\n[agents.beta]\nrunner = "simulated"\n')
        tools = self.tools(other)
        self.assertEqual([t.name for t in tools.tools], names)
        self.assertEqual(tools.agent_types, ["alpha", "beta"])
        self.assertIn("- alpha\n- beta", tools.tools[0].description)

    def test_openai_and_anthropic_shapes(self):
        tools = self.tools(self.server())
        listed = tools.tools
        openai = tools.openai()
        self.assertEqual(len(openai), len(listed))
        for tool, entry in zip(listed, openai):
            self.assertEqual(set(entry), {"type", "function"})
            self.assertEqual(entry["type"], "function")
            self.assertEqual(
                entry["function"],
                {"name": tool.name, "description": tool.description, "parameters": tool.input_schema, "strict": True},
            )
            # Strict mode: every property required, nothing else allowed.
            params = entry["function"]["parameters"]
            self.assertEqual(params["type"], "object")
            self.assertIs(params["additionalProperties"], False)
            self.assertEqual(sorted(params["required"]), sorted(params["properties"]))
            self.assertTrue(tool.description)
        anthropic = tools.anthropic()
        self.assertEqual(
            anthropic,
            [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in listed],
        )
        # Copies: a caller's edit does not change the next listing.
        openai[0]["function"]["parameters"]["properties"].clear()
        anthropic[0]["input_schema"]["required"].clear()
        self.assertEqual(tools.openai()[0]["function"]["parameters"]["required"], SPAWN_ARGS)
        self.assertEqual(tools.anthropic()[0]["input_schema"]["required"], SPAWN_ARGS)


class ScriptedModel:
    """A fake model's turns: each a list of (tool call id, name, JSON arguments)."""

    def __init__(self, turns):
        self.turns = list(turns)

    def __call__(self, messages, tools):
        turn = self.turns.pop(0)
        if callable(turn):
            turn = turn(messages)
        calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for i, n, a in turn]
        return {"role": "assistant", "content": None, "tool_calls": calls}


class Calls(LeadToolsCase):
    def test_a_scripted_model_loop_spawns_and_collects_through_call(self):
        server = self.server()
        lead = "raw-loop"
        tools = self.tools(server, lead_id=lead)
        model = ScriptedModel([
            [("call_a", "agent_spawn", spawn_args("output first")), ("call_b", "agent_spawn", spawn_args("output second"))],
            [("call_wait", "agent_await", await_args(TIMEOUT, mode="all"))],
        ])
        messages = [{"role": "user", "content": "two things"}]
        results = {}
        while model.turns:
            reply = model(messages, tools.openai())
            messages.append(reply)
            for call in reply["tool_calls"]:
                # The model's arguments as it sends them: a JSON string.
                result = tools.call(call["function"]["name"], call["function"]["arguments"], tool_call_id=call["id"])
                self.assertIsInstance(result, ToolResult)
                results[call["id"]] = result
                messages.append(result.openai_message())

        ids = {}
        for call_id in ("call_a", "call_b"):
            spawned = results[call_id]
            self.assertFalse(spawned.is_error, spawned.text)
            ids[call_id] = spawned.structured["id"]
            self.assertRegex(ids[call_id], f"^{UUID}$")
            self.assertIn(f"id: {ids[call_id]}", spawned.text)
            self.assertEqual(messages[[m.get("tool_call_id") for m in messages].index(call_id)],
                             {"role": "tool", "tool_call_id": call_id, "content": spawned.text})
        awaited = results["call_wait"]
        self.assertFalse(awaited.is_error, awaited.text)
        self.assertNotIn("timed out", awaited.text)
        for call_id, word in (("call_a", "first"), ("call_b", "second")):
            self.assertRegex(awaited.text, rf"(^|\n)## {ids[call_id]} \[done\] \(simulated[^\n]*\)\n{word}(\n|$)")
        self.assertEqual(awaited.anthropic_block(),
                         {"type": "tool_result", "tool_use_id": "call_wait", "content": awaited.text, "is_error": False})

        # The server agrees: the lead (the header) has those two agents, done and collected.
        agents = {a.id: a for a in self.lead_agents(server, lead)}
        self.assertEqual(sorted(agents), sorted(ids.values()))
        for call_id, word in (("call_a", "first"), ("call_b", "second")):
            agent = agents[ids[call_id]]
            self.assertEqual((agent.status, agent.result), (AgentStatus.DONE, word))
            self.assertIsNotNone(agent.collected_time)

    def test_refusals_and_malformed_calls_are_errors_with_the_servers_text(self):
        server = self.server(max_background=1)
        tools = self.tools(server, lead_id="refused")
        unknown = tools.call("agent_spawn", {**spawn_args("output x"), "agent": "nope"}, tool_call_id="c0")
        self.assertTrue(unknown.is_error)
        self.assertEqual(
            unknown.text, 'Refused (UNKNOWN_AGENT_TYPE): there is no agent type "nope". Known types: coder,planner,simulated.'
        )
        self.assertEqual(unknown.openai_message(), {"role": "tool", "tool_call_id": "c0", "content": unknown.text})
        self.assertTrue(unknown.anthropic_block()["is_error"])

        running = tools.call("agent_spawn", spawn_args("wait_steer\noutput later"))
        self.assertFalse(running.is_error, running.text)
        self.assertEqual(running.structured["status"], "running")
        full = tools.call("agent_spawn", spawn_args("output too many"))
        self.assertTrue(full.is_error, full.text)
        self.assertTrue(full.text.startswith("Refused (GLOBAL_LIMIT_REACHED): 1 of 1 background agents are live"), full.text)

        # Malformed calls: the model reads why (the server's words where it answered).
        bad_json = tools.call("agent_spawn", '{"prompt": ')
        self.assertTrue(bad_json.is_error)
        self.assertIn("not valid JSON", bad_json.text)
        not_object = tools.call("agent_status", "[1]")
        self.assertTrue(not_object.is_error)
        self.assertIn("must be a JSON object", not_object.text)
        extra = tools.call("agent_status", {"ids": None, "limit": None, "bogus": 1})
        self.assertTrue(extra.is_error)
        self.assertIn('unknown argument "bogus"', extra.text)
        no_tool = tools.call("agent_nope", {})
        self.assertTrue(no_tool.is_error)
        self.assertIn('no tool named "agent_nope"', no_tool.text)
        # Nothing of these started an agent.
        self.assertEqual([a.id for a in self.lead_agents(server, "refused")], [running.structured["id"]])

    def test_the_same_tool_call_id_spawns_once(self):
        server = self.server()
        tools = self.tools(server, lead_id="retried")
        args = json.dumps(spawn_args("wait_steer\noutput once"))
        first = tools.call("agent_spawn", args, tool_call_id="call_retry")
        again = tools.call("agent_spawn", args, tool_call_id="call_retry")
        self.assertFalse(first.is_error, first.text)
        self.assertEqual(again.structured["id"], first.structured["id"], again.text)
        # Another id (or none) is another call: another agent.
        other = tools.call("agent_spawn", args, tool_call_id="call_other")
        self.assertNotEqual(other.structured["id"], first.structured["id"])
        self.assertEqual(
            sorted(a.id for a in self.lead_agents(server, "retried")), sorted({first.structured["id"], other.structured["id"]})
        )
        self.assertEqual(TOOL_CALL_ID, "subagentd/toolCallId")

    def test_async_lead_tools(self):
        server = self.server()

        async def main():
            async with AsyncLeadTools(f"http://{server.http}", lead_id="async-lead") as tools:
                self.assertEqual(tools.url, f"http://{server.http}/mcp")
                self.assertEqual([t["name"] for t in tools.anthropic()], [t.name for t in tools.tools])
                self.assertEqual((await tools.refresh())[0].name, "agent_spawn")
                return await tools.call("agent_spawn", spawn_args("output async", wait_seconds=10), tool_call_id="a1")

        result = asyncio.run(main())
        self.assertFalse(result.is_error, result.text)
        self.assertEqual((result.structured["status"], result.structured["result"]), ("done", "async"))
        self.assertEqual([a.id for a in self.lead_agents(server, "async-lead")], [result.structured["id"]])


class Auth(LeadToolsCase):
    def test_the_bearer_token_is_sent(self):
        key, entry = new_key("lead", "team-a", "frontend")
        server = self.server(config='[agents.simulated]\nrunner = "simulated"\n\n[auth]\nmode = "required"\n' + entry)
        url = f"http://{server.http}/mcp"
        with mock.patch.dict(os.environ, {"SUBAGENTD_TOKEN": ""}):
            with self.assertRaises(errors.Unauthenticated) as caught:
                LeadTools(url)
        self.assertIn("needs a credential", caught.exception.message)
        with self.assertRaises(errors.Unauthenticated) as caught:
            LeadTools(url, token="sa_wrong_key")

        # The token by argument, and from SUBAGENTD_TOKEN; without a lead id the key's principal is the lead.
        with mock.patch.dict(os.environ, {"SUBAGENTD_TOKEN": key}):
            from_env = self.tools(server)
        for tools in (self.tools(server, token=key), from_env):
            self.assertEqual(tools.agent_types, ["simulated"])
        spawned = from_env.call("agent_spawn", spawn_args("output keyed", wait_seconds=10))
        self.assertFalse(spawned.is_error, spawned.text)
        with Client(server.addr, token=key) as client:
            agents = list(client.list(lead_id="key:lead"))
        self.assertEqual([(a.id, a.result, a.tenant) for a in agents], [(spawned.structured["id"], "keyed", "team-a")])


class Example(LeadToolsCase):
    """examples/raw_tools_lead.py as its own process."""

    def run_example(self, server: Server, *args: str, env=None) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-W", "error::ResourceWarning", str(EXAMPLE), "--url", f"http://{server.http}/mcp", *args],
            capture_output=True, text=True, timeout=TIMEOUT * 2, cwd=ROOT, env=env,
        )
        self.assertEqual(done.returncode, 0, f"\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}")
        return done

    def test_the_example_with_its_scripted_model(self):
        server = self.server()
        done = self.run_example(
            server, "--fake", "--lead-id", "raw-fake", "--agent", "simulated", "--sub-model", "acme/small",
            "output one\noutput two\noutput three",
        )
        self.assertEqual(done.stderr.strip(), "lead raw-fake")
        agents = {a.result: a for a in self.lead_agents(server, "raw-fake")}
        self.assertEqual(sorted(agents), ["one", "three", "two"])
        answer = done.stdout
        self.assertTrue(answer.startswith("RESULTS: "), answer)
        for word, agent in agents.items():
            self.assertEqual(agent.status, AgentStatus.DONE)
            self.assertIn(f"## {agent.id} [done] (simulated", answer)
            self.assertRegex(answer, rf"{agent.id} \[done\][^\n]*\n{word}\n")

    def test_the_example_against_a_chat_completions_endpoint(self):
        """The OpenAI-compatible fake model of test_mcp_e2e over loopback: what
        the example sends is what an endpoint gets."""
        server = self.server()
        fake = FakeModel()
        self.addCleanup(fake.stop)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env.update(NO_PROXY="127.0.0.1,localhost", OPENAI_API_KEY="test")
        done = self.run_example(server, "--base-url", fake.base_url, "--model", "fake-lead", "--lead-id", "raw-http", "Say the words.")
        report = f"\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}\nfake model errors: {fake.errors}"
        self.assertEqual(fake.errors, [], report)
        self.assertEqual(len(fake.requests), 3, report)
        with LeadTools(f"http://{server.http}/mcp") as tools:
            expected = tools.openai()
        for request in fake.requests:
            self.assertEqual(request["model"], "fake-lead")
            self.assertEqual(request["tools"], expected)
        awaited = FakeModel.tool_results(fake.requests[2])["call_await"]
        agents = {a.result: a for a in self.lead_agents(server, "raw-http")}
        self.assertEqual(sorted(agents), sorted(FakeModel.WORDS), report)
        for word, agent in agents.items():
            self.assertEqual(agent.status, AgentStatus.DONE)
            self.assertRegex(awaited, rf"## {agent.id} \[done\] \(simulated[^\n]*\)\n{word}\n?")
            self.assertEqual(re.findall(agent.id, awaited), [agent.id])
        self.assertIn("RESULTS: " + awaited, done.stdout, report)


class WithoutTheExtra(unittest.TestCase):
    """`import subagentd` without the MCP SDK; `subagentd.tools` names the extra."""

    def test_importing_subagentd_needs_no_mcp(self):
        script = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mcp", "mcp_types", "httpx2"):
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
import subagentd
assert not [m for m in sys.modules if m.split(".")[0] in ("mcp", "httpx2", "anyio")], sorted(sys.modules)
try:
    import subagentd.tools
except ImportError as e:
    print(e)
else:
    raise SystemExit("subagentd.tools imported without mcp")
"""
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("pip install 'subagentd[tools]'", done.stdout)


if __name__ == "__main__":
    unittest.main()
