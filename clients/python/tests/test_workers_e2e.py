"""End to end: the real subagentd binary and the example workers as separate
processes, talking gRPC over loopback.

Run from the repository root after `cargo build --bins` and
`pip install ./clients/python`:

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

import grpc
from google.protobuf import duration_pb2

from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BIN = os.environ.get("SUBAGENTD_BIN", str(ROOT / "target" / "debug" / "subagentd"))
# Guards against hangs only; nothing waits for a time to pass.
TIMEOUT = 30

CONFIG = """
[limits]
max_background_agents = {max_background}
default_concurrency = 0
max_concurrent_per_parent = 0

[agents.coder]
runner = "worker"
max_turns = 1
grace_turns = 1
wrap_up_message = "finish now"
fallback_models = ["acme/large"]

[agents.planner]
runner = "worker"

[agents.simulated]
runner = "simulated"
"""


def _lines(stream, into: "queue.Queue[str]") -> None:
    for line in iter(stream.readline, ""):
        into.put(line)
    into.put("")


def _wait_for(lines: "queue.Queue[str]", marker: str, what: str, seen: "list | None" = None) -> str:
    """The first line with `marker`; the lines read are appended to `seen`."""
    seen = [] if seen is None else seen
    while True:
        try:
            line = lines.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"{what}: no {marker!r} within {TIMEOUT} s; saw {seen}")
        if line == "":
            raise AssertionError(f"{what} exited before {marker!r}; saw {seen}")
        seen.append(line.rstrip())
        if marker in line:
            return line


class Server:
    """subagentd serving a config on a free loopback port."""

    def __init__(
        self,
        max_background: int = 20,
        config: "str | None" = None,
        env: "dict | None" = None,
        listen: str = "127.0.0.1:0",
    ):
        self.config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        self.config.write(config if config is not None else CONFIG.format(max_background=max_background))
        self.config.close()
        self.proc = subprocess.Popen(
            [BIN, "serve", "--config", self.config.name, "--listen", listen],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # Several servers may run at once: no fixed metrics port.
            # Stopping does not wait for runs still going.
            env={
                **os.environ,
                "SUBAGENTD_TELEMETRY__METRICS_LISTEN": "127.0.0.1:0", "SUBAGENTD_HTTP__LISTEN": "127.0.0.1:0",
                "SUBAGENTD_SERVER__SHUTDOWN_GRACE": "0s",
                # Parallel servers must not share ./subagentd-data.
                "SUBAGENTD_STORE__BACKEND": "memory",
                **(env or {}),
            },
        )
        #: The server's log lines, as they come, and those read so far.
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.seen: "list[str]" = []
        self.reader = threading.Thread(target=_lines, args=(self.proc.stderr, self.lines), daemon=True)
        self.reader.start()
        line = _wait_for(self.lines, "subagentd listening", "subagentd", self.seen)
        self.addr = line.split("addr=")[1].split()[0]
        #: The metrics endpoint (host:port).
        self.metrics = line.split("metrics=")[1].split()[0]
        #: The [http] listener that serves /mcp (host:port); None when it is off.
        self.http = line.split("http=")[1].split()[0] if " http=" in line else None
        self.channel = grpc.insecure_channel(self.addr)
        self.agents = subagents_pb2_grpc.AgentServiceStub(self.channel)

    def log_line(self, marker: str) -> str:
        """The first log line with `marker`, read already or still to come."""
        for line in self.seen:
            if marker in line:
                return line
        return _wait_for(self.lines, marker, "subagentd", self.seen)

    def stop(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=TIMEOUT)
        self.reader.join(timeout=TIMEOUT)
        self.proc.stderr.close()
        os.unlink(self.config.name)

    def spawn(self, agent: str, prompt: str) -> pb.Agent:
        return self.agents.Spawn(
            pb.SpawnRequest(agent=agent, model="acme/small", prompt=prompt, background=True), timeout=TIMEOUT
        ).agent

    def await_one(self, agent_id: str) -> pb.Agent:
        response = self.agents.Await(
            pb.AwaitRequest(ids=[agent_id], timeout=duration_pb2.Duration(seconds=TIMEOUT)), timeout=TIMEOUT + 5
        )
        assert not response.timed_out, f"agent {agent_id} did not settle"
        return response.agents[0]


class WorkerProcess:
    """One of the example workers, as its own process."""

    def __init__(self, server: Server, example: str = "scripted_worker.py", *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / example), "--addr", server.addr, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        lines: "queue.Queue[str]" = queue.Queue()
        self.reader = threading.Thread(target=_lines, args=(self.proc.stdout, lines), daemon=True)
        self.reader.start()
        self.worker_id = _wait_for(lines, "ready ", example).split()[1]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=TIMEOUT)
        self.reader.join(timeout=TIMEOUT)
        self.proc.stdout.close()


class WorkerEndToEnd(unittest.TestCase):
    def start(self, max_background: int = 20) -> Server:
        server = Server(max_background)
        self.addCleanup(server.stop)
        return server

    def worker(self, server: Server, *args: str) -> WorkerProcess:
        w = WorkerProcess(server, *args)
        self.addCleanup(w.stop)
        return w

    def test_a_run_completes_with_the_workers_result(self):
        s = self.start()
        w = self.worker(s)
        a = s.spawn("coder", "output hello\ntool grep\nusage 3 4\noutput world")
        self.assertEqual(a.status, pb.AGENT_STATUS_RUNNING)
        self.assertEqual(a.worker_id, w.worker_id)
        done = s.await_one(a.id)
        self.assertEqual(done.status, pb.AGENT_STATUS_DONE, done)
        self.assertEqual(done.result, "hello\nworld")
        self.assertEqual((done.usage.input_tokens, done.usage.output_tokens, done.usage.tool_calls), (3, 4, 1))
        self.assertEqual(done.worker_id, "", "a finished agent has no worker")

    def test_a_worker_run_is_steered(self):
        s = self.start()
        self.worker(s)
        a = s.spawn("coder", "wait_steer\noutput after")
        self.assertEqual(a.status, pb.AGENT_STATUS_RUNNING)
        steered = s.agents.Steer(pb.SteerRequest(id=a.id, message="use the fast path"), timeout=TIMEOUT)
        self.assertEqual(steered.delivery, pb.STEER_DELIVERY_DELIVERED)
        done = s.await_one(a.id)
        self.assertEqual(done.status, pb.AGENT_STATUS_DONE, done)
        self.assertEqual(done.result, "steer: use the fast path\nafter")

    def test_an_approval_round_trip(self):
        s = self.start()
        self.worker(s)
        a = s.spawn("coder", "approve shell\noutput after")
        paused = s.await_one(a.id)
        self.assertEqual(paused.status, pb.AGENT_STATUS_AWAITING_APPROVAL, paused)
        self.assertEqual(paused.approval.tool_name, "shell")
        s.agents.Approve(
            pb.ApproveRequest(
                id=a.id, approval_id=paused.approval.id, decision=pb.APPROVAL_DECISION_DENY, note="not today"
            ),
            timeout=TIMEOUT,
        )
        done = s.await_one(a.id)
        self.assertEqual(done.status, pb.AGENT_STATUS_DONE, done)
        self.assertEqual(done.result, "denied: shell: not today\nafter")

    def test_a_killed_worker_fails_its_run_and_a_restarted_one_picks_up_queued_runs(self):
        # One live background agent at a time: the second Spawn is admitted
        # only if the lost run's global slot was freed.
        s = self.start(max_background=1)
        w = self.worker(s)
        a = s.spawn("coder", "hang")
        self.assertEqual(a.status, pb.AGENT_STATUS_RUNNING)
        w.kill()
        lost = s.await_one(a.id)
        self.assertEqual(lost.status, pb.AGENT_STATUS_FAILED, lost)
        self.assertEqual(lost.error.code, "WORKER_LOST")
        self.assertIn(w.worker_id, lost.error.message)

        b = s.spawn("coder", "output picked up")
        self.assertEqual(b.status, pb.AGENT_STATUS_QUEUED)
        self.assertEqual(b.queue_reason, 'no worker connected for agent type "coder"')
        self.worker(s)
        done = s.await_one(b.id)
        self.assertEqual(done.status, pb.AGENT_STATUS_DONE, done)
        self.assertEqual(done.result, "picked up")

    def test_a_continued_run_gets_the_transcript_and_the_session_the_worker_returned(self):
        s = self.start()
        self.worker(s)
        first = s.spawn("coder", "tool grep\nsession sess-42\noutput found it")
        self.assertEqual(s.await_one(first.id).status, pb.AGENT_STATUS_DONE)
        second = s.agents.Spawn(
            pb.SpawnRequest(continue_from=first.id, prompt="history", background=True), timeout=TIMEOUT
        ).agent
        self.assertEqual((second.agent, second.turn, second.conversation_id), ("coder", 2, first.id))
        done = s.await_one(second.id)
        self.assertEqual(done.status, pb.AGENT_STATUS_DONE, done)
        self.assertEqual(
            done.result.splitlines(),
            [
                "previous session: sess-42",
                "turn 1 prompt: tool grep\\nsession sess-42\\noutput found it",
                "turn 1 tool_call: grep",
                "turn 1 result: found it",
            ],
        )

    def test_turn_limits_send_the_wrap_up_as_a_steer_then_stop_the_run(self):
        s = self.start()
        self.worker(s)
        a = s.spawn("coder", "turn\nwait_steer\nturn\nturn\noutput never")
        failed = s.await_one(a.id)
        self.assertEqual(failed.status, pb.AGENT_STATUS_FAILED, failed)
        self.assertEqual(failed.error.code, "TURN_LIMIT")
        self.assertEqual(failed.result, "steer: finish now")

    def test_a_retryable_failure_falls_back_to_the_next_model(self):
        s = self.start()
        self.worker(s)
        a = s.spawn("coder", "fail_on acme/small 429\noutput on the large one")
        done = s.await_one(a.id)
        self.assertEqual(done.status, pb.AGENT_STATUS_DONE, done)
        self.assertEqual((done.model, done.attempt, done.result), ("acme/large", 2, "on the large one"))
        self.assertEqual([(x.model, x.error.code) for x in done.attempts], [("acme/small", "PROVIDER_429"), ("acme/large", "")])
        b = s.spawn("coder", "fail_on acme/small 400")
        failed = s.await_one(b.id)
        self.assertEqual((failed.status, failed.error.code, failed.attempt), (pb.AGENT_STATUS_FAILED, "PROVIDER_400", 1))

    def test_a_worker_run_spawns_two_children_and_awaits_them(self):
        s = self.start()
        self.worker(s, "spawning_worker.py", "--agents", "planner", "--child-agent", "simulated")
        a = s.spawn("planner", "the refactor")
        done = s.await_one(a.id)
        self.assertEqual(done.status, pb.AGENT_STATUS_DONE, done)
        self.assertEqual(done.result, "first half of: the refactor\nsecond half of: the refactor")
        children = s.agents.Status(pb.StatusRequest(parent_id=a.id), timeout=TIMEOUT).agents
        self.assertEqual(len(children), 2)
        for child in children:
            self.assertEqual(child.depth, 2)
            self.assertEqual(child.root_id, a.id)
            self.assertEqual(child.status, pb.AGENT_STATUS_DONE)


if __name__ == "__main__":
    unittest.main()
