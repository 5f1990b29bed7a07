"""End to end with grpcio and the typed client: a workspace type's run
hands its work back as a branch (`Agent.workspace`), and Spawn's
`workspace_base` refusals carry field violations that grpc-core accepts.

    SUBAGENTD_BIN=target/debug/subagentd python -m unittest discover -s clients/python/tests -v
"""

import os
import subprocess
import tempfile
import unittest

import grpc
from google.rpc import error_details_pb2, status_pb2

from subagentd import AgentStatus, Client, InvalidRequest, TranscriptEntryKind
from subagents.v1 import subagents_pb2 as pb

from test_workers_e2e import TIMEOUT, Server


def git(repo: str, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


class WorkspaceTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.repo = os.path.join(self.dir.name, "repo")
        os.mkdir(self.repo)
        git(self.repo, "init", "--quiet", "--initial-branch=main")
        with open(os.path.join(self.repo, "a.txt"), "w") as f:
            f.write("a\n")
        git(self.repo, "add", "--all")
        git(self.repo, "commit", "--quiet", "-m", "first")
        git(self.repo, "tag", "v1")
        script = os.path.join(self.dir.name, "edit.sh")
        with open(script, "w") as f:
            f.write('echo "$SUBAGENTD_AGENT_ID" > mine.txt\necho "$SUBAGENTD_BRANCH"\n')
        config = (
            "[limits]\nmax_background_agents = 10\n\n"
            f'[agents.coder]\nrunner = "command"\ncommand = ["sh", "{script}"]\n'
            f'workspace = "worktree"\nrepo = "{self.repo}"\n'
            f'root = "{os.path.join(self.dir.name, "worktrees")}"\n'
        )
        self.server = Server(config=config)
        self.addCleanup(self.server.stop)

    def test_a_run_leaves_its_work_on_a_branch_the_agent_names(self) -> None:
        with Client(self.server.addr) as c:
            agent = c.spawn("coder", "go", model="acme/m", workspace_base="v1", call_timeout=TIMEOUT)
            results = [e for e in c.transcript(agent.id) if e.kind == TranscriptEntryKind.RESULT]
        # The turn's RESULT entry carries the same workspace.
        self.assertEqual([e.workspace for e in results], [agent.workspace])
        self.assertEqual(agent.status, AgentStatus.DONE)
        ws = agent.workspace
        assert ws is not None
        self.assertEqual(ws.branch, f"subagentd/{agent.id}")
        self.assertEqual(agent.result.strip(), ws.branch)
        self.assertTrue(ws.kept)
        self.assertEqual(ws.base_commit, git(self.repo, "rev-parse", "v1"))
        self.assertEqual(ws.head_commit, git(self.repo, "rev-parse", ws.branch))
        self.assertEqual((ws.files_changed, ws.insertions, ws.deletions), (1, 1, 0))
        self.assertEqual(git(self.repo, "show", f"{ws.branch}:mine.txt"), agent.id)

    def test_an_unknown_workspace_base_is_refused_with_a_field_violation(self) -> None:
        # Raw grpcio: the status and its details as grpc-core hands them over.
        with self.assertRaises(grpc.RpcError) as caught:
            self.server.agents.Spawn(
                pb.SpawnRequest(agent="coder", model="acme/m", prompt="go", workspace_base="nope"),
                timeout=TIMEOUT,
            )
        err = caught.exception
        self.assertEqual(err.code(), grpc.StatusCode.INVALID_ARGUMENT)
        details = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin")
        self.assertIsNotNone(details)
        status = status_pb2.Status.FromString(details)
        fields = []
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                fields += [v.field for v in bad.field_violations]
        self.assertEqual(fields, ["workspace_base"])
        # The typed client: the same refusal as InvalidRequest; nothing was created.
        with Client(self.server.addr) as c:
            with self.assertRaises(InvalidRequest) as typed:
                c.spawn("coder", "go", model="acme/m", workspace_base="--orphan")
            self.assertEqual([v.field for v in typed.exception.violations], ["workspace_base"])
            self.assertEqual(list(c.list()), [])
        self.assertEqual(git(self.repo, "branch", "--list", "--format=%(refname:short)"), "main")


if __name__ == "__main__":
    unittest.main()
