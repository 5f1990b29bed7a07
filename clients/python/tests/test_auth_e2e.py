"""End to end with authentication: keys made by `subagentd keys new`, the
client's `channel()` and the worker library sending them, and tenants kept
apart.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import os
import subprocess
import threading
import unittest

import grpc
from google.protobuf import duration_pb2

from subagentd import client
from subagentd.worker import Worker
from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc

from test_workers_e2e import BIN, TIMEOUT, Server


def new_key(key_id: str, tenant: str, *roles: str):
    """A fresh key and its config entry, as `subagentd keys new` prints them."""
    args = [BIN, "keys", "new", "--tenant", tenant, "--id", key_id]
    for role in roles:
        args += ["--role", role]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    key, entry = out.split("\n", 1)
    return key.strip(), entry


def auth_server(entries) -> Server:
    """subagentd requiring the keys of `entries` (config entries)."""
    config = '[agents.coder]\nrunner = "worker"\n\n[auth]\nmode = "required"\n' + "".join(entries)
    return Server(config=config)


class AuthTest(unittest.TestCase):
    def setUp(self):
        self.front_a, front_a = new_key("fronta", "team-a", "frontend")
        self.worker_a, worker_a = new_key("workera", "team-a", "worker")
        self.front_b, front_b = new_key("frontb", "team-b", "frontend")
        self.server = auth_server([front_a, worker_a, front_b])

    def tearDown(self):
        self.server.stop()

    def channel(self, **kwargs) -> grpc.Channel:
        channel = client.channel(self.server.addr, **kwargs)
        self.addCleanup(channel.close)
        return channel

    def test_a_call_without_a_key_is_unauthenticated_with_its_cause(self):
        agents = subagents_pb2_grpc.AgentServiceStub(self.channel(token=""))
        with self.assertRaises(grpc.RpcError) as caught:
            agents.Status(pb.StatusRequest(), timeout=TIMEOUT)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        info = client.error_info(caught.exception)
        self.assertEqual(info.reason, "UNAUTHENTICATED")
        self.assertEqual(info.metadata["cause"], "missing")

    def test_a_worker_with_a_key_serves_its_tenants_runs_only(self):
        os.environ["SUBAGENTD_TOKEN"] = self.front_a
        try:
            # The environment variable is the default token.
            a = subagents_pb2_grpc.AgentServiceStub(self.channel())
        finally:
            del os.environ["SUBAGENTD_TOKEN"]
        b = subagents_pb2_grpc.AgentServiceStub(self.channel(token=self.front_b))
        worker = Worker(
            self.server.addr, agents=["coder"], handler=lambda run: f"done: {run.prompt}", token=self.worker_a
        )
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.assertTrue(worker.ready.wait(TIMEOUT))
        try:
            request = pb.SpawnRequest(agent="coder", model="acme/m", prompt="a's work", background=True)
            theirs = b.Spawn(request, timeout=TIMEOUT).agent
            mine = a.Spawn(request, timeout=TIMEOUT).agent
            done = a.Await(
                pb.AwaitRequest(ids=[mine.id], timeout=duration_pb2.Duration(seconds=TIMEOUT)), timeout=TIMEOUT + 5
            ).agents[0]
            self.assertEqual(done.result, "done: a's work")
            self.assertEqual(done.tenant, "team-a")
            # B's run waits for a worker of B; A cannot see it at all.
            waiting = b.Status(pb.StatusRequest(ids=[theirs.id]), timeout=TIMEOUT).agents[0]
            self.assertEqual(waiting.status, pb.AGENT_STATUS_QUEUED)
            with self.assertRaises(grpc.RpcError) as caught:
                a.Status(pb.StatusRequest(ids=[theirs.id]), timeout=TIMEOUT)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)
        finally:
            worker.stop()
            thread.join(timeout=TIMEOUT)


if __name__ == "__main__":
    unittest.main()
