"""One lead's whole workflow against subagentd's AgentService.

As one lead (`lead_id`): watch the lead's agents, spawn three background
`simulated` agents that wait for a steer message, hit the global cap with a
fourth spawn and read the ErrorInfo reason of the RESOURCE_EXHAUSTED, steer
one agent (it finishes), Await all three with a short timeout (it times out
with two still running), cancel the lead's remaining agents, and print every
agent's final state.

Run it against a server whose global cap is 3, so the fourth spawn is
rejected:

    SUBAGENTD_LIMITS__MAX_BACKGROUND_AGENTS=3 subagentd serve &
    python examples/lead_workflow.py --addr 127.0.0.1:50051

Every line it prints starts with a fixed word (`spawned`, `event`,
`rejected`, `steered`, `await`, `cancelled`, `final`, …), for grep.
"""

import argparse
import json
import sys
import threading
import uuid

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from subagentd.client import channel as open_channel
from subagentd.client import error_details, error_info
from subagents.v1 import subagents_pb2 as pb
from subagents.v1 import subagents_pb2_grpc

# Guards against hangs only: every wait below ends on an event, not a time.
RPC_TIMEOUT = 30.0
MODEL = "acme/small"
STEER_MESSAGE = "go on"
AWAIT_TIMEOUT = duration_pb2.Duration(nanos=500_000_000)

_print_lock = threading.Lock()


def say(*words: object) -> None:
    with _print_lock:
        print(*words, flush=True)


def status_name(status: int) -> str:
    return pb.AgentStatus.Name(status).removeprefix("AGENT_STATUS_")


def kind_name(kind: int) -> str:
    return pb.AgentEventKind.Name(kind).removeprefix("AGENT_EVENT_KIND_")


class Watcher:
    """A WatchAgents stream for one lead, read on its own thread: prints each
    event and lets the main thread wait for a given event."""

    def __init__(self, agents: subagents_pb2_grpc.AgentServiceStub, lead_id: str):
        self._call = agents.WatchAgents(pb.WatchAgentsRequest(lead_id=lead_id))
        # The server subscribes before it answers with response headers, so
        # once they are here no later event can be missed.
        self._call.initial_metadata()
        self._seen = set()
        self._cond = threading.Condition()
        self._error = None
        self._thread = threading.Thread(target=self._read, name="watch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._call:
                kind = kind_name(event.kind)
                say("event", kind, event.agent.id, status_name(event.agent.status))
                with self._cond:
                    self._seen.add((kind, event.agent.id))
                    self._cond.notify_all()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                with self._cond:
                    self._error = err
                    self._cond.notify_all()

    def wait_for(self, kind: str, ids) -> None:
        """Block until a `kind` event was seen for every id."""
        wanted = {(kind, i) for i in ids}
        with self._cond:
            ok = self._cond.wait_for(lambda: wanted <= self._seen or self._error, timeout=RPC_TIMEOUT)
            if self._error is not None:
                raise self._error
            if not ok:
                missing = sorted(i for k, i in wanted - self._seen)
                raise SystemExit(f"no {kind} event within {RPC_TIMEOUT} s for {missing}")

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=RPC_TIMEOUT)


def spawn(agents, lead_id: str, n: int) -> pb.Agent:
    prompt = f"output agent {n} waiting\nwait_steer\noutput agent {n} finished"
    request = pb.SpawnRequest(
        agent="simulated",
        model=MODEL,
        prompt=prompt,
        description=f"lead_workflow agent {n}",
        lead_id=lead_id,
        background=True,
        labels={"example": "lead_workflow"},
    )
    return agents.Spawn(request, timeout=RPC_TIMEOUT).agent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", default="127.0.0.1:50051", help="subagentd address (host:port)")
    parser.add_argument("--lead", default="", help="lead id (default: a fresh one)")
    args = parser.parse_args()
    lead_id = args.lead or f"lead-{uuid.uuid4()}"

    # Plaintext, or TLS when SUBAGENTD_CA_FILE (and for mTLS
    # SUBAGENTD_CERT_FILE and SUBAGENTD_KEY_FILE) is set; SUBAGENTD_TOKEN,
    # when set, is sent as the API key.
    with open_channel(args.addr) as channel:
        agents = subagents_pb2_grpc.AgentServiceStub(channel)
        say("lead", lead_id)

        # 1. Watch the lead's agents before spawning, so no event is missed.
        watcher = Watcher(agents, lead_id)
        say("watching", lead_id)
        try:
            return workflow(agents, watcher, lead_id)
        finally:
            watcher.close()


def workflow(agents, watcher: Watcher, lead_id: str) -> int:
    # 2. Three background agents, each waiting for a steer message.
    spawned = []
    for n in (1, 2, 3):
        agent = spawn(agents, lead_id, n)
        spawned.append(agent.id)
        say("spawned", agent.id, status_name(agent.status))
    ids = list(spawned)
    watcher.wait_for("STARTED", ids)

    # 3. A fourth spawn while the three are live: with max_background_agents = 3
    #    the global cap is full and Spawn fails at once with RESOURCE_EXHAUSTED.
    try:
        extra = spawn(agents, lead_id, 4)
    except grpc.RpcError as err:
        info = error_info(err)
        if info is None:
            raise
        meta = info.metadata
        say(
            "rejected",
            info.reason,
            f"code={err.code().name}",
            f"domain={info.domain}",
            f"limit={meta.get('limit', '')}",
            f"live={meta.get('live', '')}",
            f"config_key={meta.get('config_key', '')}",
        )
        for detail in error_details(err):
            if isinstance(detail, error_details_pb2.QuotaFailure):
                for v in detail.violations:
                    say("quota", v.subject, json.dumps(v.description, ensure_ascii=False))
    else:
        # The server's cap is above 3: nothing to reject. The lead cancel
        # below cleans this agent up too.
        ids.append(extra.id)
        say("spawned", extra.id, status_name(extra.status))
        print("note: the fourth spawn was accepted; run the server with max_background_agents = 3", file=sys.stderr)

    # 4. Steer the first agent: its run takes the message and finishes.
    steered = agents.Steer(pb.SteerRequest(id=ids[0], message=STEER_MESSAGE), timeout=RPC_TIMEOUT)
    say("steered", steered.agent.id, pb.SteerDelivery.Name(steered.delivery).removeprefix("STEER_DELIVERY_"))
    watcher.wait_for("DONE", ids[:1])

    # 5. Await all of them briefly: one is DONE, the others still wait.
    awaited = agents.Await(pb.AwaitRequest(ids=ids, timeout=AWAIT_TIMEOUT), timeout=RPC_TIMEOUT)
    counts = {}
    for a in awaited.agents:
        counts[status_name(a.status)] = counts.get(status_name(a.status), 0) + 1
    say(
        "await",
        f"timed_out={str(awaited.timed_out).lower()}",
        f"done={counts.get('DONE', 0)}",
        f"running={counts.get('RUNNING', 0)}",
    )

    # 6. Cancel everything still live under the lead.
    cancelled = agents.Cancel(
        pb.CancelRequest(lead_id=lead_id, reason="lead_workflow finished"), timeout=RPC_TIMEOUT
    )
    cancelled_ids = [a.id for a in cancelled.agents]
    say("cancelled", len(cancelled_ids), *cancelled_ids)
    watcher.wait_for("CANCELLED", cancelled_ids)

    # 7. Final states, oldest first.
    final = agents.Status(pb.StatusRequest(lead_id=lead_id), timeout=RPC_TIMEOUT)
    for a in final.agents:
        say(
            "final",
            a.id,
            status_name(a.status),
            f"error={a.error.code or '-'}",
            f"result={json.dumps(a.result, ensure_ascii=False)}",
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except grpc.RpcError as err:
        print(f"lead_workflow: {err.code().name}: {err.details()}", file=sys.stderr)
        sys.exit(1)
