// A few lines that every TypeScript caller of subagentd needs: load the
// AgentService from the repository's .proto files at run time (no generated
// code), call unary methods as promises, and read the google.rpc.ErrorInfo
// that every subagentd error status carries in its `grpc-status-details-bin`
// trailer.

import * as fs from "node:fs";
import * as path from "node:path";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as protobuf from "protobufjs";

/** ErrorInfo domain of every subagentd error. */
export const DOMAIN = "subagentd";

/** Repository root, from dist/ or src/ of clients/typescript. */
const REPO_ROOT = path.resolve(__dirname, "..", "..", "..");

/** Folder holding subagents/v1/subagents.proto (env SUBAGENTD_PROTO_DIR overrides). */
export const PROTO_DIR = process.env.SUBAGENTD_PROTO_DIR ?? path.join(REPO_ROOT, "proto");

/** Folder holding google/rpc/error_details.proto (env SUBAGENTD_PROTO_VENDOR_DIR overrides). */
export const PROTO_VENDOR_DIR =
  process.env.SUBAGENTD_PROTO_VENDOR_DIR ?? path.join(REPO_ROOT, "proto-vendor");

/**
 * Message objects as proto-loader builds them with LOADER_OPTIONS: field
 * names in lowerCamelCase, enums as their names (e.g. "AGENT_STATUS_RUNNING"),
 * 64-bit integers as decimal strings, unset scalars as their defaults.
 */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

// The fields of the subagents.v1 messages this client reads (see the proto
// for the rest: every message object carries all its fields).
export interface Agent {
  id: string;
  agent: string;
  model: string;
  leadId: string;
  parentId: string;
  rootId: string;
  status: string;
  result: string;
  error: { code: string; message: string } | null;
  labels: Record<string, string>;
  background: boolean;
  queueReason: string;
}

export interface WatchAgentsResponse {
  sequence: string;
  kind: string;
  agent: Agent;
  output: string;
}

/** The AgentService client: one method per RPC, named as in the proto. */
export type AgentServiceClient = grpc.Client & Record<string, Function>;

/** Adds `authorization: Bearer <token>` to every call. */
function bearer(token: string): grpc.Interceptor {
  return (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set("authorization", `Bearer ${token}`);
        next(metadata, listener);
      },
    });
}

/** TLS for `connect`: PEM files; any of them set means TLS. */
export interface TlsFiles {
  /** The CA to verify the server with (default: SUBAGENTD_CA_FILE; none: the system roots). */
  caFile?: string;
  /** A client certificate to present, with `keyFile` (default: SUBAGENTD_CERT_FILE). */
  certFile?: string;
  /** Its private key (default: SUBAGENTD_KEY_FILE). */
  keyFile?: string;
}

/** Channel credentials for `tls` (with the SUBAGENTD_* defaults): TLS when a file is named. */
function channelCredentials(tls: TlsFiles): grpc.ChannelCredentials {
  const caFile = tls.caFile ?? process.env.SUBAGENTD_CA_FILE;
  const certFile = tls.certFile ?? process.env.SUBAGENTD_CERT_FILE;
  const keyFile = tls.keyFile ?? process.env.SUBAGENTD_KEY_FILE;
  if (!caFile && !certFile && !keyFile) {
    return grpc.credentials.createInsecure();
  }
  if (!certFile !== !keyFile) {
    throw new Error("certFile and keyFile go together");
  }
  const read = (file?: string) => (file ? fs.readFileSync(file) : null);
  return grpc.credentials.createSsl(read(caFile), read(keyFile), read(certFile));
}

/**
 * Loads subagents.v1.AgentService from PROTO_DIR and connects to `addr` (host:port): over TLS
 * when `tls` or the SUBAGENTD_CA_FILE / SUBAGENTD_CERT_FILE / SUBAGENTD_KEY_FILE variables name
 * a file, plaintext otherwise. Calls carry `token` (default: the SUBAGENTD_TOKEN environment
 * variable) as a bearer key when it is set, for a server with `[auth] mode = "required"`.
 */
export function connect(
  addr: string,
  token: string = process.env.SUBAGENTD_TOKEN ?? "",
  tls: TlsFiles = {},
): AgentServiceClient {
  const definition = protoLoader.loadSync("subagents/v1/subagents.proto", {
    ...LOADER_OPTIONS,
    includeDirs: [PROTO_DIR],
  });
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const loaded = grpc.loadPackageDefinition(definition) as any;
  const AgentService = loaded.subagents.v1.AgentService as grpc.ServiceClientConstructor;
  const interceptors = token.trim() ? [bearer(token.trim())] : [];
  return new AgentService(addr, channelCredentials(tls), { interceptors }) as AgentServiceClient;
}

/** Calls unary method `method` (e.g. "Spawn") with a deadline; resolves to the response object. */
export function unary<Res>(
  client: AgentServiceClient,
  method: string,
  request: object,
  timeoutMs = 30_000,
): Promise<Res> {
  return new Promise((resolve, reject) => {
    client[method](
      request,
      { deadline: Date.now() + timeoutMs },
      (err: grpc.ServiceError | null, response: Res) => (err ? reject(err) : resolve(response)),
    );
  });
}

// google.rpc.Status is not vendored (only error_details.proto is): it is
// three fields, declared here.
const STATUS_PROTO = `
syntax = "proto3";
package google.rpc;
import "google/protobuf/any.proto";
message Status {
  int32 code = 1;
  string message = 2;
  repeated google.protobuf.Any details = 3;
}
`;

let errorRoot: protobuf.Root | undefined;

function errorTypes(): protobuf.Root {
  if (errorRoot === undefined) {
    const root = new protobuf.Root();
    // Imports of google/protobuf/*.proto come from protobufjs's bundled copies.
    root.resolvePath = (_origin, target) =>
      path.isAbsolute(target) ? target : path.join(PROTO_VENDOR_DIR, target);
    root.loadSync(["google/protobuf/any.proto", "google/rpc/error_details.proto"], { keepCase: true });
    protobuf.parse(STATUS_PROTO, root, { keepCase: true });
    root.resolveAll();
    errorRoot = root;
  }
  return errorRoot;
}

/** One unpacked status detail: its type (e.g. "google.rpc.ErrorInfo") and fields (proto names). */
export interface ErrorDetail {
  type: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  value: Record<string, any>;
}

export interface ErrorInfo {
  reason: string;
  domain: string;
  metadata: Record<string, string>;
}

/** The google.rpc.Status in the error's `grpc-status-details-bin` trailer, or null when it has none. */
export function richStatus(err: unknown): { code: number; message: string; details: ErrorDetail[] } | null {
  const metadata = (err as Partial<grpc.ServiceError>)?.metadata;
  if (!(metadata instanceof grpc.Metadata)) {
    return null;
  }
  const [bin] = metadata.get("grpc-status-details-bin");
  if (!Buffer.isBuffer(bin)) {
    return null;
  }
  const root = errorTypes();
  const status = root.lookupType("google.rpc.Status").decode(bin) as unknown as {
    code: number;
    message: string;
    details: { type_url: string; value: Uint8Array }[];
  };
  const details: ErrorDetail[] = [];
  for (const any of status.details) {
    const type = any.type_url.slice(any.type_url.lastIndexOf("/") + 1);
    const known = root.lookup(type);
    if (known instanceof protobuf.Type) {
      details.push({ type, value: known.toObject(known.decode(any.value), { defaults: true }) });
    }
  }
  return { code: status.code, message: status.message, details };
}

/** All unpacked details of the error (ErrorInfo, QuotaFailure, BadRequest, …) in the order sent. */
export function errorDetails(err: unknown): ErrorDetail[] {
  return richStatus(err)?.details ?? [];
}

/** The error's google.rpc.ErrorInfo, or null when it carries none. */
export function errorInfo(err: unknown): ErrorInfo | null {
  const detail = errorDetails(err).find((d) => d.type === "google.rpc.ErrorInfo");
  return detail ? (detail.value as ErrorInfo) : null;
}

/** ErrorInfo.reason of a subagentd error (e.g. "GLOBAL_LIMIT_REACHED"), or null. */
export function errorReason(err: unknown): string | null {
  const info = errorInfo(err);
  return info && info.domain === DOMAIN ? info.reason : null;
}
