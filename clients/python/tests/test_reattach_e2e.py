"""End to end: a Python worker (the library, `reconnect_delay` set) keeps its
run across a SIGKILL of the server. The server restarts on the same embedded
store and port; the worker reconnects, names the run it holds, and the server
re-attaches it: the steer sent after the restart reaches the handler, and the
run finishes with the handler's result."""

import os
import signal
import socket
import subprocess
import tempfile
import queue
import threading
import time
import unittest

import grpc
from google.protobuf import duration_pb2

from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc
from subagentd.worker import Run, Worker

from test_workers_e2e import BIN, TIMEOUT, _lines, _wait_for

CONFIG = """
[store]
backend = "embedded"
path = "{path}"

[agents.coder]
runner = "worker"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DurableServer:
    """subagentd on a fixed loopback port and an embedded store."""

    def __init__(self, config: str, port: int):
        self.addr = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [BIN, "serve", "--config", config, "--listen", self.addr],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SUBAGENTD_TELEMETRY__METRICS_LISTEN": "127.0.0.1:0", "SUBAGENTD_HTTP__LISTEN": "127.0.0.1:0"},
        )
        lines: "queue.Queue[str]" = queue.Queue()
        self.reader = threading.Thread(target=_lines, args=(self.proc.stderr, lines), daemon=True)
        self.reader.start()
        _wait_for(lines, "subagentd listening", "subagentd")
        self.channel = grpc.insecure_channel(self.addr)
        self.agents = subagents_pb2_grpc.AgentServiceStub(self.channel)

    def end(self, sig: int) -> None:
        self.channel.close()
        self.proc.send_signal(sig)
        self.proc.wait(timeout=TIMEOUT)
        self.reader.join(timeout=TIMEOUT)
        self.proc.stderr.close()


class WorkerReattach(unittest.TestCase):
    def test_a_worker_run_survives_a_server_crash_and_finishes(self):
        data = tempfile.TemporaryDirectory()
        self.addCleanup(data.cleanup)
        config = os.path.join(data.name, "config.toml")
        with open(config, "w") as f:
            f.write(CONFIG.format(path=os.path.join(data.name, "store")))
        port = _free_port()

        started = threading.Event()

        def handle(run: Run) -> str:
            started.set()
            return f"got {run.next_steer(timeout=TIMEOUT)!r} after the restart"

        server = DurableServer(config, port)
        worker = Worker(f"127.0.0.1:{port}", agents=["coder"], handler=handle, reconnect_delay=0.1)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.addCleanup(thread.join, TIMEOUT)
        self.addCleanup(worker.stop)
        self.assertTrue(worker.ready.wait(TIMEOUT))
        first_session = worker.worker_id
        agent = server.agents.Spawn(
            pb.SpawnRequest(agent="coder", model="acme/small", prompt="wait", background=True), timeout=TIMEOUT
        ).agent
        self.assertTrue(started.wait(TIMEOUT))

        server.end(signal.SIGKILL)
        server = DurableServer(config, port)
        self.addCleanup(server.end, signal.SIGTERM)
        # The worker reconnected: a new session, the same run.
        deadline = time.monotonic() + TIMEOUT
        while not (worker.ready.wait(0.05) and worker.worker_id != first_session):
            self.assertLess(time.monotonic(), deadline, "the worker did not reconnect")
        held = server.agents.Status(pb.StatusRequest(ids=[agent.id]), timeout=TIMEOUT).agents[0]
        self.assertEqual(held.status, pb.AGENT_STATUS_RUNNING)
        self.assertEqual(held.attempt, 1)
        self.assertEqual(held.worker_id, worker.worker_id, "held by the new session")
        server.agents.Steer(pb.SteerRequest(id=agent.id, message="hello again"), timeout=TIMEOUT)
        done = server.agents.Await(
            pb.AwaitRequest(ids=[agent.id], timeout=duration_pb2.Duration(seconds=TIMEOUT)), timeout=TIMEOUT + 5
        )
        self.assertFalse(done.timed_out)
        self.assertEqual(done.agents[0].status, pb.AGENT_STATUS_DONE)
        self.assertEqual(done.agents[0].result, "got 'hello again' after the restart")


if __name__ == "__main__":
    unittest.main()
