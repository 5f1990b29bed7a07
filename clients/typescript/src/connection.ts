// Where and how to reach the server: the address, the bearer key and TLS,
// from the options or the same environment variables as the `subagentd` CLI.

import * as fs from "node:fs";

import type { Interceptor, Transport } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";

/** The address used when neither `address` nor SUBAGENTD_ADDR is set (the CLI's default). */
export const DEFAULT_ADDRESS = "http://127.0.0.1:50051";

/**
 * TLS material: each a PEM string (it contains "-----BEGIN") or the path of a PEM file. Any of them
 * set means TLS; `cert` and `key` go together (mTLS).
 */
export interface TlsOptions {
  /** The CA to verify the server with (default SUBAGENTD_CA_FILE; none: the system roots). */
  readonly ca?: string | Buffer;
  /** A client certificate to present (default SUBAGENTD_CERT_FILE). */
  readonly cert?: string | Buffer;
  /** Its private key (default SUBAGENTD_KEY_FILE). */
  readonly key?: string | Buffer;
}

export interface ConnectionOptions {
  /**
   * "host:port" or a URL (http:// plaintext, https:// TLS); default SUBAGENTD_ADDR, else
   * DEFAULT_ADDRESS. With TLS material an http:// address is reached over TLS.
   */
  readonly address?: string;
  /** API key sent as `authorization: Bearer <token>` (default SUBAGENTD_TOKEN; empty: none). */
  readonly token?: string;
  /** TLS material (default: the SUBAGENTD_CA_FILE / SUBAGENTD_CERT_FILE / SUBAGENTD_KEY_FILE files);
   *  `true`: TLS with the system roots; `false`: plaintext whatever the environment says. */
  readonly tls?: TlsOptions | boolean;
}

function pem(value: string | Buffer | undefined): Buffer | undefined {
  if (value === undefined || value === "") {
    return undefined;
  }
  if (Buffer.isBuffer(value)) {
    return value;
  }
  return value.includes("-----BEGIN") ? Buffer.from(value) : fs.readFileSync(value);
}

const env = (name: string): string | undefined => process.env[name] || undefined;

/** The base URL and TLS material `options` (with the environment's defaults) ask for. */
export function resolveConnection(options: ConnectionOptions): {
  baseUrl: string;
  token: string | undefined;
  tls: { ca?: Buffer; cert?: Buffer; key?: Buffer } | undefined;
} {
  let address = (options.address ?? env("SUBAGENTD_ADDR") ?? DEFAULT_ADDRESS).trim();
  if (!address.includes("://")) {
    address = `http://${address}`;
  }
  const given: TlsOptions =
    typeof options.tls === "object"
      ? options.tls
      : options.tls === false
        ? {}
        : { ca: env("SUBAGENTD_CA_FILE"), cert: env("SUBAGENTD_CERT_FILE"), key: env("SUBAGENTD_KEY_FILE") };
  const ca = pem(given.ca);
  const cert = pem(given.cert);
  const key = pem(given.key);
  if ((cert === undefined) !== (key === undefined)) {
    throw new TypeError("tls: cert and key go together");
  }
  const material = ca !== undefined || cert !== undefined;
  if ((material || options.tls === true) && address.startsWith("http://")) {
    address = `https://${address.slice("http://".length)}`;
  }
  const tls = address.startsWith("https://") ? { ca, cert, key } : undefined;
  const token = (options.token ?? env("SUBAGENTD_TOKEN") ?? "").trim();
  return { baseUrl: address, token: token === "" ? undefined : token, tls };
}

/** A gRPC (HTTP/2) transport to the server, and how to close its connection. */
export function connect(options: ConnectionOptions): { transport: Transport; close: () => void } {
  const { baseUrl, token, tls } = resolveConnection(options);
  const nodeOptions = tls === undefined ? {} : { ca: tls.ca, cert: tls.cert, key: tls.key };
  const sessionManager = new Http2SessionManager(baseUrl, {}, nodeOptions);
  const interceptors: Interceptor[] = [];
  if (token !== undefined) {
    const authorization = `Bearer ${token}`;
    interceptors.push((next) => (request) => {
      request.header.set("authorization", authorization);
      return next(request);
    });
  }
  const transport = createGrpcTransport({ baseUrl, sessionManager, interceptors });
  return { transport, close: () => sessionManager.abort() };
}
