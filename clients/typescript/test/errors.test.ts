// The error mapping: every ErrorInfo reason the server sends has its class
// (read from the server's source, src/api/status.rs), and a status becomes
// an instance of it with its metadata as typed attributes.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";

import { create } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  AgentBusy,
  Cancelled,
  DeadlineExceeded,
  GlobalLimitReached,
  NoLeader,
  PermissionDenied,
  REASONS,
  RateLimited,
  SubagentdError,
  TransportError,
  Unavailable,
  WatchLagged,
  toSubagentdError,
} from "@subagentd/client";

import {
  BadRequestSchema,
  ErrorInfoSchema,
  QuotaFailureSchema,
  RetryInfoSchema,
} from "../src/gen/google/rpc/error_details_pb.js";
import { REPO } from "./server.js";

/** The reasons the server sends: the values of `pub const REASON_*` in src/api/status.rs. */
function serverReasons(): string[] {
  const source = fs.readFileSync(path.join(REPO, "src", "api", "status.rs"), "utf8");
  const reasons = [...source.matchAll(/pub const REASON_\w+: &str = "(\w+)";/g)].map((m) => m[1]!);
  assert.ok(reasons.length >= 20, `found only ${reasons.length} reasons in status.rs: is SUBAGENTD_REPO right?`);
  return reasons;
}

function status(code: Code, reason: string, metadata: Record<string, string>, extra: { desc: any; value: any }[] = []) {
  return new ConnectError("server says no", code, undefined, [
    { desc: ErrorInfoSchema, value: { reason, domain: "subagentd", metadata } },
    ...extra,
  ]);
}

describe("errors", () => {
  it("map every reason the server sends to its own class, and no reason it does not send", () => {
    const server = serverReasons().sort();
    assert.deepEqual(Object.keys(REASONS).sort(), server);
    for (const [reason, cls] of Object.entries(REASONS)) {
      assert.equal(cls.reason, reason);
      const err = toSubagentdError(status(Code.FailedPrecondition, reason, {}));
      assert.ok(err instanceof cls, `${reason} becomes ${cls.name}`);
      assert.ok(err instanceof SubagentdError && err instanceof Error);
      assert.equal((err as SubagentdError).reason, reason);
      assert.equal((err as SubagentdError).name, cls.name);
    }
    assert.equal(new Set(Object.values(REASONS)).size, server.length, "one class per reason");
  });

  it("carry the code, the server's message and the metadata, typed", () => {
    const err = toSubagentdError(
      status(Code.ResourceExhausted, "GLOBAL_LIMIT_REACHED", { limit: "5", live: "5", config_key: "limits.max_background_agents" }, [
        { desc: QuotaFailureSchema, value: { violations: [{ subject: "limits.max_background_agents", description: "5 of 5" }] } },
      ]),
    );
    assert.ok(err instanceof GlobalLimitReached);
    assert.equal(err.code, "RESOURCE_EXHAUSTED");
    assert.equal(err.message, "server says no");
    assert.deepEqual([err.limit, err.live, err.configKey], [5, 5, "limits.max_background_agents"]);
    assert.deepEqual(err.metadata, { limit: "5", live: "5", config_key: "limits.max_background_agents" });
    assert.equal(err.detailsOf("google.rpc.QuotaFailure")[0]!.violations[0]!.description, "5 of 5");
    assert.ok(err.cause instanceof ConnectError, "the transport's error stays reachable");

    const busy = toSubagentdError(status(Code.FailedPrecondition, "AGENT_BUSY", { id: "a1", status: "AGENT_STATUS_RUNNING" }));
    assert.ok(busy instanceof AgentBusy);
    assert.deepEqual([busy.id, busy.status], ["a1", "running"]);

    const denied = toSubagentdError(status(Code.PermissionDenied, "PERMISSION_DENIED", { method: "/x/Spawn", required_roles: "frontend,admin" }));
    assert.ok(denied instanceof PermissionDenied);
    assert.deepEqual(denied.requiredRoles, ["frontend", "admin"]);

    const limited = toSubagentdError(
      status(Code.ResourceExhausted, "RATE_LIMITED", { tenant: "t", spawn_rate: "1/s", spawn_burst: "2", config_key: "tenants.t.spawn_rate" }, [
        { desc: RetryInfoSchema, value: { retryDelay: create(DurationSchema, { seconds: 1n, nanos: 500_000_000 }) } },
      ]),
    );
    assert.ok(limited instanceof RateLimited);
    assert.deepEqual([limited.tenant, limited.spawnBurst, limited.retryAfterMs], ["t", 2, 1500]);

    const lagged = toSubagentdError(status(Code.ResourceExhausted, "WATCH_LAGGED", { missed_events: "7", resume_after_sequence: "42" }));
    assert.ok(lagged instanceof WatchLagged);
    assert.deepEqual([lagged.missedEvents, lagged.resumeAfterSequence], [7, 42]);

    const invalid = toSubagentdError(
      status(Code.InvalidArgument, "INVALID_REQUEST", {}, [
        { desc: BadRequestSchema, value: { fieldViolations: [{ field: "prompt", description: "empty" }] } },
      ]),
    );
    assert.deepEqual((invalid as { violations: unknown }).violations, [{ field: "prompt", description: "empty" }]);
    assert.ok(toSubagentdError(status(Code.Unavailable, "NO_LEADER", {})) instanceof NoLeader);
  });

  it("give transport errors without an ErrorInfo a class per code", () => {
    const cases: [Code, Function, string][] = [
      [Code.DeadlineExceeded, DeadlineExceeded, "DEADLINE_EXCEEDED"],
      [Code.Unavailable, Unavailable, "UNAVAILABLE"],
      [Code.Canceled, Cancelled, "CANCELLED"],
      [Code.Internal, TransportError, "INTERNAL"],
      [Code.PermissionDenied, PermissionDenied, "PERMISSION_DENIED"],
    ];
    for (const [code, cls, name] of cases) {
      const err = toSubagentdError(new ConnectError("transport", code));
      assert.ok(err instanceof cls, `${name} becomes ${cls.name}`);
      assert.equal((err as SubagentdError).code, name);
      assert.equal((err as SubagentdError).reason, undefined);
    }
    // An ErrorInfo of another domain, or a reason the client does not know: a plain SubagentdError.
    const foreign = toSubagentdError(new ConnectError("x", Code.Unavailable, undefined, [
      { desc: ErrorInfoSchema, value: { reason: "NO_LEADER", domain: "example.com" } },
    ]));
    assert.equal((foreign as object).constructor, SubagentdError);
    const unknown = toSubagentdError(status(Code.Aborted, "SOMETHING_NEW", {}));
    assert.equal((unknown as object).constructor, SubagentdError);
    assert.equal((unknown as SubagentdError).reason, "SOMETHING_NEW");
    // Not an RPC error: unchanged.
    const own = new TypeError("mine");
    assert.equal(toSubagentdError(own), own);
  });
});
