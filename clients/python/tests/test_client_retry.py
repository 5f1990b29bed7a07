"""The client's retry rules against a scripted AgentService on loopback (a
grpcio server in this process) that answers UNAVAILABLE NO_LEADER /
RECOVERING a given number of times before it answers: idempotent calls and
a Spawn with an idempotency key retry within their deadline; Steer,
Approve and a Spawn without a key do not; a deadline too short for the
next try ends with the server's error.

Against real servers, a Spawn through a standby whose leader was just
killed is retried through NO_LEADER in test_client_failover_e2e.py.
"""

import asyncio
import threading
import unittest
from concurrent import futures
from typing import Dict, List

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from subagentd import AsyncClient, Client, NoLeader, Recovering, RetryPolicy
from subagents.v1 import subagents_pb2 as pb

FAST = RetryPolicy(initial_backoff=0.01, max_backoff=0.05, max_elapsed=5.0)


class Scripted:
    """Answers each method's first `refusals[method]` calls with `reason`."""

    def __init__(self, reason: str, refusals: Dict[str, int]) -> None:
        self.reason = reason
        self.refusals = dict(refusals)
        self.calls: Dict[str, int] = {}
        self.requests: List[object] = []
        self.lock = threading.Lock()

    def handle(self, method: str, request, context: grpc.ServicerContext):
        with self.lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            self.requests.append(request)
            refuse = self.refusals.get(method, 0) > 0
            if refuse:
                self.refusals[method] -= 1
        if refuse:
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain="subagentd"))
            context.abort_with_status(
                rpc_status.to_status(
                    status_pb2.Status(code=code_pb2.UNAVAILABLE, message=f"{self.reason}: try again", details=[detail])
                )
            )
        agent = pb.Agent(id="0190-agent", status=pb.AGENT_STATUS_RUNNING)
        return {
            "Spawn": lambda: pb.SpawnResponse(agent=agent),
            "Status": lambda: pb.StatusResponse(agents=[agent]),
            "Steer": lambda: pb.SteerResponse(agent=agent, delivery=pb.STEER_DELIVERY_DELIVERED),
            "Approve": lambda: pb.ApproveResponse(agent=agent),
        }[method]()


def serve(script: Scripted) -> "tuple[grpc.Server, str]":
    def handler(method: str, req, resp) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: script.handle(method, request, context),
            request_deserializer=req.FromString,
            response_serializer=resp.SerializeToString,
        )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "subagents.v1.AgentService",
                {
                    "Spawn": handler("Spawn", pb.SpawnRequest, pb.SpawnResponse),
                    "Status": handler("Status", pb.StatusRequest, pb.StatusResponse),
                    "Steer": handler("Steer", pb.SteerRequest, pb.SteerResponse),
                    "Approve": handler("Approve", pb.ApproveRequest, pb.ApproveResponse),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


class RetryTest(unittest.TestCase):
    def start(self, reason: str, **refusals: int) -> "tuple[Scripted, Client]":
        script = Scripted(reason, refusals)
        server, addr = serve(script)
        self.addCleanup(server.stop, None)
        client = Client(addr, retry=FAST, call_timeout=10)
        self.addCleanup(client.close)
        return script, client

    def test_status_retries_no_leader_until_answered(self) -> None:
        script, client = self.start("NO_LEADER", Status=3)
        self.assertEqual(client.status("0190-agent").id, "0190-agent")
        self.assertEqual(script.calls["Status"], 4)

    def test_spawn_retries_recovering_with_one_idempotency_key(self) -> None:
        script, client = self.start("RECOVERING", Spawn=2)
        client.spawn("coder", "x", background=True)
        self.assertEqual(script.calls["Spawn"], 3)
        keys = {r.idempotency_key for r in script.requests}
        self.assertEqual(len(keys), 1)
        self.assertNotEqual(keys, {""})

    def test_spawn_without_a_key_steer_and_approve_are_not_retried(self) -> None:
        script, client = self.start("NO_LEADER", Spawn=1, Steer=1, Approve=1)
        with self.assertRaises(NoLeader):
            client.spawn("coder", "x", idempotency_key="")
        with self.assertRaises(NoLeader):
            client.steer("0190-agent", "go on")
        with self.assertRaises(NoLeader):
            client.approve("0190-agent", "ap-1", True)
        self.assertEqual((script.calls["Spawn"], script.calls["Steer"], script.calls["Approve"]), (1, 1, 1))

    def test_a_deadline_too_short_for_another_try_raises_the_servers_error(self) -> None:
        script, client = self.start("RECOVERING", Status=1000)
        with self.assertRaises(Recovering) as raised:
            client.status("0190-agent", call_timeout=0.3)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertGreater(script.calls["Status"], 1)

    def test_the_async_client_retries_the_same_way(self) -> None:
        script = Scripted("NO_LEADER", {"Status": 2, "Steer": 1})
        server, addr = serve(script)
        self.addCleanup(server.stop, None)

        async def run() -> None:
            async with AsyncClient(addr, retry=FAST) as client:
                self.assertEqual([a.id for a in await client.status(["0190-agent"])], ["0190-agent"])
                with self.assertRaises(NoLeader):
                    await client.steer("0190-agent", "go on")

        asyncio.run(run())
        self.assertEqual((script.calls["Status"], script.calls["Steer"]), (3, 1))


if __name__ == "__main__":
    unittest.main()
