// Typed authentication and authorization errors from a server with
// `[auth] mode = "required"`, and the key sent from SUBAGENTD_TOKEN.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { PermissionDenied, SubagentdClient, SubagentdError, Unauthenticated } from "@subagentd/client";

import { Server, TIMEOUT_MS, config, newKey } from "./server.js";

describe("a server that requires keys", () => {
  let server: Server;
  let viewer: string;
  let frontend: string;

  before(async () => {
    const v = newKey("viewer1", "team-a", "viewer");
    const f = newKey("front1", "team-a", "frontend");
    viewer = v.key;
    frontend = f.key;
    server = await Server.start({ config: config(5, `\n[auth]\nmode = "required"\n${v.entry}${f.entry}`) });
  });

  after(async () => {
    await server.stop();
  });

  function client(token: string): SubagentdClient {
    return new SubagentdClient({ address: server.addr, token, timeoutMs: TIMEOUT_MS });
  }

  it("throws Unauthenticated with its cause for a call without a key", async () => {
    const anonymous = client("");
    try {
      await assert.rejects(anonymous.list().next(), (err: unknown) => {
        assert.ok(err instanceof Unauthenticated, String(err));
        assert.ok(err instanceof SubagentdError);
        assert.equal(err.code, "UNAUTHENTICATED");
        assert.equal(err.authCause, "missing");
        return true;
      });
    } finally {
      anonymous.close();
    }
  });

  it("rejects a watch without a key: `opened` and the iteration throw Unauthenticated, with no resume", async () => {
    const anonymous = client("");
    try {
      const watch = anonymous.watch({});
      await assert.rejects(watch.opened, Unauthenticated);
      await assert.rejects(async () => {
        for await (const _ of watch) {
          // no events
        }
      }, Unauthenticated);
      assert.equal(watch.resumes, 0);
    } finally {
      anonymous.close();
    }
  });

  it("throws PermissionDenied with the required roles when a viewer spawns", async () => {
    const reader = client(viewer);
    try {
      assert.deepEqual(await reader.awaitAgents({ leadId: "nobody", timeoutMs: 0 }), { agents: [], timedOut: false });
      await assert.rejects(reader.spawn({ agent: "simulated", prompt: "output x" }), (err: unknown) => {
        assert.ok(err instanceof PermissionDenied, String(err));
        assert.equal(err.code, "PERMISSION_DENIED");
        assert.ok(err.requiredRoles.includes("frontend"), `required roles ${err.requiredRoles}`);
        assert.match(err.method ?? "", /Spawn/);
        return true;
      });
    } finally {
      reader.close();
    }
  });

  it("sends the key from SUBAGENTD_TOKEN when none is given", async () => {
    process.env.SUBAGENTD_TOKEN = frontend;
    let fromEnv: SubagentdClient;
    try {
      fromEnv = new SubagentdClient({ address: server.addr, timeoutMs: TIMEOUT_MS });
    } finally {
      delete process.env.SUBAGENTD_TOKEN;
    }
    try {
      const agent = await fromEnv.spawn({ agent: "simulated", prompt: "output mine" });
      assert.equal(agent.tenant, "team-a");
      assert.equal(agent.result, "mine");
    } finally {
      fromEnv.close();
    }
  });
});
