"""One lead's whole workflow against subagentd's AgentService.

As one lead (`lead_id`): watch the lead's agents, spawn three background
`simulated` agents that wait for a steer message, hit the global cap with a
fourth spawn and read its typed error (GlobalLimitReached), steer
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
from typing import Iterable, Optional

from google.rpc import error_details_pb2

from subagentd import Agent, Client, GlobalLimitReached, SubagentdError, Watch
from subagentd.errors import DOMAIN

# Guards against hangs only: every wait below ends on an event, not a time.
RPC_TIMEOUT = 30.0
MODEL = "acme/small"
STEER_MESSAGE = "go on"
AWAIT_TIMEOUT = 0.5

_print_lock = threading.Lock()


def say(*words: object) -> None:
    with _print_lock:
        print(*words, flush=True)


class Watcher:
    """A watch of one lead's agents, read on its own thread: prints each
    event and lets the main thread wait for a given event."""

    def __init__(self, client: Client, lead_id: str):
        self._watch: Watch = client.watch(lead_id=lead_id)
        # The server subscribes before it answers with response headers, so
        # once they are here no later event can be missed.
        self._watch.subscribed()
        self._seen: set[tuple[str, str]] = set()
        self._cond = threading.Condition()
        self._error: Optional[SubagentdError] = None
        self._thread = threading.Thread(target=self._read, name="watch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._watch:
                say("event", event.kind.name, event.agent.id, event.agent.status.name)
                with self._cond:
                    self._seen.add((event.kind.name, event.agent.id))
                    self._cond.notify_all()
        except SubagentdError as err:
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def wait_for(self, kind: str, ids: Iterable[str]) -> None:
        """Block until a `kind` event was seen for every id."""
        wanted = {(kind, i) for i in ids}
        with self._cond:
            ok = self._cond.wait_for(lambda: wanted <= self._seen or self._error is not None, timeout=RPC_TIMEOUT)
            if self._error is not None:
                raise self._error
            if not ok:
                missing = sorted(i for k, i in wanted - self._seen)
                raise SystemExit(f"no {kind} event within {RPC_TIMEOUT} s for {missing}")

    def close(self) -> None:
        self._watch.close()
        self._thread.join(timeout=RPC_TIMEOUT)


def spawn(client: Client, lead_id: str, n: int) -> Agent:
    return client.spawn(
        "simulated",
        f"output agent {n} waiting\nwait_steer\noutput agent {n} finished",
        model=MODEL,
        description=f"lead_workflow agent {n}",
        lead_id=lead_id,
        background=True,
        labels={"example": "lead_workflow"},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--addr", default="127.0.0.1:50051", help="subagentd address (host:port)")
    parser.add_argument("--lead", default="", help="lead id (default: a fresh one)")
    args = parser.parse_args()
    lead_id = args.lead or f"lead-{uuid.uuid4()}"

    # Plaintext, or TLS when SUBAGENTD_CA_FILE (and for mTLS
    # SUBAGENTD_CERT_FILE and SUBAGENTD_KEY_FILE) is set; SUBAGENTD_TOKEN,
    # when set, is sent as the API key.
    with Client(args.addr, call_timeout=RPC_TIMEOUT) as client:
        say("lead", lead_id)

        # 1. Watch the lead's agents before spawning, so no event is missed.
        watcher = Watcher(client, lead_id)
        say("watching", lead_id)
        try:
            return workflow(client, watcher, lead_id)
        finally:
            watcher.close()


def workflow(client: Client, watcher: Watcher, lead_id: str) -> int:
    # 2. Three background agents, each waiting for a steer message.
    ids = []
    for n in (1, 2, 3):
        agent = spawn(client, lead_id, n)
        ids.append(agent.id)
        say("spawned", agent.id, agent.status.name)
    watcher.wait_for("STARTED", ids)

    # 3. A fourth spawn while the three are live: with max_background_agents = 3
    #    the global cap is full and Spawn fails at once with GlobalLimitReached.
    try:
        extra = spawn(client, lead_id, 4)
    except GlobalLimitReached as err:
        say(
            "rejected",
            err.reason,
            f"code={err.code.name}",
            f"domain={DOMAIN}",
            f"limit={err.limit}",
            f"live={err.live}",
            f"config_key={err.config_key}",
        )
        for detail in err.details:
            if isinstance(detail, error_details_pb2.QuotaFailure):
                for v in detail.violations:
                    say("quota", v.subject, json.dumps(v.description, ensure_ascii=False))
    else:
        # The server's cap is above 3: nothing to reject. The lead cancel
        # below cleans this agent up too.
        ids.append(extra.id)
        say("spawned", extra.id, extra.status.name)
        print("note: the fourth spawn was accepted; run the server with max_background_agents = 3", file=sys.stderr)

    # 4. Steer the first agent: its run takes the message and finishes.
    steered = client.steer(ids[0], STEER_MESSAGE)
    say("steered", steered.agent.id, steered.delivery.name)
    watcher.wait_for("DONE", ids[:1])

    # 5. Await all of them briefly: one is DONE, the others still wait.
    awaited = client.await_(ids, timeout=AWAIT_TIMEOUT)
    counts: dict[str, int] = {}
    for a in awaited.agents:
        counts[a.status.name] = counts.get(a.status.name, 0) + 1
    say(
        "await",
        f"timed_out={str(awaited.timed_out).lower()}",
        f"done={counts.get('DONE', 0)}",
        f"running={counts.get('RUNNING', 0)}",
    )

    # 6. Cancel everything still live under the lead.
    cancelled_ids = [a.id for a in client.cancel(lead_id=lead_id, reason="lead_workflow finished")]
    say("cancelled", len(cancelled_ids), *cancelled_ids)
    watcher.wait_for("CANCELLED", cancelled_ids)

    # 7. Final states, oldest first.
    for a in client.list(lead_id=lead_id):
        say(
            "final",
            a.id,
            a.status.name,
            f"error={(a.error.code if a.error else '') or '-'}",
            f"result={json.dumps(a.result, ensure_ascii=False)}",
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SubagentdError as err:
        print(f"lead_workflow: {err.code.name}: {err.message}", file=sys.stderr)
        sys.exit(1)
