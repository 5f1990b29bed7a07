"""End to end with grpcio's own deadlines: a call whose deadline passes is
DEADLINE_EXCEEDED, the foreground agent is cancelled, and the server counts
the call as DEADLINE_EXCEEDED (never CANCELLED) in its metrics.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import time
import unittest
import urllib.request

import grpc

from subagents.v1 import subagents_pb2 as pb

from test_workers_e2e import TIMEOUT, Server


def _scrape(addr: str) -> dict:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=TIMEOUT) as response:
        body = response.read().decode()
    series = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def _calls(addr: str, method: str, code: str) -> float:
    key = f'subagentd_rpc_requests_total{{service="subagents.v1.AgentService",method="{method}",code="{code}"}}'
    return _scrape(addr).get(key, 0.0)


class DeadlineTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = Server()
        self.addCleanup(self.server.stop)

    def _counted(self, method: str, total: float) -> None:
        """Waits (bounded) until the server counted `total` calls of `method`."""
        give_up = time.monotonic() + TIMEOUT
        while True:
            n = sum(_calls(self.server.metrics, method, c) for c in ("DEADLINE_EXCEEDED", "CANCELLED", "OK"))
            if n >= total or time.monotonic() > give_up:
                return
            time.sleep(0.05)  # polling a scrape, not waiting for agent state

    def test_a_foreground_spawn_past_its_deadline(self) -> None:
        request = pb.SpawnRequest(
            agent="simulated", model="acme/small", prompt="sleep 60000", lead_id="py-deadline"
        )
        with self.assertRaises(grpc.RpcError) as raised:
            self.server.agents.Spawn(request, timeout=1.5)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)

        # The agent was cancelled because the deadline passed.
        listed = self.server.agents.Status(pb.StatusRequest(lead_id="py-deadline"), timeout=TIMEOUT)
        self.assertEqual(len(listed.agents), 1)
        agent = self.server.await_one(listed.agents[0].id)
        self.assertEqual(agent.status, pb.AGENT_STATUS_CANCELLED)
        self.assertIn("deadline passed", agent.error.message)

        self._counted("Spawn", 1)
        self.assertEqual(_calls(self.server.metrics, "Spawn", "DEADLINE_EXCEEDED"), 1.0)
        self.assertEqual(_calls(self.server.metrics, "Spawn", "CANCELLED"), 0.0)

    def test_a_watch_past_its_deadline(self) -> None:
        stream = self.server.agents.WatchAgents(pb.WatchAgentsRequest(include_snapshot=True), timeout=1.0)
        with self.assertRaises(grpc.RpcError) as raised:
            for _ in stream:
                pass
        self.assertEqual(raised.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self._counted("WatchAgents", 1)
        self.assertEqual(_calls(self.server.metrics, "WatchAgents", "DEADLINE_EXCEEDED"), 1.0)
        self.assertEqual(_calls(self.server.metrics, "WatchAgents", "CANCELLED"), 0.0)


if __name__ == "__main__":
    unittest.main()
