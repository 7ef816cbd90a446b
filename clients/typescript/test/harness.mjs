// What the tests share: the servers the Rust side started (read from the environment), bounded waits,
// readers of a session's log, and a TCP proxy that can hold and drop a connection.
//
// The servers are real: tests/tests/typescript_client.rs starts `turnstile dev` (or a local cluster) on
// loopback ports it picked and passes their addresses here. Every wait is bounded by WAIT_MS and fails
// naming what it waited for: a wait that expires is a failure, never a timing assertion.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join } from "node:path";
import { fileURLToPath } from "node:url";
import { SessionStatus } from "../dist/index.js";

export const WAIT_MS = 30_000;

/**
 * The value of environment variable `name`, which the Rust side sets.
 * @param {string} name
 */
export function env(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(
      `${name} is not set: these tests run against servers tests/tests/typescript_client.rs starts ` +
        "(cargo nextest run -p turnstile-tests --test typescript_client)",
    );
  }
  return value;
}

/** A fresh session id. */
export function newId(prefix = "ts") {
  return `${prefix}-${randomUUID().slice(0, 12)}`;
}

/** A loopback address nothing listens on (a port that was just free): connections to it are refused. */
export async function refusingAddress() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const { port } = /** @type {net.AddressInfo} */ (server.address());
  await new Promise((resolve) => server.close(resolve));
  return `127.0.0.1:${port}`;
}

/**
 * `promise`, or a failure naming `what` after WAIT_MS.
 * @template T
 * @param {Promise<T>} promise
 * @param {string} what
 * @returns {Promise<T>}
 */
export async function bounded(promise, what, ms = WAIT_MS) {
  /** @type {NodeJS.Timeout | undefined} */
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The session's durable events, read with a Watch without live events up to its `caughtUp`.
 * @param {import("../dist/index.js").TurnstileClient} client
 * @param {string} session
 */
export async function replay(client, session) {
  /** @type {import("../dist/index.js").SessionEvent[]} */
  const events = [];
  for await (const item of client.watch(session, { live: false })) {
    if (item.item.case === "caughtUp") return events;
    if (item.item.case === "event") events.push(item.item.value);
  }
  throw new Error("the Watch ended before caughtUp");
}

/**
 * Items of `stream` up to the durable `agent/status idle` that follows `turn/end {turn}`. Reads with
 * `next()`, not `for await`, which would close the stream on leaving the loop: the caller may go on.
 * @param {AsyncIterator<import("../dist/index.js").WatchItem>} stream
 * @param {bigint} turn
 */
export async function untilIdleAfter(stream, turn) {
  /** @type {import("../dist/index.js").WatchItem[]} */
  const items = [];
  let ended = false;
  for (;;) {
    const next = await stream.next();
    if (next.done) throw new Error("the Watch ended early");
    const item = next.value;
    items.push(item);
    if (item.item.case !== "event") continue;
    const p = item.item.value.payload;
    if (p.case === "turnEnd" && p.value.turn === turn) ended = true;
    if (ended && p.case === "status" && p.value.status === SessionStatus.IDLE) return items;
  }
}

/** @param {import("../dist/index.js").WatchItem[]} items */
export const eventsOf = (items) => items.flatMap((i) => (i.item.case === "event" ? [i.item.value] : []));

/**
 * `[id, text]` of every message entered into a step (`user/message`).
 * @param {import("../dist/index.js").SessionEvent[]} events
 */
export function entered(events) {
  return events.flatMap((e) =>
    e.payload.case === "userMessage" && e.payload.value.message
      ? [[e.payload.value.message.id, e.payload.value.message.content.map((b) => (b.block.case === "text" ? b.block.value.text : "")).join("\n")]]
      : [],
  );
}

/**
 * The texts of the assistant messages.
 * @param {import("../dist/index.js").SessionEvent[]} events
 */
export const replies = (events) =>
  events.flatMap((e) => (e.payload.case === "assistantMessage" ? [e.payload.value.text] : []));

/**
 * Seqs are 1, 2, 3, ... with none missing or repeated.
 * @param {import("../dist/index.js").SessionEvent[]} events
 */
export function assertContiguous(events) {
  assert.deepEqual(
    events.map((e) => e.seq),
    events.map((_, i) => BigInt(i + 1)),
    "every durable seq once, in order",
  );
}

/**
 * A TCP proxy on 127.0.0.1:0 in front of `target` ("host:port"). `hold()` stops passing the server's bytes
 * to the client (they are dropped), `cut()` closes every connection: the client sees its connection lost
 * after the server has done what it asked.
 */
export class Proxy {
  /** @type {Set<net.Socket>} */
  #sockets = new Set();
  #holding = false;
  /** @type {net.Server} */
  #server;
  /** Connections accepted so far. */
  accepted = 0;

  /** @param {string} target */
  constructor(target) {
    const [host, port] = target.split(":");
    this.#server = net.createServer((down) => {
      this.accepted += 1;
      const up = net.connect(Number(port), host);
      for (const s of [down, up]) {
        this.#sockets.add(s);
        s.on("error", () => {});
        s.on("close", () => {
          this.#sockets.delete(s);
          down.destroy();
          up.destroy();
        });
      }
      down.pipe(up);
      up.on("data", (chunk) => {
        if (!this.#holding) down.write(chunk);
      });
    });
  }

  /** Listens; resolves with "127.0.0.1:PORT". */
  async start() {
    await new Promise((resolve) => this.#server.listen(0, "127.0.0.1", () => resolve(undefined)));
    const address = /** @type {net.AddressInfo} */ (this.#server.address());
    return `127.0.0.1:${address.port}`;
  }

  hold() {
    this.#holding = true;
  }

  /** Closes every connection (FIN, as a server that went away) and passes bytes again on new ones. */
  cut() {
    for (const s of this.#sockets) s.destroy();
    this.#holding = false;
  }

  close() {
    this.cut();
    this.#server.close();
  }
}

/**
 * Sends one command to the Rust side's control port (CONTROL_ADDR) and returns its answer, e.g.
 * `await control("kill-gateway 0")`. The Rust side answers `ok [VALUE]` or `error MESSAGE`.
 * @param {string} command
 */
export async function control(command) {
  const [host, port] = env("CONTROL_ADDR").split(":");
  const answer = await bounded(
    new Promise((resolve, reject) => {
      const socket = net.connect(Number(port), host, () => socket.write(`${command}\n`));
      let text = "";
      socket.setEncoding("utf8");
      socket.on("data", (d) => (text += d));
      socket.on("end", () => resolve(text.trim()));
      socket.on("error", reject);
    }),
    `the control port's answer to ${command}`,
    60_000,
  );
  const [status, ...rest] = String(answer).split(" ");
  if (status !== "ok") throw new Error(`control ${command}: ${answer}`);
  return rest.join(" ");
}

/** The repository's root (this file is clients/typescript/test/harness.mjs). */
const workspaceRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/**
 * The `turnstile` binary: TURNSTILE_BIN (which the Rust side honours too), else the one the Rust side
 * builds, `$CARGO_TARGET_DIR/debug/turnstile` (default `target/` of the repository).
 */
export function turnstileBin() {
  const bin = process.env.TURNSTILE_BIN;
  if (bin) return bin;
  const target = process.env.CARGO_TARGET_DIR;
  const dir = target ? (isAbsolute(target) ? target : join(workspaceRoot, target)) : join(workspaceRoot, "target");
  const built = join(dir, "debug", "turnstile");
  if (!existsSync(built)) throw new Error(`no turnstile binary at ${built}: set TURNSTILE_BIN or run cargo build -p turnstile`);
  return built;
}

/**
 * A `turnstile dev` of this suite's own (in memory, loopback ports it picks), for tests that need a second
 * server next to the one the Rust side started (an import into a cluster that does not have the sessions).
 * It runs under a shell that stops it when this process's end of its stdin closes, so it never outlives
 * the suite, even one killed with SIGKILL. `close()` stops it.
 */
export async function startDev() {
  const scratch = mkdtempSync(join(tmpdir(), "turnstile-ts-dev-"));
  const ready = join(scratch, "ready.json");
  const logPath = join(scratch, "turnstile-dev.log");
  const log = openSync(logPath, "w");
  const args = ["dev", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ready-file", ready];
  // `read` returns at EOF: when close() ends stdin or this process dies.
  const script = 'bin="$1"; shift; "$bin" "$@" </dev/null & pid=$!; read _ || true; kill $pid 2>/dev/null; wait $pid';
  const child = spawn("sh", ["-c", script, "sh", turnstileBin(), ...args], {
    stdio: ["pipe", log, log],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "info", NO_COLOR: "1" },
  });
  closeSync(log);
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve(code ?? signal)));
  const tail = () => readFileSync(logPath, "utf8").split("\n").slice(-40).join("\n");
  const close = async () => {
    child.stdin?.end();
    await bounded(exited, "the second turnstile dev to stop");
    rmSync(scratch, { recursive: true, force: true });
  };
  try {
    /** @type {{grpc: string, http: string}} */
    const bound = await bounded(
      (async () => {
        for (;;) {
          if (child.exitCode !== null) throw new Error(`turnstile dev exited (${child.exitCode}):\n${tail()}`);
          try {
            const json = JSON.parse(readFileSync(ready, "utf8"));
            if (json.grpc && json.http) return json;
          } catch {
            // Not written yet.
          }
          await new Promise((r) => setTimeout(r, 50));
        }
      })(),
      "the second turnstile dev's --ready-file",
    );
    await bounded(
      (async () => {
        for (;;) {
          const ok = await fetch(`http://${bound.http}/readyz`).then((r) => r.ok, () => false);
          if (ok) return;
          await new Promise((r) => setTimeout(r, 50));
        }
      })(),
      "the second turnstile dev's /readyz",
    );
    return { address: bound.grpc, httpAddress: bound.http, close, log: tail };
  } catch (e) {
    const logged = tail();
    await close().catch(() => {});
    throw new Error(`${e instanceof Error ? e.message : e}; its log:\n${logged}`, { cause: e });
  }
}
