// The real subagentd binary on a loopback port, for the end-to-end tests:
// SUBAGENTD_BIN (default: target/debug/subagentd of the repository at
// SUBAGENTD_REPO, else the one this package sits in).

import { type ChildProcessByStdio, execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { createInterface } from "node:readline";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";

/** The repository root: SUBAGENTD_REPO, else three levels above dist/test/. */
export const REPO = path.resolve(
  process.env.SUBAGENTD_REPO ?? path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..", ".."),
);
export const BIN = path.resolve(process.env.SUBAGENTD_BIN ?? path.join(REPO, "target", "debug", "subagentd"));
/** Guards against hangs only; nothing waits for a time to pass. */
export const TIMEOUT_MS = 30_000;

/** Background agents of the `simulated` type, with no bucket or per-parent limit queueing them. */
export function config(maxBackground = 20, extra = ""): string {
  return `
[limits]
max_background_agents = ${maxBackground}
default_concurrency = 0
max_concurrent_per_parent = 0

[agents.simulated]
runner = "simulated"
default_model = "acme/small"
${extra}`;
}

export interface ServerOptions {
  readonly config?: string;
  /** Listen here (e.g. the port of a server that was stopped); default a free port. */
  readonly listen?: string;
  /** An embedded store in this directory; default the memory store. */
  readonly dataDir?: string;
  readonly env?: Record<string, string>;
}

/** subagentd serving on loopback; `addr` is its gRPC host:port, `http` its [http] listener's (/mcp). */
export class Server {
  readonly log: string[] = [];
  private readonly exited: Promise<void>;

  private constructor(
    private readonly proc: ChildProcessByStdio<null, null, Readable>,
    readonly addr: string,
    readonly http: string | undefined,
    private readonly configFile: string,
  ) {
    this.exited = new Promise((resolve) => proc.once("exit", () => resolve()));
  }

  static async start(options: ServerOptions = {}): Promise<Server> {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "subagentd-ts-"));
    const configFile = path.join(dir, "config.toml");
    fs.writeFileSync(configFile, options.config ?? config());
    const store: Record<string, string> =
      options.dataDir === undefined
        ? { SUBAGENTD_STORE__BACKEND: "memory" }
        : { SUBAGENTD_STORE__BACKEND: "embedded", SUBAGENTD_STORE__PATH: options.dataDir };
    const proc = spawn(BIN, ["serve", "--config", configFile, "--listen", options.listen ?? "127.0.0.1:0"], {
      stdio: ["ignore", "ignore", "pipe"],
      env: {
        ...process.env,
        // Several servers may run at once: no fixed metrics or HTTP port.
        SUBAGENTD_TELEMETRY__METRICS_LISTEN: "127.0.0.1:0",
        SUBAGENTD_HTTP__LISTEN: "127.0.0.1:0",
        SUBAGENTD_SERVER__SHUTDOWN_GRACE: "0s",
        ...store,
        ...options.env,
      },
    });
    const log: string[] = [];
    const lines = createInterface({ input: proc.stderr });
    let http: string | undefined;
    const addr = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`subagentd: not listening within ${TIMEOUT_MS} ms:\n${log.join("\n")}`)), TIMEOUT_MS);
      lines.on("line", (line) => {
        log.push(line);
        const addr = /subagentd listening.* addr=(\S+)/.exec(line)?.[1];
        if (addr !== undefined) {
          // `http=` is in the same line unless [http] listen is off.
          http = / http=(\S+)/.exec(line)?.[1];
          clearTimeout(timer);
          resolve(addr);
        }
      });
      proc.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`subagentd exited (${code}) before listening:\n${log.join("\n")}`));
      });
    });
    const server = new Server(proc, addr, http, configFile);
    server.log.push(...log);
    lines.on("line", (line) => server.log.push(line));
    return server;
  }

  /** The URL of its /mcp; fails when [http] listen is off. */
  get mcpUrl(): string {
    if (this.http === undefined) {
      throw new Error(`subagentd: no http= in the listening line:\n${this.log.join("\n")}`);
    }
    return `http://${this.http}/mcp`;
  }

  /** Stops the server (SIGTERM, or `signal`) and waits until it has exited. */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill(signal);
    }
    await this.exited;
    fs.rmSync(path.dirname(this.configFile), { recursive: true, force: true });
  }
}

/** A fresh API key of `tenant` with `roles`, and its config entry, as `subagentd keys new` prints them. */
export function newKey(id: string, tenant: string, ...roles: string[]): { key: string; entry: string } {
  const args = ["keys", "new", "--tenant", tenant, "--id", id, ...roles.flatMap((r) => ["--role", r])];
  const out = execFileSync(BIN, args, { encoding: "utf8" });
  const newline = out.indexOf("\n");
  return { key: out.slice(0, newline).trim(), entry: out.slice(newline + 1) };
}
