"""A watch through a standby across a failover, with the typed Client: two
servers on one PostgreSQL database; the leader is killed; the standby's
relayed stream breaks, the watch subscribes again (by `after_sequence`)
until the standby has taken the lease, and the events of the agents spawned
after the failover arrive on the same iterator, in order, none twice. The
spawn right after the kill is retried through NO_LEADER by the client.

Needs SUBAGENTD_TEST_POSTGRES (a server URL; `.ci/postgres.sh start` sets
it); skipped without it unless SUBAGENTD_REQUIRE_POSTGRES=1 (CI).
"""

import signal
import unittest

from subagentd import AgentStatus, Client, Event, EventKind, Watch

from test_standby_e2e import POSTGRES, REQUIRED, fresh_database, postgres_server
from test_workers_e2e import TIMEOUT, Server

CONFIG = """
[store]
backend = "postgres"
url = "{url}"

[ha]
lease_ttl = "2s"

[limits]
default_concurrency = 0

[agents.simulated]
runner = "simulated"
default_model = "acme/small"
"""

LEAD = "failover-lead"


def until_done(watch: Watch, agent_id: str, seen: "list[Event]") -> None:
    """Reads the watch until `agent_id` is DONE; every event goes to `seen`."""
    for event in watch:
        seen.append(event)
        if event.agent.id == agent_id and event.agent.status == AgentStatus.DONE:
            return
    raise AssertionError(f"the watch ended before {agent_id} was done")


@unittest.skipUnless(POSTGRES or REQUIRED, "SUBAGENTD_TEST_POSTGRES is not set")
class FailoverTest(unittest.TestCase):
    def test_a_watch_through_the_standby_resumes_across_a_failover(self) -> None:
        config = CONFIG.format(url=fresh_database())
        leader = postgres_server(config)
        self.addCleanup(self._stop, leader)
        leader.log_line("leading: serving")
        standby = postgres_server(config)
        self.addCleanup(self._stop, standby)
        standby.log_line("forwarding to the leader")

        client = Client(standby.addr, call_timeout=TIMEOUT)
        self.addCleanup(client.close)
        # A deadline for the whole watch guards against a hang only.
        watch = client.watch(lead_id=LEAD, call_timeout=4 * TIMEOUT)
        self.addCleanup(watch.close)
        watch.subscribed()

        seen: "list[Event]" = []
        before = client.spawn("simulated", "output before", lead_id=LEAD, background=True)
        until_done(watch, before.id, seen)
        self.assertEqual(watch.resumes, 0)

        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(timeout=TIMEOUT)
        # Spawned through the standby while it has no leader: NO_LEADER
        # until it takes the lease, retried by the client with the same
        # idempotency key.
        after = client.spawn("simulated", "output after", lead_id=LEAD, background=True)
        standby.log_line("leading: serving")
        until_done(watch, after.id, seen)

        self.assertGreaterEqual(watch.resumes, 1, "the watch never subscribed again")
        sequences = [event.sequence for event in seen]
        self.assertEqual(sequences, sorted(set(sequences)), "events out of order or twice")
        mine = [(e.agent.id, e.kind) for e in seen if e.kind != EventKind.SNAPSHOT]
        self.assertEqual(mine.count((before.id, EventKind.DONE)), 1, mine)
        self.assertEqual(mine.count((after.id, EventKind.DONE)), 1, mine)
        self.assertEqual(client.status(after.id).result, "after")

    @staticmethod
    def _stop(server: Server) -> None:
        if server.proc.poll() is None:
            server.stop()
        else:
            server.channel.close()
            server.reader.join(timeout=TIMEOUT)
            assert server.proc.stderr is not None
            server.proc.stderr.close()


if __name__ == "__main__":
    unittest.main()
