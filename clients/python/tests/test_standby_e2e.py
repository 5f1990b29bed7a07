"""End to end through a standby, with grpc-core (grpcio): two servers on one
PostgreSQL database; every error a caller can get reads through the standby
exactly as from the leader (code, message, ErrorInfo / QuotaFailure /
BadRequest details), and so do streams and a stream's error after messages.

grpc-core checks what tonic's client tolerates: a relayed trailers-only
error that is not one any more reads as `UNKNOWN: Stream removed`.

Needs SUBAGENTD_TEST_POSTGRES (a server URL; `.ci/postgres.sh start` sets
it); skipped without it unless SUBAGENTD_REQUIRE_POSTGRES=1 (CI).
"""

import os
import subprocess
import unittest
import uuid
from urllib.parse import urlsplit, urlunsplit

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from subagentd import client
from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc

from test_auth_e2e import new_key
from test_workers_e2e import TIMEOUT, Server

POSTGRES = os.environ.get("SUBAGENTD_TEST_POSTGRES", "")
REQUIRED = os.environ.get("SUBAGENTD_REQUIRE_POSTGRES") == "1"

CONFIG = """
[store]
backend = "postgres"
url = "{url}"

[ha]
lease_ttl = "2s"

[limits]
max_background_agents = 2
default_concurrency = 0

[agents.simulated]
runner = "simulated"

[auth]
mode = "required"
"""


def fresh_database() -> str:
    """A new database on the test server; its URL."""
    name = "standby_" + uuid.uuid4().hex[:12]
    subprocess.run(
        ["psql", POSTGRES, "-v", "ON_ERROR_STOP=1", "-q", "-c", f"CREATE DATABASE {name}"],
        check=True,
        capture_output=True,
    )
    parts = urlsplit(POSTGRES)
    return urlunsplit(parts._replace(path="/" + name))


def postgres_server(config: str) -> Server:
    return Server(config=config, env={"SUBAGENTD_STORE__BACKEND": "postgres"})


@unittest.skipUnless(POSTGRES or REQUIRED, "SUBAGENTD_TEST_POSTGRES is not set")
class StandbyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.keys = {}
        entries = []
        for key_id, tenant, role in [
            ("afront", "team-a", "frontend"),
            ("bfront", "team-b", "frontend"),
            ("bview", "team-b", "viewer"),
            ("bappr", "team-b", "approver"),
        ]:
            cls.keys[key_id], entry = new_key(key_id, tenant, role)
            entries.append(entry)
        config = CONFIG.format(url=fresh_database()) + "".join(entries)
        cls.servers = []
        try:
            cls.leader = postgres_server(config)
            cls.servers.append(cls.leader)
            cls.leader.log_line("leading: serving")
            cls.standby = postgres_server(config)
            cls.servers.append(cls.standby)
            cls.standby.log_line("forwarding to the leader")
        except BaseException:
            # tearDownClass does not run after a failed setUpClass.
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers:
            server.stop()

    def stub(self, server: Server, key: str) -> subagents_pb2_grpc.AgentServiceStub:
        channel = client.channel(server.addr, token=self.keys.get(key, key))
        self.addCleanup(channel.close)
        return subagents_pb2_grpc.AgentServiceStub(channel)

    def error(self, server: Server, key: str, method: str, request) -> grpc.RpcError:
        with self.assertRaises(grpc.RpcError, msg=f"{method} answered OK") as caught:
            call = getattr(self.stub(server, key), method)
            if method == "WatchAgents":
                list(call(request, timeout=TIMEOUT))
            else:
                call(request, timeout=TIMEOUT)
        return caught.exception

    def same_error(self, key: str, method: str, request, code: grpc.StatusCode, *details: type):
        """The call's error from the leader and through the standby: the
        same code, message and details; returns the unpacked details."""
        direct = self.error(self.leader, key, method, request)
        relayed = self.error(self.standby, key, method, request)
        what = f"{method} as {key}"
        self.assertEqual(direct.code(), code, f"{what} on the leader: {direct}")
        self.assertEqual(relayed.code(), code, f"{what} through the standby: {relayed}")
        self.assertEqual(relayed.details(), direct.details(), what)
        # The same details, compared as messages (ErrorInfo's metadata is
        # a map: its encoded order differs between two processes).
        rich, leaders = client.rich_status(relayed), client.rich_status(direct)
        self.assertIsNotNone(rich, f"{what}: no grpc-status-details-bin through the standby")
        self.assertEqual((rich.code, rich.message), (leaders.code, leaders.message), what)
        self.assertEqual([d.type_url for d in rich.details], [d.type_url for d in leaders.details], what)
        unpacked = client.error_details(relayed)
        self.assertEqual(unpacked, client.error_details(direct), what)
        self.assertEqual(len(unpacked), len(rich.details), f"{what}: a detail of an unknown type")
        for cls in details:
            self.assertTrue(any(isinstance(d, cls) for d in unpacked), f"{what}: no {cls.__name__} in {unpacked}")
        return unpacked

    def spawn(self, key: str, prompt: str, server=None) -> pb.Agent:
        request = pb.SpawnRequest(agent="simulated", model="acme/m", prompt=prompt, background=True)
        return self.stub(server or self.standby, key).Spawn(request, timeout=TIMEOUT).agent

    def test_every_error_reads_through_the_standby_as_from_the_leader(self):
        info = error_details_pb2.ErrorInfo
        bad = error_details_pb2.BadRequest
        unknown = str(uuid.uuid4())
        # Invalid requests: field violations.
        self.same_error(
            "afront", "Spawn", pb.SpawnRequest(agent="nope", model="acme/m", prompt="x"),
            grpc.StatusCode.INVALID_ARGUMENT, bad,
        )
        self.same_error(
            "afront", "Spawn", pb.SpawnRequest(agent="simulated", model="acme/m", prompt=""),
            grpc.StatusCode.INVALID_ARGUMENT, bad,
        )
        self.same_error("afront", "Status", pb.StatusRequest(ids=["not-an-id"]), grpc.StatusCode.INVALID_ARGUMENT, bad)
        # A streaming method's error before any message: trailers-only too.
        self.same_error(
            "afront", "WatchAgents", pb.WatchAgentsRequest(ids=["not-an-id"]), grpc.StatusCode.INVALID_ARGUMENT, bad
        )
        # Credentials and roles (answered by the standby before it forwards).
        for key, cause in [("", "missing"), ("not a key", "malformed")]:
            details = self.same_error(key, "Status", pb.StatusRequest(), grpc.StatusCode.UNAUTHENTICATED, info)
            self.assertEqual(details[0].metadata["cause"], cause)
        self.same_error(
            "bview", "Cancel", pb.CancelRequest(id=unknown), grpc.StatusCode.PERMISSION_DENIED, info
        )
        # Another tenant's agent reads as one that never existed.
        theirs = self.spawn("afront", "sleep 600000")
        for target in [theirs.id, unknown]:
            for key, method, request in [
                ("bview", "Status", pb.StatusRequest(ids=[target])),
                ("bview", "Await", pb.AwaitRequest(ids=[target], timeout=duration_pb2.Duration(seconds=1))),
                ("bfront", "Cancel", pb.CancelRequest(id=target)),
                ("bfront", "Steer", pb.SteerRequest(id=target, message="go on")),
                (
                    "bappr",
                    "Approve",
                    pb.ApproveRequest(id=target, approval_id=unknown, decision=pb.APPROVAL_DECISION_APPROVE),
                ),
                ("bview", "GetTranscript", pb.GetTranscriptRequest(agent_id=target)),
                ("bfront", "Spawn", pb.SpawnRequest(agent="simulated", model="acme/m", prompt="x", parent_id=target)),
            ]:
                details = self.same_error(key, method, request, grpc.StatusCode.NOT_FOUND, info)
                self.assertEqual(details[0].reason, "AGENT_NOT_FOUND", method)
        # A finished agent refuses a steer: FAILED_PRECONDITION.
        done = self.spawn("bfront", "output finished")
        awaited = self.stub(self.standby, "bfront").Await(
            pb.AwaitRequest(ids=[done.id], timeout=duration_pb2.Duration(seconds=TIMEOUT)), timeout=TIMEOUT + 5
        )
        self.assertEqual(awaited.agents[0].status, pb.AGENT_STATUS_DONE)
        self.same_error(
            "bfront", "Steer", pb.SteerRequest(id=done.id, message="more"), grpc.StatusCode.FAILED_PRECONDITION, info
        )
        # The global cap: `theirs` and one more are live; the next is refused.
        self.spawn("bfront", "sleep 600000")
        details = self.same_error(
            "bfront", "Spawn", pb.SpawnRequest(agent="simulated", model="acme/m", prompt="x", background=True),
            grpc.StatusCode.RESOURCE_EXHAUSTED, info, error_details_pb2.QuotaFailure,
        )
        reasons = [d.reason for d in details if isinstance(d, info)]
        self.assertEqual(reasons, ["GLOBAL_LIMIT_REACHED"])

    def test_a_relayed_stream_delivers_messages_then_ends_with_a_readable_error(self):
        # Its own pair of servers: stopping the standby is part of the test.
        token, entry = new_key("front", "t", "frontend")
        config = CONFIG.format(url=fresh_database()) + entry
        leader = postgres_server(config)
        self.addCleanup(leader.stop)
        leader.log_line("leading: serving")
        standby = postgres_server(config)
        try:
            standby.log_line("forwarding to the leader")
        except BaseException:
            standby.stop()  # stopped by the test itself otherwise
            raise
        channel = client.channel(standby.addr, token=token)
        self.addCleanup(channel.close)
        agents = subagents_pb2_grpc.AgentServiceStub(channel)
        spawned = agents.Spawn(
            pb.SpawnRequest(agent="simulated", model="acme/m", prompt="output streamed", background=True),
            timeout=TIMEOUT,
        ).agent
        stream = agents.WatchAgents(
            pb.WatchAgentsRequest(ids=[spawned.id], include_snapshot=True), timeout=TIMEOUT
        )
        for event in stream:
            if event.agent.id == spawned.id and event.agent.status == pb.AGENT_STATUS_DONE:
                self.assertEqual(event.agent.result, "streamed")
                break
        # The standby stops while the stream is open: the stream ends with
        # the standby's UNAVAILABLE trailers (retry elsewhere), not a reset.
        standby.stop()
        with self.assertRaises(grpc.RpcError) as caught:
            for _ in stream:
                pass
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE, caught.exception)
        self.assertIn("route to the leader", caught.exception.details())


if __name__ == "__main__":
    unittest.main()
