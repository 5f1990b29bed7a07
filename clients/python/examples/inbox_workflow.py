"""The lead workflow in a dozen lines: three agents in the background,
collected through the lead's inbox as they finish, one continued, the rest
cancelled. docs/clients.md shows the code below this docstring, and
tests/test_inbox_workflow_e2e.py runs it against the server.

    SUBAGENTD_ADDR=127.0.0.1:50051 python examples/inbox_workflow.py
"""

from subagentd import Client

with Client() as client:  # SUBAGENTD_ADDR and SUBAGENTD_TOKEN, or 127.0.0.1:50051
    lead = "lead-42"
    for prompt in ["output the summary", "sleep 60000", "sleep 60000"]:
        client.spawn("simulated", prompt, model="acme/small", lead_id=lead, background=True)

    # Returns once one has settled; collect=True hands each result over once.
    first = client.await_(lead_id=lead, mode="any", collect=True).agents[0]
    print("settled", first.id, first.status.name, first.result)

    # Continue its conversation; a foreground spawn returns once settled.
    more = client.spawn(prompt="output the details", continue_from=first.id)
    print("continued", more.id, more.status.name, more.result)

    for agent in client.cancel(lead_id=lead, reason="got what I needed"):
        print("cancelled", agent.id)
