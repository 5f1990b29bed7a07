"""End to end over TLS: a CA and certificates made with openssl, a server
with `[server.tls]` that requires client certificates, and the client's
`channel()` and the worker library presenting one (its SAN is the worker's
principal, `[[auth.certs]]`).

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import os
import tempfile
import threading
import unittest

import grpc
from google.protobuf import duration_pb2

from subagentd import client
from subagentd.worker import Worker
from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc

from pki import leaf, make_ca
from test_workers_e2e import TIMEOUT, Server


class TlsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        d = self.dir.name
        make_ca(d)
        leaf(d, "server", "DNS:localhost,IP:127.0.0.1")
        leaf(d, "frontend", "URI:spiffe://test/ns/agents/sa/frontend")
        leaf(d, "worker", "URI:spiffe://test/ns/agents/sa/worker")
        make_ca(d, "rogue")
        leaf(d, "rogue-frontend", "URI:spiffe://test/ns/agents/sa/frontend", ca="rogue")
        p = lambda name: os.path.join(d, name)  # noqa: E731
        config = f"""
[agents.coder]
runner = "worker"

[server.tls]
cert_file = "{p('server.crt')}"
key_file = "{p('server.key')}"
client_ca_file = "{p('ca.crt')}"
client_auth = "required"

[auth]
mode = "required"

[[auth.certs]]
san = "spiffe://test/ns/agents/sa/frontend"
tenant = "team-a"
roles = ["frontend"]

[[auth.certs]]
san = "spiffe://test/ns/agents/sa/worker"
tenant = "team-a"
roles = ["worker"]
"""
        self.server = Server(config=config)
        self.addCleanup(self.server.stop)
        self.path = p

    def channel(self, name: str, ca: str = "ca.crt") -> grpc.Channel:
        channel = client.channel(
            self.server.addr,
            token="",
            ca_file=self.path(ca),
            cert_file=self.path(f"{name}.crt"),
            key_file=self.path(f"{name}.key"),
        )
        self.addCleanup(channel.close)
        return channel

    def test_certificate_principals_spawn_and_serve_over_mtls(self):
        agents = subagents_pb2_grpc.AgentServiceStub(self.channel("frontend"))
        worker = Worker(
            self.server.addr,
            agents=["coder"],
            handler=lambda run: f"done over tls: {run.prompt}",
            token="",
            ca_file=self.path("ca.crt"),
            cert_file=self.path("worker.crt"),
            key_file=self.path("worker.key"),
        )
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.assertTrue(worker.ready.wait(TIMEOUT))
        try:
            agent = agents.Spawn(
                pb.SpawnRequest(agent="coder", model="acme/m", prompt="task", background=True), timeout=TIMEOUT
            ).agent
            self.assertEqual(agent.tenant, "team-a")
            done = agents.Await(
                pb.AwaitRequest(ids=[agent.id], timeout=duration_pb2.Duration(seconds=TIMEOUT)), timeout=TIMEOUT + 5
            ).agents[0]
            self.assertEqual(done.status, pb.AGENT_STATUS_DONE)
            self.assertEqual(done.result, "done over tls: task")
        finally:
            worker.stop()
            thread.join(TIMEOUT)

    def test_a_certificate_from_another_ca_and_plaintext_are_refused(self):
        rogue = subagents_pb2_grpc.AgentServiceStub(self.channel("rogue-frontend"))
        with self.assertRaises(grpc.RpcError) as caught:
            rogue.Status(pb.StatusRequest(), timeout=TIMEOUT)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)

        plain = grpc.insecure_channel(self.server.addr)
        self.addCleanup(plain.close)
        with self.assertRaises(grpc.RpcError) as caught:
            subagents_pb2_grpc.AgentServiceStub(plain).Status(pb.StatusRequest(), timeout=TIMEOUT)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)

        # The server still serves verified clients.
        ok = subagents_pb2_grpc.AgentServiceStub(self.channel("frontend"))
        ok.Status(pb.StatusRequest(), timeout=TIMEOUT)


if __name__ == "__main__":
    unittest.main()
