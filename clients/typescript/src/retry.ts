// Retries on UNAVAILABLE: exponential backoff with jitter, bounded by a deadline counted from the first
// failure since the last success, re-resolving the address before every new attempt.

import { Code } from "@connectrpc/connect";
import { TurnstileError } from "./errors.js";

/**
 * How calls that are safe to repeat are retried on UNAVAILABLE.
 *
 * Safe are the deliveries (`send`, `followup`, `queue`, `steer`, `inject`, `interrupt`,
 * `referenceSession`: a retry carries the same MessageId, which the session recognises and answers with
 * the original acceptance, SPEC §2), `createSchedule` and `setLabels` (the same again changes nothing),
 * the reads, and opening `exportSessions` (until its first item). Cancels, edits, decisions, goal changes,
 * forks, deletes (of sessions and schedules) and imports are never retried: a repeat after a lost reply
 * could act twice, or answers NOT_FOUND or ALREADY_EXISTS. `watch()` and `serveTools()` use the same policy
 * to reconnect.
 */
export interface RetryPolicy {
  /** Give up (rethrowing UNAVAILABLE) once this long has passed since the first failure. Default 30 000 ms. */
  deadlineMs: number;
  /** The first pause; each later one doubles, up to `maxBackoffMs`. Default 50 ms. */
  initialBackoffMs: number;
  /** The longest pause between attempts. Default 1 000 ms. */
  maxBackoffMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { deadlineMs: 30_000, initialBackoffMs: 50, maxBackoffMs: 1_000 };

/** A policy that never retries. */
export const NO_RETRY: RetryPolicy = { deadlineMs: 0, initialBackoffMs: 0, maxBackoffMs: 0 };

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * The attempts of one call or stream after UNAVAILABLE. `reconnect` is asked before each new attempt
 * (the client re-resolves its address there).
 */
export class Retries {
  private attempt = 0;
  private failingSince: number | undefined;

  constructor(
    private readonly policy: RetryPolicy,
    private readonly reconnect: () => Promise<void>,
  ) {}

  /** A call or stream item went through: the next failure starts a new deadline. */
  succeeded(): void {
    this.attempt = 0;
    this.failingSince = undefined;
  }

  /**
   * After `error`: rethrows it unless it is UNAVAILABLE and the deadline leaves room for another attempt;
   * otherwise waits out the backoff and reconnects.
   */
  async after(error: TurnstileError, signal?: AbortSignal): Promise<void> {
    if (error.code !== Code.Unavailable || signal?.aborted) throw error;
    const now = Date.now();
    this.failingSince ??= now;
    const { initialBackoffMs, maxBackoffMs, deadlineMs } = this.policy;
    const pause = Math.min(maxBackoffMs, initialBackoffMs * 2 ** this.attempt) * (0.5 + Math.random() / 2);
    if (deadlineMs <= 0 || now + pause - this.failingSince > deadlineMs) throw error;
    this.attempt += 1;
    await sleep(pause, signal);
    await this.reconnect();
  }
}
