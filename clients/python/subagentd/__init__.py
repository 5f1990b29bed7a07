"""Python client and worker library for subagentd (`subagents.v1`).

The generated stubs live in the `subagents.v1` package (built from the
repository's proto/ when this package is installed):

    import grpc
    from subagents.v1 import subagents_pb2 as pb, subagents_pb2_grpc

    agents = subagents_pb2_grpc.AgentServiceStub(grpc.insecure_channel("127.0.0.1:50051"))

`subagentd.worker` serves runs of worker agent types.
"""

from .worker import ApprovalOutcome, Cancelled, Run, RunFailed, Worker

__all__ = ["ApprovalOutcome", "Cancelled", "Run", "RunFailed", "Worker"]
