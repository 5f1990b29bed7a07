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
from typing import Callable

from subagentd import AgentStatus, Client
from subagentd.worker import Run, RunFailed, Worker


def make_handler(client: Client, child_agent: str, child_model: str) -> Callable[[Run], str]:
    def handle(run: Run) -> str:
        children = []
        for part in ("first half", "second half"):
            child = client.spawn(
                child_agent, f"{part} of: {run.prompt}", model=child_model, parent_id=run.id, background=True
            )
            children.append(child.id)
            run.output(f"spawned {child.id}\n")
        done = client.await_(children, timeout=60)
        if done.timed_out:
            raise RunFailed("CHILDREN_TIMED_OUT", "children did not finish within 60 s")
        failed = [a for a in done.agents if a.status != AgentStatus.DONE]
        if failed:
            raise RunFailed("CHILD_FAILED", f"{failed[0].id} ended {failed[0].status.name}")
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
    with Client(args.addr) as client:
        worker = Worker(
            args.addr,
            agents=args.agents.split(","),
            capacity=args.capacity,
            name="spawning-worker",
            handler=make_handler(client, args.child_agent, args.child_model),
        )

        def announce() -> None:
            worker.ready.wait()
            print(f"ready {worker.worker_id}", flush=True)

        threading.Thread(target=announce, daemon=True).start()
        worker.run()


if __name__ == "__main__":
    main()
