// @subagentd/client: a typed client of subagentd's gRPC AgentService.

export {
  type ApproveRequest,
  type AwaitRequest,
  type CallOptions,
  type CancelRequest,
  type ClientOptions,
  DEFAULT_AWAIT_TIMEOUT_MS,
  DEFAULT_TIMEOUT_MS,
  DEFAULT_WATCH_RESUME_TIMEOUT_MS,
  type ListRequest,
  type SpawnRequest,
  type SteerRequest,
  SubagentdClient,
  type TranscriptRequest,
} from "./client.js";
export { type ConnectionOptions, DEFAULT_ADDRESS, type TlsOptions } from "./connection.js";
export * from "./errors.js";
export * from "./types.js";
export { AgentWatch, type WatchRequest } from "./watch.js";
/** The generated messages and the AgentService descriptor (protobuf-es), for `raw` and `client.rpc`. */
export * as pb from "./gen/subagents/v1/subagents_pb.js";
