/**
 * `@turnstile/client` for browsers: the same API as the Node entry, over gRPC-Web (`fetch`). The server
 * answers gRPC-Web on its HTTP port (the console's), to pages of its own origin. `serveTools` needs
 * bidirectional streams and is refused here (UNIMPLEMENTED): serve tools from Node.
 *
 * @packageDocumentation
 */

import type { Transport } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { ClientBase, type ClientOptions, type Connector } from "./client.js";

export * from "./common.js";

/**
 * A connector over gRPC-Web with the platform's `fetch`. fetch holds no connection the client could close,
 * so closing aborts the calls still open instead.
 */
export const webConnector: Connector = (baseUrl, interceptors) => {
  const inner = createGrpcWebTransport({ baseUrl, interceptors });
  const closed = new AbortController();
  const either = (signal: AbortSignal | undefined) => (signal ? AbortSignal.any([signal, closed.signal]) : closed.signal);
  const transport: Transport = {
    unary: (method, signal, timeoutMs, header, input, values) =>
      inner.unary(method, either(signal), timeoutMs, header, input, values),
    stream: (method, signal, timeoutMs, header, input, values) =>
      inner.stream(method, either(signal), timeoutMs, header, input, values),
  };
  return { transport, bidiStreams: false, close: () => closed.abort() };
};

/**
 * A client of one Turnstile deployment over gRPC-Web; see {@link ClientBase} for every method. The
 * address is the server's HTTP (console) port, e.g. `window.location.origin`.
 */
export class TurnstileClient extends ClientBase {
  constructor(options: ClientOptions = {}) {
    super(options, webConnector);
  }
}
