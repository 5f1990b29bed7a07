"""A worker whose run delegates: it spawns two child agents through the
AgentService API (parent_id = its own agent id, so depth, limits and the
cancel cascade apply), awaits both, and returns their results.

Usage: python spawning_worker.py --addr 127.0.0.1:50051 --agents planner --child-agent simulated
Prints "ready <worker_id>" once connected.
"""

import argparse
import logging
import sys
import threading

import grpc
from google.protobuf import duration_pb2

from subagentd.worker import Run, RunFailed, Worker
from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc


def make_handler(addr: str, child_agent: str, child_model: str):
    agents = subagents_pb2_grpc.AgentServiceStub(grpc.insecure_channel(addr))

    def handle(run: Run) -> str:
        children = []
        for part in ("first half", "second half"):
            spawned = agents.Spawn(
                pb.SpawnRequest(
                    agent=child_agent,
                    model=child_model,
                    prompt=f"{part} of: {run.prompt}",
                    parent_id=run.id,
                    background=True,
                )
            )
            children.append(spawned.agent.id)
            run.output(f"spawned {spawned.agent.id}\n")
        done = agents.Await(pb.AwaitRequest(ids=children, timeout=duration_pb2.Duration(seconds=60)))
        if done.timed_out:
            raise RunFailed("CHILDREN_TIMED_OUT", "children did not finish within 60 s")
        failed = [a for a in done.agents if a.status != pb.AGENT_STATUS_DONE]
        if failed:
            raise RunFailed("CHILD_FAILED", f"{failed[0].id} ended {pb.AgentStatus.Name(failed[0].status)}")
        return "\n".join(a.result for a in done.agents)

    return handle


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:50051")
    p.add_argument("--agents", default="planner")
    p.add_argument("--child-agent", default="simulated")
    p.add_argument("--child-model", default="acme/small")
    p.add_argument("--capacity", type=int, default=1)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    worker = Worker(
        args.addr,
        agents=args.agents.split(","),
        capacity=args.capacity,
        name="spawning-worker",
        handler=make_handler(args.addr, args.child_agent, args.child_model),
    )

    def announce() -> None:
        worker.ready.wait()
        print(f"ready {worker.worker_id}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    worker.run()


if __name__ == "__main__":
    main()
