/**
 * `@turnstile/client` for Node: the client of Turnstile's public gRPC API (`turnstile.v1.Agent`) over
 * HTTP/2. Browsers get `./browser.js` instead (the package's `browser` export condition): the same API
 * over gRPC-Web.
 *
 * ```ts
 * import { TurnstileClient } from "@turnstile/client";
 * const client = new TurnstileClient({ address: "127.0.0.1:7400" });
 * const reply = await client.followup("my-session", "hello");
 * ```
 *
 * @packageDocumentation
 */

import type { SecureClientSessionOptions } from "node:http2";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ClientBase, type ClientOptions, type Connector } from "./client.js";

export * from "./common.js";

/**
 * A connector over HTTP/2 (`node:http2`). `nodeOptions` go to `http2.connect` (`ca`, `cert`, `key` for
 * TLS with `https://` addresses). The connection sends a PING every 10 s while a call is open and drops
 * it after 10 s without an answer, so a Watch through a gateway that vanished without closing its
 * connection (a cut network) notices and reopens.
 */
export function nodeConnector(nodeOptions: SecureClientSessionOptions = {}): Connector {
  return (baseUrl, interceptors) => {
    const sessionManager = new Http2SessionManager(baseUrl, { pingIntervalMs: 10_000, pingTimeoutMs: 10_000 }, nodeOptions);
    return {
      transport: createGrpcTransport({ baseUrl, interceptors, sessionManager }),
      bidiStreams: true,
      close: () => sessionManager.abort(),
    };
  };
}

/**
 * A client of one Turnstile deployment over HTTP/2; see {@link ClientBase} for every method.
 *
 * ```ts
 * const client = new TurnstileClient({ address: "127.0.0.1:7400", tenant: "acme" });
 * ```
 */
export class TurnstileClient extends ClientBase {
  constructor(options: ClientOptions = {}) {
    super(options, nodeConnector());
  }
}
