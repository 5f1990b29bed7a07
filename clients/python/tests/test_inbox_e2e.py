"""End to end with grpcio: a lead's inbox (Await by lead_id with collect)
returns each settled agent once, and its refusals carry field violations
that grpc-core accepts.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import unittest

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2

from subagentd import client
from subagents.v1 import subagents_pb2 as pb

from test_workers_e2e import TIMEOUT, Server

LEAD = "py-inbox"


class InboxTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = Server()
        self.addCleanup(self.server.stop)

    def _inbox(self, timeout_ms: int) -> pb.AwaitResponse:
        return self.server.agents.Await(
            pb.AwaitRequest(
                lead_id=LEAD,
                mode=pb.AWAIT_MODE_ANY,
                collect=True,
                timeout=Duration(seconds=timeout_ms // 1000, nanos=(timeout_ms % 1000) * 1_000_000),
            ),
            timeout=TIMEOUT,
        )

    def test_each_settled_agent_is_returned_once(self) -> None:
        spawned = [
            self.server.agents.Spawn(
                pb.SpawnRequest(
                    agent="simulated", model="acme/small", prompt=f"output {n}", background=True, lead_id=LEAD
                ),
                timeout=TIMEOUT,
            ).agent.id
            for n in range(3)
        ]
        seen: list[str] = []
        while len(seen) < 3:
            answer = self._inbox(10_000)
            self.assertFalse(answer.timed_out)
            for agent in answer.agents:
                self.assertEqual(agent.status, pb.AGENT_STATUS_DONE)
                self.assertTrue(agent.HasField("collected_time"))
                seen.append(agent.id)
        self.assertCountEqual(seen, spawned)
        again = self._inbox(200)
        self.assertTrue(again.timed_out)
        self.assertEqual(len(again.agents), 0)

    def test_two_targets_are_invalid_argument_with_both_fields(self) -> None:
        with self.assertRaises(grpc.RpcError) as raised:
            self.server.agents.Await(pb.AwaitRequest(ids=["x"], lead_id=LEAD), timeout=TIMEOUT)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        fields = [
            v.field
            for detail in client.error_details(raised.exception)
            if isinstance(detail, error_details_pb2.BadRequest)
            for v in detail.field_violations
        ]
        self.assertEqual(fields, ["ids", "lead_id"])


if __name__ == "__main__":
    unittest.main()
