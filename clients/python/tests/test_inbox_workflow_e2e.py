"""The README-sized lead workflow, examples/inbox_workflow.py, against the
server: three background agents, the first to settle collected through the
lead's inbox and continued, the other two cancelled. And docs/clients.md
shows exactly the example's code.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import os
import subprocess
import sys
import unittest
from pathlib import Path

from subagentd import AgentStatus, Client

from test_workers_e2e import EXAMPLES, ROOT, TIMEOUT, Server

EXAMPLE = EXAMPLES / "inbox_workflow.py"
# The repository (the tests may run from a copy of tests/ and examples/).
REPO = Path(os.environ.get("SUBAGENTD_REPO", ROOT))


def example_code() -> str:
    """The example below its docstring: what docs/clients.md shows."""
    text = EXAMPLE.read_text()
    return text[text.index('"""', 3) + 3 :].strip()


class InboxWorkflowExample(unittest.TestCase):
    def test_it_collects_the_first_to_settle_continues_it_and_cancels_the_rest(self) -> None:
        server = Server()
        self.addCleanup(server.stop)
        run = subprocess.run(
            [sys.executable, str(EXAMPLE)],
            env={**os.environ, "SUBAGENTD_ADDR": server.addr},
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = run.stdout.splitlines()
        self.assertEqual(len(lines), 4, lines)
        _, first, status, result = lines[0].split(" ", 3)
        self.assertEqual((status, result), ("DONE", "the summary"), lines[0])
        _, more, status, result = lines[1].split(" ", 3)
        self.assertEqual((status, result), ("DONE", "the details"), lines[1])
        cancelled = [line.split() for line in lines[2:]]
        self.assertEqual([word for word, _ in cancelled], ["cancelled", "cancelled"])

        with Client(server.addr) as client:
            under_lead = {agent.id: agent for agent in client.list(lead_id="lead-42")}
            self.assertEqual(under_lead[first].status, AgentStatus.DONE)
            self.assertIsNotNone(under_lead[first].collected_time)
            self.assertEqual(client.status(more).continues_id, first)
            for _, id in cancelled:
                self.assertEqual(under_lead[id].status, AgentStatus.CANCELLED)
            self.assertEqual({first, *(id for _, id in cancelled)} - set(under_lead), set())

    def test_docs_clients_md_shows_the_example(self) -> None:
        docs = (REPO / "docs" / "clients.md").read_text()
        self.assertIn(f"```python\n{example_code()}\n```", docs)


if __name__ == "__main__":
    unittest.main()
