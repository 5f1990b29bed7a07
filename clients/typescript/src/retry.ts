// Backoff for retries (NO_LEADER, RECOVERING) and watch resumes.

import { Cancelled } from "./errors.js";

/** The first wait before a retry or resume; it doubles up to MAX_BACKOFF_MS. */
export const INITIAL_BACKOFF_MS = 50;
/** The longest wait between two retries or resumes. */
export const MAX_BACKOFF_MS = 2_000;

/** `ms` give or take a quarter, so that many clients do not retry in step. */
export function jitter(ms: number): number {
  return ms * (0.75 + Math.random() / 2);
}

/** The error a call that its signal aborted fails with. */
export function cancelled(signal: AbortSignal | undefined): Cancelled {
  return new Cancelled({
    code: "CANCELLED",
    message: "the call was cancelled",
    reason: undefined,
    domain: undefined,
    metadata: {},
    details: [],
    cause: signal?.reason,
  });
}

/** Resolves after `ms`, or rejects with Cancelled as soon as `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(cancelled(signal));
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(cancelled(signal));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
