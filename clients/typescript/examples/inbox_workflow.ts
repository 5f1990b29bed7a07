// The lead workflow in a dozen lines: three agents in the background,
// collected through the lead's inbox as they finish, one continued, the rest
// cancelled. docs/clients.md shows the code below this comment, and
// test/inbox_workflow.e2e.test.ts runs it against the server.
//
//     SUBAGENTD_ADDR=127.0.0.1:50051 node dist/examples/inbox_workflow.js

import { SubagentdClient } from "@subagentd/client";

const client = new SubagentdClient(); // SUBAGENTD_ADDR and SUBAGENTD_TOKEN, or 127.0.0.1:50051
const leadId = "lead-42";
for (const prompt of ["output the summary", "sleep 60000", "sleep 60000"]) {
  await client.spawn({ agent: "simulated", prompt, model: "acme/small", leadId, background: true });
}

// Resolves once one has settled; collect: true hands each result over once.
const [first] = (await client.awaitAgents({ leadId, mode: "any", collect: true })).agents;
console.log("settled", first.id, first.status, first.result);

// Continue its conversation; a foreground spawn resolves once settled.
const more = await client.spawn({ prompt: "output the details", continueFrom: first.id });
console.log("continued", more.id, more.status, more.result);

for (const agent of await client.cancel({ leadId, reason: "got what I needed" })) {
  console.log("cancelled", agent.id);
}
client.close();
