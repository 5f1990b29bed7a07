"""End to end through `subagentd.AsyncClient` (grpc.aio) against the real
binary: the same methods as the sync client, async iterators for listings,
transcripts and watches, the same typed errors.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import unittest
import uuid

from subagentd import AgentNotFound, AgentStatus, AsyncClient, EventKind, GlobalLimitReached, TranscriptEntryKind

from test_client_e2e import server
from test_workers_e2e import TIMEOUT


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self) -> None:
        self.server = server(max_background=3)
        self.addCleanup(self.server.stop)
        self.lead = f"lead-{uuid.uuid4()}"

    async def test_every_method_and_a_watch(self) -> None:
        async with AsyncClient(self.server.addr, call_timeout=TIMEOUT) as client:
            watch = client.watch(lead_id=self.lead)
            await watch.subscribed()
            steered = await client.spawn("simulated", "wait_steer\noutput after", background=True, lead_id=self.lead)
            await client.steer(steered.id, "go on")
            gated = await client.spawn("simulated", "approve shell", background=True, lead_id=self.lead)
            paused = (await client.await_([gated.id], timeout=TIMEOUT)).agents[0]
            self.assertEqual(paused.status, AgentStatus.AWAITING_APPROVAL)
            assert paused.approval is not None
            await client.approve(gated.id, paused.approval.id, False, note="no")
            sleeper = await client.spawn("simulated", "sleep 600000", background=True, lead_id=self.lead)
            self.assertEqual([a.id for a in await client.cancel(lead_id=self.lead)], [sleeper.id])

            # Each settled agent once from the lead's inbox.
            settled = []
            while len(settled) < 3:
                answer = await client.await_(lead_id=self.lead, mode="any", collect=True, timeout=TIMEOUT)
                settled += [(a.id, a.status) for a in answer.agents]
            self.assertCountEqual(
                settled,
                [(steered.id, AgentStatus.DONE), (gated.id, AgentStatus.DONE), (sleeper.id, AgentStatus.CANCELLED)],
            )
            self.assertEqual((await client.status(gated.id)).result, "denied: shell: no")

            listed = [a.id async for a in client.list(lead_id=self.lead, page_size=1)]
            self.assertEqual(listed, [steered.id, gated.id, sleeper.id])
            kinds = [e.kind async for e in client.transcript(steered.id, page_size=2)]
            self.assertEqual(kinds, [TranscriptEntryKind.PROMPT, TranscriptEntryKind.STEER, TranscriptEntryKind.RESULT])
            self.assertTrue((await client.server_info()).version)

            ended = set()
            async for event in watch:
                if event.kind in (EventKind.DONE, EventKind.CANCELLED):
                    ended.add(event.agent.id)
                if len(ended) == 3:
                    break
            watch.close()
            self.assertEqual(ended, {steered.id, gated.id, sleeper.id})

    async def test_typed_errors(self) -> None:
        async with AsyncClient(self.server.addr, call_timeout=TIMEOUT) as client:
            missing = str(uuid.uuid4())
            with self.assertRaises(AgentNotFound) as not_found:
                await client.status([missing])
            self.assertEqual(not_found.exception.id, missing)
            for _ in range(3):
                await client.spawn("simulated", "sleep 600000", background=True, lead_id=self.lead)
            with self.assertRaises(GlobalLimitReached) as full:
                await client.spawn("simulated", "x", background=True, lead_id=self.lead)
            self.assertEqual((full.exception.limit, full.exception.live), (3, 3))
            await client.cancel(lead_id=self.lead)


if __name__ == "__main__":
    unittest.main()
