"""End to end: subagentd's MCP lead tools from the official MCP clients,
against the real binary.

- The MCP Python SDK (`mcp`) over stdio (`subagentd mcp`, a client of the
  server) and over streamable HTTP (the server's `/mcp`).
- examples/openai_agents_lead.py, the OpenAI Agents SDK with subagentd as its
  MCP server, against a scripted OpenAI-compatible model served by this test
  on loopback (no real network).
- clients/typescript/examples/mcp_e2e.ts, the MCP TypeScript SDK over both
  transports (skipped without clients/typescript/node_modules unless
  SUBAGENTD_REQUIRE_TS is set; .ci/clients-e2e.sh sets it).

The Python packages are pinned in requirements-mcp.txt; without them these
tests are skipped unless SUBAGENTD_REQUIRE_MCP is set (.ci/run sets it).

    pip install -r clients/python/requirements-ci.txt -r clients/python/requirements-mcp.txt
    SUBAGENTD_BIN=target/debug/subagentd python -m unittest -v clients/python/tests/test_mcp_e2e.py
"""

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_examples_e2e import REQUIRE_TS, TS_DIR, _build_typescript  # noqa: E402
from test_workers_e2e import BIN, EXAMPLES, ROOT, TIMEOUT, Server  # noqa: E402

from subagents.v1 import subagents_pb2 as pb  # noqa: E402

try:
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    import httpx2  # the MCP SDK's HTTP client

    MCP_MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    MCP_MISSING = f"the MCP Python SDK is not installed ({e}): pip install -r clients/python/requirements-mcp.txt"
REQUIRE_MCP = bool(os.environ.get("SUBAGENTD_REQUIRE_MCP"))

AGENTS_EXAMPLE = EXAMPLES / "openai_agents_lead.py"
TS_MCP = TS_DIR / "dist" / "examples" / "mcp_e2e.js"

# tools/list without [mcp] approvals = "lead" (no agent_approve), in catalogue order.
TOOLS = ["agent_spawn", "agent_status", "agent_await", "agent_result", "agent_cancel", "agent_steer"]
SPAWN_ARGS = ["prompt", "agent", "description", "model", "wait_seconds", "timeout_minutes", "continue_from", "fork"]
TOOL_CALL_ID = "subagentd/toolCallId"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"


def spawn_args(prompt: str, wait_seconds: "int | None" = None) -> dict:
    """agent_spawn's arguments: every one given, null where not used (strict mode)."""
    return {
        "prompt": prompt,
        "agent": "simulated",
        "description": None,
        "model": "acme/small",
        "wait_seconds": wait_seconds,
        "timeout_minutes": None,
        "continue_from": None,
        "fork": None,
    }


def await_args(timeout_seconds: float, mode: "str | None" = None) -> dict:
    return {"ids": None, "mode": mode, "timeout_seconds": timeout_seconds}


def text(result) -> str:
    """The text content of a CallToolResult."""
    return "\n".join(block.text for block in result.content if block.type == "text")


class McpTestCase(unittest.TestCase):
    """Each test on a fresh server (test_workers_e2e's config: the `simulated` type)."""

    def setUp(self):
        self.check_requirements()
        self.server = Server()
        self.addCleanup(self.server.stop)
        self.assertIsNotNone(self.server.http, f"no http= in the listening line: {self.server.seen}")

    def check_requirements(self) -> None:
        """Skips (or with SUBAGENTD_REQUIRE_MCP, fails) without the MCP Python SDK."""
        if MCP_MISSING:
            if REQUIRE_MCP:
                self.fail(MCP_MISSING + " (SUBAGENTD_REQUIRE_MCP is set)")
            self.skipTest(MCP_MISSING + " (set SUBAGENTD_REQUIRE_MCP=1 to make this a failure)")

    def lead_agents(self, lead: str) -> "list[pb.Agent]":
        return list(self.server.agents.Status(pb.StatusRequest(lead_id=lead), timeout=TIMEOUT).agents)


class PythonSdk(McpTestCase):
    """The MCP Python SDK's Client over both transports."""

    def run_async(self, coroutine):
        return asyncio.run(coroutine)

    def test_stdio_spawn_await_steer_and_each_result_once(self):
        self.run_async(self.stdio())

    async def stdio(self):
        lead = "py-mcp"
        params = StdioServerParameters(command=BIN, args=["mcp", "--addr", f"http://{self.server.addr}", "--lead-id", lead])
        # legacy: the initialize handshake, as hosts built on older SDKs do.
        async with Client(params, mode="legacy", read_timeout_seconds=TIMEOUT + 10) as client:
            self.assertEqual(client.server_info.name, "subagentd")
            self.assertIn("agent_spawn", client.instructions)
            self.assertIsNotNone(client.server_capabilities.tools)
            tools = (await client.list_tools()).tools
            self.assertEqual([t.name for t in tools], TOOLS)
            self.assertEqual(tools[0].input_schema["required"], SPAWN_ARGS)
            self.assertFalse(tools[0].input_schema["additionalProperties"])

            # In the background: it returns at once, running.
            spawned = await client.call_tool("agent_spawn", spawn_args("wait_steer\noutput hi"), meta={TOOL_CALL_ID: "py-call-1"})
            self.assertFalse(spawned.is_error, text(spawned))
            agent = spawned.structured_content
            self.assertRegex(agent["id"], f"^{UUID}$")
            self.assertEqual(
                {k: agent[k] for k in ("status", "agent", "model", "result", "error")},
                {"status": "running", "agent": "simulated", "model": "acme/small", "result": None, "error": None},
            )
            agent_id = agent["id"]
            # The same tool call again (a host's retry): the same agent, no second one.
            again = await client.call_tool("agent_spawn", spawn_args("wait_steer\noutput hi"), meta={TOOL_CALL_ID: "py-call-1"})
            self.assertEqual(again.structured_content["id"], agent_id, text(again))

            waiting = text(await client.call_tool("agent_await", await_args(0.3)))
            self.assertIn("timed out", waiting)
            self.assertIn("Still running (1):", waiting)
            self.assertIn(f"- {agent_id} [running]", waiting)

            steered = self.server.agents.Steer(pb.SteerRequest(id=agent_id, message="go on"), timeout=TIMEOUT)
            self.assertEqual(steered.delivery, pb.STEER_DELIVERY_DELIVERED)

            done = text(await client.call_tool("agent_await", await_args(TIMEOUT)))
            self.assertNotIn("timed out", done)
            self.assertTrue(done.startswith(f"## {agent_id} [done] (simulated"), done)
            self.assertEqual(done.splitlines()[1:], ["steer: go on", "hi"], done)

            # Returned once: the inbox has nothing more.
            after = text(await client.call_tool("agent_await", await_args(0.3)))
            self.assertIn("timed out", after)
            self.assertNotIn(agent_id, after)
            self.assertNotIn("hi", after.split())

        agents = self.lead_agents(lead)
        self.assertEqual([a.id for a in agents], [agent_id])
        self.assertEqual(agents[0].status, pb.AGENT_STATUS_DONE)
        self.assertEqual(agents[0].result, "steer: go on\nhi")
        self.assertTrue(agents[0].HasField("collected_time"), "agent_await collected it")

    def test_streamable_http_spawn_with_wait_and_the_lead_header(self):
        self.run_async(self.http())

    async def http(self):
        url = f"http://{self.server.http}/mcp"
        # auto: the SDK's default (a server/discover probe, else initialize); legacy: initialize and a
        # session (Mcp-Session-Id), ended with a DELETE, which the server answers 202 Accepted: the SDK
        # logs "Session termination failed: 202" (it expects 200 or 204), harmlessly.
        for mode in ("auto", "legacy"):
            lead = f"py-mcp-http-{mode}"
            with self.subTest(mode=mode):
                async with httpx2.AsyncClient(headers={"subagentd-lead-id": lead}, timeout=TIMEOUT) as http:
                    async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                        self.assertEqual(client.server_info.name, "subagentd")
                        self.assertEqual([t.name for t in (await client.list_tools()).tools], TOOLS)
                        spawned = await client.call_tool("agent_spawn", spawn_args(f"output over http {mode}", wait_seconds=10))
                self.assertFalse(spawned.is_error, text(spawned))
                agent = spawned.structured_content
                self.assertEqual(
                    {k: agent[k] for k in ("status", "result", "agent", "model", "error")},
                    {"status": "done", "result": f"over http {mode}", "agent": "simulated", "model": "acme/small", "error": None},
                )
                self.assertIn(f"id: {agent['id']}", text(spawned))
                # The header named the lead.
                agents = self.lead_agents(lead)
                self.assertEqual([(a.id, a.status, a.result) for a in agents], [(agent["id"], pb.AGENT_STATUS_DONE, f"over http {mode}")])

        # Without the header (and without auth): the shared lead "mcp-http".
        async with Client(url) as client:
            spawned = await client.call_tool("agent_spawn", spawn_args("output shared", wait_seconds=10))
        self.assertEqual(spawned.structured_content["status"], "done", text(spawned))
        self.assertEqual([a.id for a in self.lead_agents("mcp-http")], [spawned.structured_content["id"]])


class FakeModel:
    """An OpenAI-compatible chat completions endpoint on loopback, scripted
    for the lead example: three agent_spawn calls, then agent_await (all),
    then a final answer that quotes what agent_await returned."""

    WORDS = ("alpha", "beta", "gamma")

    def __init__(self):
        self.requests: "list[dict]" = []
        self.errors: "list[str]" = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    if self.path != "/v1/chat/completions":
                        raise ValueError(f"unexpected POST {self.path}")
                    request = json.loads(body)
                    fake.requests.append(request)
                    answer = fake.answer(request)
                    status = 200
                except Exception as e:  # noqa: BLE001 - reported to the test
                    fake.errors.append(repr(e))
                    answer, status = {"error": {"message": repr(e), "type": "fake_model"}}, 500
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.errors.append(f"unexpected GET {self.path}")
                self.send_error(404)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=TIMEOUT)

    @staticmethod
    def tool_results(request: dict) -> "dict[str, str]":
        """The tool messages of a request, by tool call id."""
        out = {}
        for message in request["messages"]:
            if message.get("role") == "tool":
                content = message["content"]
                if isinstance(content, list):
                    content = "".join(part.get("text", "") for part in content)
                out[message["tool_call_id"]] = content
        return out

    def answer(self, request: dict) -> dict:
        results = self.tool_results(request)
        if not results:
            calls = [
                (f"call_spawn_{word}", "agent_spawn", {**spawn_args(f"output {word}")})
                for word in self.WORDS
            ]
            return self.completion(request, tool_calls=calls)
        if "call_await" not in results:
            return self.completion(request, tool_calls=[("call_await", "agent_await", await_args(20, mode="all"))])
        return self.completion(request, content="RESULTS: " + results["call_await"])

    @staticmethod
    def completion(request: dict, content: "str | None" = None, tool_calls=()) -> dict:
        message = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for call_id, name, args in tool_calls
            ]
        return {
            "id": f"chatcmpl-{len(request['messages'])}",
            "object": "chat.completion",
            "created": 0,
            "model": request["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }


class OpenAIAgentsExample(McpTestCase):
    def test_the_lead_delegates_with_agent_spawn_and_collects_with_agent_await(self):
        try:
            import agents  # noqa: F401
        except ImportError as e:
            message = f"openai-agents is not installed ({e}): pip install -r clients/python/requirements-mcp.txt"
            if REQUIRE_MCP:
                self.fail(message)
            self.skipTest(message)
        fake = FakeModel()
        self.addCleanup(fake.stop)
        lead = "agents-sdk-lead"
        # No real network: the model is the fake one, with a fake key, and no traces are exported.
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env.update(
            OPENAI_API_KEY="test",
            OPENAI_BASE_URL=fake.base_url,
            OPENAI_AGENTS_DISABLE_TRACING="1",
            NO_PROXY="127.0.0.1,localhost",
        )
        done = subprocess.run(
            [
                sys.executable, "-W", "error::ResourceWarning", str(AGENTS_EXAMPLE),
                "--addr", self.server.addr, "--subagentd", BIN, "--lead-id", lead, "--model", "fake-lead",
                "--agent", "simulated", "--sub-model", "acme/small",
                "Say alpha, beta and gamma, each by its own sub-agent.",
            ],
            capture_output=True, text=True, timeout=TIMEOUT * 2, cwd=ROOT, env=env,
        )
        report = f"\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}\nfake model errors: {fake.errors}"
        self.assertEqual(done.returncode, 0, report)
        self.assertEqual(fake.errors, [], report)
        self.assertEqual(done.stderr.strip(), f"lead {lead}", report)

        # Three model calls: the spawns, the await, the answer.
        self.assertEqual(len(fake.requests), 3, report)
        self.assertEqual({r["model"] for r in fake.requests}, {"fake-lead"})
        first = fake.requests[0]
        tools = {t["function"]["name"]: t["function"] for t in first.get("tools", [])}
        self.assertEqual(sorted(tools), sorted(TOOLS), report)
        # Strict mode as the SDK sends it: every argument required (in its order), no others.
        self.assertTrue(tools["agent_spawn"].get("strict"), tools["agent_spawn"])
        self.assertEqual(sorted(tools["agent_spawn"]["parameters"]["required"]), sorted(SPAWN_ARGS))
        self.assertIn("agent_spawn", first["messages"][0]["content"], "the instructions are the system message")

        # The three spawns' results reached the model, each naming its agent.
        spawned = FakeModel.tool_results(fake.requests[1])
        self.assertEqual(sorted(spawned), [f"call_spawn_{w}" for w in sorted(FakeModel.WORDS)], report)
        ids = {}
        for word in FakeModel.WORDS:
            content = spawned[f"call_spawn_{word}"]
            self.assertIn("agent: simulated", content)
            self.assertIn("model: acme/small", content)
            ids[word] = re.search(rf"^id: ({UUID})$", content, re.M).group(1)
        self.assertEqual(len(set(ids.values())), 3)

        # agent_await (all) returned every result, once each.
        awaited = FakeModel.tool_results(fake.requests[2])["call_await"]
        for word, agent_id in ids.items():
            self.assertEqual(awaited.count(agent_id), 1, awaited)
            self.assertRegex(awaited, rf"## {agent_id} \[done\] \(simulated[^\n]*\)\n{word}\n?")

        # The example printed the answer, which quotes agent_await.
        self.assertIn("RESULTS: ", done.stdout, report)
        final = done.stdout[done.stdout.index("RESULTS: "):]
        for word in FakeModel.WORDS:
            self.assertIn(word, final, report)
        self.assertIn(awaited.strip(), final, report)

        # The server agrees: the lead's three agents, done, with those results.
        agents = {a.id: a for a in self.lead_agents(lead)}
        self.assertEqual(sorted(agents), sorted(ids.values()))
        for word, agent_id in ids.items():
            self.assertEqual((agents[agent_id].status, agents[agent_id].result), (pb.AGENT_STATUS_DONE, word))


class TypeScriptSdk(McpTestCase):
    def check_requirements(self) -> None:
        """Needs clients/typescript/node_modules, not the Python SDK."""
        if not (TS_DIR / "node_modules").is_dir():
            message = "clients/typescript/node_modules is missing: run `npm ci --prefix clients/typescript`"
            if REQUIRE_TS:
                self.fail(message + " (SUBAGENTD_REQUIRE_TS is set)")
            self.skipTest(message + " (set SUBAGENTD_REQUIRE_TS=1 to make this a failure)")
        if shutil.which("node") is None:
            self.fail("node is not on PATH, but clients/typescript/node_modules exists")

    def test_typescript_mcp_client_over_stdio_and_streamable_http(self):
        _build_typescript(TS_MCP)
        done = subprocess.run(
            ["node", str(TS_MCP), "--bin", BIN, "--addr", self.server.addr, "--http", self.server.http, "--lead-id", "ts-mcp"],
            capture_output=True, text=True, timeout=TIMEOUT * 2, cwd=ROOT,
        )
        report = f"\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        self.assertEqual(done.returncode, 0, report)
        self.assertEqual(done.stderr.strip(), "", report)
        lines = [line.split(" ", 4) for line in done.stdout.splitlines()]
        self.assertEqual(
            [(t, lead, status, result) for t, lead, _, status, result in lines],
            [("stdio", "ts-mcp", "done", '"ts-stdio"'), ("http", "ts-mcp-http", "done", '"ts-http"')],
            report,
        )
        # Each under the lead it named (--lead-id, the subagentd-lead-id header).
        for _, lead, agent_id, _, result in lines:
            agents = self.lead_agents(lead)
            self.assertEqual([(a.id, a.status, a.result) for a in agents], [(agent_id, pb.AGENT_STATUS_DONE, json.loads(result))])


if __name__ == "__main__":
    unittest.main()
