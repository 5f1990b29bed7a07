"""End to end through `subagentd.Client` against the real binary on
loopback: every method, typed values, typed errors with their attributes,
and a watch that resumes across a server restart.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import os
import shutil
import tempfile
import unittest
import uuid
from datetime import timedelta, timezone

import grpc

from subagentd import (
    AgentNotFound,
    AgentStatus,
    Client,
    DeadlineExceeded,
    EventKind,
    GlobalLimitReached,
    InvalidRequest,
    NotLatest,
    PermissionDenied,
    SteerDelivery,
    TranscriptEntryKind,
    Unauthenticated,
    Unavailable,
    UnknownAgentType,
)
from subagentd.types import Event

from test_auth_e2e import auth_server, new_key
from test_workers_e2e import TIMEOUT, Server

CONFIG = """
[limits]
max_background_agents = {max_background}
default_concurrency = 0
max_concurrent_per_parent = 0

[agents.simulated]
runner = "simulated"
default_model = "acme/small"
"""


def server(max_background: int = 20, **kwargs) -> Server:
    return Server(config=CONFIG.format(max_background=max_background), **kwargs)


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = server(max_background=3)
        self.addCleanup(self.server.stop)
        self.client = Client(self.server.addr, call_timeout=TIMEOUT)
        self.addCleanup(self.client.close)
        self.lead = f"lead-{uuid.uuid4()}"

    def spawn(self, prompt: str, **kwargs):
        return self.client.spawn("simulated", prompt, model="acme/small", background=True, lead_id=self.lead, **kwargs)

    def test_spawn_status_and_a_listing_that_follows_page_tokens(self) -> None:
        ids = [self.spawn(f"output {n}", labels={"n": str(n)}).id for n in range(3)]
        done = self.client.await_(ids, timeout=timedelta(seconds=TIMEOUT))
        self.assertFalse(done.timed_out)
        self.assertEqual([a.id for a in done.agents], ids)
        one = self.client.status(ids[0])
        self.assertEqual((one.status, one.result, one.labels), (AgentStatus.DONE, "0", {"n": "0"}))
        self.assertEqual(one.created_at.tzinfo, timezone.utc)
        self.assertLessEqual(one.created_at, one.finished_at)
        self.assertIsNone(one.error)
        self.assertEqual(one.proto.id, ids[0])
        self.assertEqual([a.id for a in self.client.status(list(reversed(ids)))], list(reversed(ids)))
        # A page of 2 of 3 agents: the third comes only from the second page.
        listed = list(self.client.list(lead_id=self.lead, page_size=2))
        self.assertEqual([a.id for a in listed], ids)
        self.assertEqual(list(self.client.list(lead_id=self.lead, statuses=[AgentStatus.RUNNING])), [])

    def test_the_lead_inbox_returns_each_settled_agent_once(self) -> None:
        spawned = [self.spawn(f"output {n}").id for n in range(3)]
        seen = []
        while len(seen) < 3:
            answer = self.client.await_(lead_id=self.lead, mode="any", collect=True, timeout=TIMEOUT)
            self.assertFalse(answer.timed_out)
            for agent in answer.agents:
                self.assertEqual(agent.status, AgentStatus.DONE)
                self.assertIsNotNone(agent.collected_time)
                seen.append(agent.id)
        self.assertCountEqual(seen, spawned)
        again = self.client.await_(lead_id=self.lead, mode="any", collect=True, timeout=0.2)
        self.assertTrue(again.timed_out)
        self.assertEqual(again.agents, ())

    def test_steer_approve_cancel_and_the_transcript(self) -> None:
        steered = self.spawn("wait_steer\noutput after")
        answer = self.client.steer(steered.id, "go on")
        self.assertIn(answer.delivery, (SteerDelivery.DELIVERED, SteerDelivery.BUFFERED))
        gated = self.spawn("approve shell\noutput ran")
        paused = self.client.await_([gated.id], timeout=TIMEOUT).agents[0]
        self.assertEqual(paused.status, AgentStatus.AWAITING_APPROVAL)
        assert paused.approval is not None
        self.assertEqual(paused.approval.tool_name, "shell")
        self.client.approve(gated.id, paused.approval.id, True)
        sleeper = self.spawn("sleep 600000")
        cancelled = self.client.cancel(sleeper.id, reason="enough")
        self.assertEqual([(a.id, a.status) for a in cancelled], [(sleeper.id, AgentStatus.CANCELLED)])

        done = {a.id: a for a in self.client.await_([steered.id, gated.id], timeout=TIMEOUT).agents}
        self.assertEqual(done[steered.id].result, "steer: go on\nafter")
        self.assertEqual(done[gated.id].result, "approved: shell\nran")
        final = self.client.status(sleeper.id)
        assert final.error is not None
        self.assertEqual((final.status, final.error.code), (AgentStatus.CANCELLED, "CANCELLED"))

        # One entry per page: the iterator follows the tokens.
        entries = list(self.client.transcript(steered.id, page_size=1))
        self.assertEqual(
            [(e.kind, e.text) for e in entries],
            [
                (TranscriptEntryKind.PROMPT, "wait_steer\noutput after"),
                (TranscriptEntryKind.STEER, "go on"),
                (TranscriptEntryKind.RESULT, "steer: go on\nafter"),
            ],
        )
        self.assertEqual(entries[-1].status, AgentStatus.DONE)
        self.assertEqual(entries[0].time.tzinfo, timezone.utc)

    def test_server_info(self) -> None:
        info = self.client.server_info()
        self.assertTrue(info.version)
        self.assertIn(("simulated", "simulated"), [(t.name, t.runner) for t in info.agent_types])

    def test_typed_errors_carry_their_metadata(self) -> None:
        for n in range(3):
            self.spawn(f"sleep 600000\noutput {n}")
        with self.assertRaises(GlobalLimitReached) as full:
            self.spawn("output too many")
        e = full.exception
        self.assertEqual((e.limit, e.live, e.config_key), (3, 3, "limits.max_background_agents"))
        self.assertEqual(e.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.client.cancel(lead_id=self.lead)

        with self.assertRaises(InvalidRequest) as invalid:
            self.client.spawn("simulated", "", model="acme/small")
        self.assertIn("prompt", [v.field for v in invalid.exception.violations])
        with self.assertRaises(InvalidRequest) as both:
            self.client.await_(["x"], lead_id=self.lead)
        self.assertEqual([v.field for v in both.exception.violations], ["ids", "lead_id"])

        with self.assertRaises(UnknownAgentType) as unknown_type:
            self.client.spawn("nope", "x", model="acme/small")
        self.assertEqual((unknown_type.exception.agent, unknown_type.exception.known), ("nope", ["simulated"]))

        missing = str(uuid.uuid4())
        with self.assertRaises(AgentNotFound) as not_found:
            self.client.status(missing)
        self.assertEqual((not_found.exception.id, not_found.exception.field), (missing, "ids"))

        first = self.spawn("output one")
        self.client.await_([first.id], timeout=TIMEOUT)
        second = self.client.spawn(continue_from=first.id, prompt="output two", background=True)
        self.client.await_([second.id], timeout=TIMEOUT)
        with self.assertRaises(NotLatest) as not_latest:
            self.client.spawn(continue_from=first.id, prompt="output three", background=True)
        n = not_latest.exception
        self.assertEqual((n.id, n.latest_id, n.conversation_id), (first.id, second.id, first.id))

    def test_transport_errors_have_their_own_classes(self) -> None:
        sleeper = self.spawn("sleep 600000")
        with self.assertRaises(DeadlineExceeded) as late:
            self.client.await_([sleeper.id], timeout=30, call_timeout=0.3)
        self.assertEqual(late.exception.reason, "")
        # Nothing listens on port 1.
        with Client("127.0.0.1:1", call_timeout=5) as nowhere:
            with self.assertRaises(Unavailable) as down:
                nowhere.server_info()
        self.assertEqual(down.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_address_and_token_come_from_the_environment(self) -> None:
        saved = os.environ.get("SUBAGENTD_ADDR")
        os.environ["SUBAGENTD_ADDR"] = f"http://{self.server.addr}"
        try:
            with Client() as client:
                self.assertTrue(client.server_info().version)
        finally:
            if saved is None:
                del os.environ["SUBAGENTD_ADDR"]
            else:
                os.environ["SUBAGENTD_ADDR"] = saved


class AuthErrorsTest(unittest.TestCase):
    def test_unauthenticated_and_permission_denied(self) -> None:
        viewer, viewer_entry = new_key("viewer", "team-a", "viewer")
        s = auth_server([viewer_entry])
        self.addCleanup(s.stop)
        saved = os.environ.pop("SUBAGENTD_TOKEN", None)
        try:
            with Client(s.addr) as anonymous:
                with self.assertRaises(Unauthenticated) as caught:
                    anonymous.list().__next__()
            self.assertEqual(caught.exception.cause, "missing")
            os.environ["SUBAGENTD_TOKEN"] = viewer
            with Client(s.addr) as client:
                self.assertEqual(list(client.list()), [])
                with self.assertRaises(PermissionDenied) as denied:
                    client.cancel(str(uuid.uuid4()))
        finally:
            os.environ.pop("SUBAGENTD_TOKEN", None)
            if saved is not None:
                os.environ["SUBAGENTD_TOKEN"] = saved
        self.assertIn("frontend", denied.exception.required_roles)
        self.assertEqual(denied.exception.code, grpc.StatusCode.PERMISSION_DENIED)


class WatchResumeTest(unittest.TestCase):
    """A server restarts on the same port under an open watch: the
    iterator subscribes again by `after_sequence` and the events go on."""

    def until(self, watch, agent_id: str, kind: EventKind) -> "list[Event]":
        events = []
        for event in watch:
            events.append(event)
            if event.agent.id == agent_id and event.kind == kind:
                return events
        self.fail(f"the watch ended before {kind.name} of {agent_id}")

    def restart(self, env: dict) -> None:
        first = server(env=env)
        addr = first.addr
        client = Client(addr, call_timeout=TIMEOUT)
        self.addCleanup(client.close)
        lead = f"lead-{uuid.uuid4()}"
        # Sequences are server-wide: events of other agents first, so the
        # watch's last sequence is past all a fresh server will have issued.
        others = [client.spawn("simulated", "output other", background=True).id for _ in range(4)]
        client.await_(others, timeout=TIMEOUT)
        watch = client.watch(lead_id=lead)
        self.addCleanup(watch.close)
        watch.subscribed()
        a = client.spawn("simulated", "output before", background=True, lead_id=lead)
        before = self.until(watch, a.id, EventKind.DONE)
        last = before[-1].sequence
        first.stop()
        second = server(env=env, listen=addr)
        self.addCleanup(second.stop)
        b = client.spawn("simulated", "output after", background=True, lead_id=lead)
        self.assertEqual(client.await_([b.id], timeout=TIMEOUT).agents[0].status, AgentStatus.DONE)
        return watch, a, b, last

    def test_with_a_durable_store_the_watch_replays_what_it_missed(self) -> None:
        data = tempfile.mkdtemp(prefix="subagentd-watch-")
        self.addCleanup(shutil.rmtree, data, True)
        env = {"SUBAGENTD_STORE__BACKEND": "embedded", "SUBAGENTD_STORE__PATH": os.path.join(data, "store.redb")}
        watch, a, b, last = self.restart(env)
        after = self.until(watch, b.id, EventKind.DONE)
        self.assertGreaterEqual(watch.resumes, 1)
        # Replayed in order after the last event seen: b's life, nothing of
        # a twice, no snapshot.
        self.assertNotIn(EventKind.SNAPSHOT, [e.kind for e in after])
        self.assertTrue(all(e.sequence > last for e in after), [e.sequence for e in after])
        self.assertEqual([e.sequence for e in after], sorted({e.sequence for e in after}))
        self.assertEqual([e.kind for e in after if e.agent.id == b.id][-2:], [EventKind.STARTED, EventKind.DONE])
        self.assertNotIn((a.id, EventKind.DONE), [(e.agent.id, e.kind) for e in after])

    def test_with_a_memory_store_the_resume_yields_snapshots(self) -> None:
        watch, a, b, last = self.restart({"SUBAGENTD_STORE__BACKEND": "memory"})
        # The new server cannot replay after `last`: it sends the agents it
        # has as SNAPSHOT events, yielded like any other.
        event = next(watch)
        self.assertEqual((event.kind, event.agent.id, event.agent.status), (EventKind.SNAPSHOT, b.id, AgentStatus.DONE))
        self.assertEqual(watch.resumes, 1)


if __name__ == "__main__":
    unittest.main()
