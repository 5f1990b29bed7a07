"""End to end: the lead workflow examples (Python and TypeScript) as separate
processes against the real subagentd binary, each on a fresh server whose
global cap is 3.

Run from the repository root after `cargo build --bins`,
`pip install ./clients/python` (with grpcio-status, see requirements-ci.txt)
and `npm ci --prefix clients/typescript` (the TypeScript case is skipped
without clients/typescript/node_modules unless SUBAGENTD_REQUIRE_TS is set;
.ci/clients-e2e.sh sets it):

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest -v clients/python/tests/test_examples_e2e.py
"""

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

import grpc

from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
PY_EXAMPLE = ROOT / "clients" / "python" / "examples" / "lead_workflow.py"
TS_DIR = ROOT / "clients" / "typescript"
TS_EXAMPLE = TS_DIR / "dist" / "examples" / "lead_workflow.js"
BIN = os.environ.get("SUBAGENTD_BIN", str(ROOT / "target" / "debug" / "subagentd"))
REQUIRE_TS = bool(os.environ.get("SUBAGENTD_REQUIRE_TS"))
# Guards against hangs only; nothing waits for a time to pass.
TIMEOUT = 60

# The global cap is what the workflow's fourth spawn runs into; no bucket or
# per-parent limit may queue the three agents.
CONFIG = """
[limits]
max_background_agents = 3
default_concurrency = 0
max_concurrent_per_parent = 0

[agents.simulated]
runner = "simulated"
"""

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"

# What both examples print, with the agent ids replaced by A1, A2, A3 (in
# spawn order) and the lead id by L. Event lines come from the watch stream
# and may interleave with the others; everything else is in this order.
EXPECTED_STEPS = [
    "lead L",
    "watching L",
    "spawned A1 RUNNING",
    "spawned A2 RUNNING",
    "spawned A3 RUNNING",
    "rejected GLOBAL_LIMIT_REACHED code=RESOURCE_EXHAUSTED domain=subagentd limit=3 live=3"
    " config_key=limits.max_background_agents",
    'quota limits.max_background_agents "3 of 3 live background agents"',
    "steered A1 DELIVERED",
    "await timed_out=true done=1 running=2",
    "cancelled 2 A2 A3",
    'final A1 DONE error=- result="agent 1 waiting\\nsteer: go on\\nagent 1 finished"',
    'final A2 CANCELLED error=CANCELLED result="agent 2 waiting"',
    'final A3 CANCELLED error=CANCELLED result="agent 3 waiting"',
]
# Per agent, in this order.
EXPECTED_EVENTS = {
    "A1": ["event STARTED A1 RUNNING", "event STEERED A1 RUNNING", "event DONE A1 DONE"],
    "A2": ["event STARTED A2 RUNNING", "event CANCELLED A2 CANCELLED"],
    "A3": ["event STARTED A3 RUNNING", "event CANCELLED A3 CANCELLED"],
}


def _lines(stream, into: "queue.Queue[str]") -> None:
    for line in iter(stream.readline, ""):
        into.put(line)
    into.put("")


class Server:
    """subagentd serving CONFIG on a free loopback port."""

    def __init__(self, tls_dir: "str | None" = None):
        """With `tls_dir` (certificates made by `test_tls_e2e.make_ca` and
        `leaf` there), the server speaks TLS with `server.crt`."""
        self.config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        self.config.write(CONFIG)
        if tls_dir is not None:
            self.config.write(
                f'\n[server.tls]\ncert_file = "{tls_dir}/server.crt"\nkey_file = "{tls_dir}/server.key"\n'
            )
        self.config.close()
        self.proc = subprocess.Popen(
            [BIN, "serve", "--config", self.config.name, "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # Several servers may run at once: no fixed metrics port.
            # Parallel servers must not share ./subagentd-data.
            env={
                **os.environ,
                "SUBAGENTD_TELEMETRY__METRICS_LISTEN": "127.0.0.1:0", "SUBAGENTD_HTTP__LISTEN": "127.0.0.1:0",
                "SUBAGENTD_STORE__BACKEND": "memory",
            },
        )
        self.log = []
        lines: "queue.Queue[str]" = queue.Queue()
        self.reader = threading.Thread(target=_lines, args=(self.proc.stderr, lines), daemon=True)
        self.reader.start()
        while True:
            try:
                line = lines.get(timeout=TIMEOUT)
            except queue.Empty:
                self.stop()
                raise AssertionError(f"subagentd: not listening within {TIMEOUT} s; saw {self.log}")
            if line == "":
                self.stop()
                raise AssertionError(f"subagentd exited before listening; saw {self.log}")
            self.log.append(line.rstrip())
            if "subagentd listening" in line:
                break
        self.addr = line.split("addr=")[1].split()[0]
        if tls_dir is None:
            self.channel = grpc.insecure_channel(self.addr)
        else:
            with open(f"{tls_dir}/ca.crt", "rb") as f:
                self.channel = grpc.secure_channel(self.addr, grpc.ssl_channel_credentials(f.read()))
        self.agents = subagents_pb2_grpc.AgentServiceStub(self.channel)

    def stop(self) -> None:
        if hasattr(self, "channel"):
            self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=TIMEOUT)
        self.reader.join(timeout=TIMEOUT)
        self.proc.stderr.close()
        os.unlink(self.config.name)


def _normalize(lines, lead_id, ids):
    names = {agent_id: f"A{i}" for i, agent_id in enumerate(ids, 1)}
    out = []
    for line in lines:
        line = line.replace(lead_id, "L")
        line = re.sub(UUID, lambda m: names.get(m.group(0), m.group(0)), line)
        if line.startswith("cancelled "):
            # The Cancel response lists the agents in no promised order.
            words = line.split()
            line = " ".join(words[:2] + sorted(words[2:]))
        out.append(line)
    return out


def _build_typescript(target: Path = TS_EXAMPLE) -> None:
    """tsc, when `target` (a file of dist/) is missing or older than a source file."""
    sources = [p for d in ("src", "examples", "test") for p in (TS_DIR / d).rglob("*.ts")] + [TS_DIR / "tsconfig.json"]
    if target.exists() and target.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return
    tsc = TS_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    built = subprocess.run(
        ["node", str(tsc), "-p", str(TS_DIR)], capture_output=True, text=True, timeout=TIMEOUT
    )
    if built.returncode != 0:
        raise AssertionError(f"tsc failed:\n{built.stdout}{built.stderr}")


class LeadWorkflowExamples(unittest.TestCase):
    def run_example(self, argv, tls: bool = False):
        """Runs the example against a fresh server; with `tls`, a TLS one,
        the example finding its CA in SUBAGENTD_CA_FILE."""
        env = dict(os.environ)
        tls_dir = None
        if tls:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from pki import leaf, make_ca

            tls_dir = tempfile.mkdtemp()
            self.addCleanup(shutil.rmtree, tls_dir)
            make_ca(tls_dir)
            leaf(tls_dir, "server", "DNS:localhost,IP:127.0.0.1")
            env["SUBAGENTD_CA_FILE"] = f"{tls_dir}/ca.crt"
        server = Server(tls_dir)
        self.addCleanup(server.stop)
        # Over TLS by name, as certificates name servers (node warns when
        # TLS's server name is an IP address, RFC 6066).
        addr = server.addr.replace("127.0.0.1:", "localhost:") if tls else server.addr
        done = subprocess.run(
            [*argv, "--addr", addr], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=env
        )
        report = f"\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        self.assertEqual(done.returncode, 0, report)
        self.assertEqual(done.stderr.strip(), "", report)
        self.check_output(server, done.stdout.splitlines(), report)

    def check_output(self, server: Server, lines, report: str) -> None:
        self.assertTrue(lines and lines[0].startswith("lead "), report)
        lead_id = lines[0].split()[1]
        spawned = [line.split()[1] for line in lines if line.startswith("spawned ")]
        self.assertEqual(len(spawned), 3, "three spawns, the fourth rejected" + report)
        self.assertEqual(len(set(spawned)), 3, report)
        for agent_id in spawned:
            self.assertRegex(agent_id, f"^{UUID}$")

        normalized = _normalize(lines, lead_id, spawned)
        steps = [line for line in normalized if not line.startswith("event ")]
        events = [line for line in normalized if line.startswith("event ")]
        self.assertEqual(steps, EXPECTED_STEPS, report)
        # Every lifecycle event of the lead's agents, once each, in order per
        # agent; nothing else on the stream.
        self.assertCountEqual(events, [e for per_agent in EXPECTED_EVENTS.values() for e in per_agent], report)
        for name, expected in EXPECTED_EVENTS.items():
            self.assertEqual([e for e in events if e.split()[2] == name], expected, report)
        # The workflow waits for these events before its next step.
        def before(event, step):
            self.assertLess(normalized.index(event), normalized.index(step), f"{event!r} before {step!r}" + report)

        for name in ("A1", "A2", "A3"):
            before(f"event STARTED {name} RUNNING", EXPECTED_STEPS[5])
        before("event DONE A1 DONE", "await timed_out=true done=1 running=2")
        before("event CANCELLED A2 CANCELLED", EXPECTED_STEPS[-3])
        before("event CANCELLED A3 CANCELLED", EXPECTED_STEPS[-3])

        # The server agrees: the lead's three agents, one DONE and two
        # CANCELLED, and no fourth one.
        agents = server.agents.Status(pb.StatusRequest(lead_id=lead_id), timeout=TIMEOUT).agents
        self.assertEqual([a.id for a in agents], spawned)
        self.assertEqual(
            [pb.AgentStatus.Name(a.status) for a in agents],
            ["AGENT_STATUS_DONE", "AGENT_STATUS_CANCELLED", "AGENT_STATUS_CANCELLED"],
        )
        self.assertEqual(agents[0].result, "agent 1 waiting\nsteer: go on\nagent 1 finished")
        for a in agents[1:]:
            self.assertEqual(a.error.code, "CANCELLED")
            self.assertEqual(a.error.message, "lead_workflow finished")
            self.assertEqual(a.lead_id, lead_id)

    def test_python_lead_workflow(self):
        self.run_example([sys.executable, "-W", "error::ResourceWarning", str(PY_EXAMPLE)])

    def test_python_lead_workflow_over_tls(self):
        self.run_example([sys.executable, "-W", "error::ResourceWarning", str(PY_EXAMPLE)], tls=True)

    def test_typescript_lead_workflow_over_tls(self):
        self.typescript_lead_workflow(tls=True)

    def test_typescript_lead_workflow(self):
        self.typescript_lead_workflow(tls=False)

    def typescript_lead_workflow(self, tls: bool):
        if not (TS_DIR / "node_modules").is_dir():
            message = "clients/typescript/node_modules is missing: run `npm ci --prefix clients/typescript`"
            if REQUIRE_TS:
                self.fail(message + " (SUBAGENTD_REQUIRE_TS is set)")
            self.skipTest(message + " (set SUBAGENTD_REQUIRE_TS=1 to make this a failure)")
        if shutil.which("node") is None:
            self.fail("node is not on PATH, but clients/typescript/node_modules exists")
        _build_typescript()
        self.run_example(["node", str(TS_EXAMPLE)], tls=tls)


if __name__ == "__main__":
    unittest.main()
