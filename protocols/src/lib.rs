//! The agent protocols clients already speak (SPEC §19), served on the gateway's `--http` port.
//!
//! Place in the architecture: above `turnstile-gateway`, below `turnstile-node`. Each protocol is one
//! module that translates only: a request becomes calls of the gateway's own `turnstile.v1.Agent` service
//! methods, made in process with the caller's `authorization` metadata (so auth, tenancy, quotas, budgets and
//! validation are the gRPC API's, one code path), and a session's Watch becomes the protocol's events. No
//! adapter keeps state: every id it hands out encodes the session and log position that any gateway needs to
//! answer it, and the tenant always comes from the caller's token.
//!
//! [`router`] assembles the protocols the configuration switches on ([`Protocols`]); `node` merges it into
//! the ops HTTP router beside the console. Protocols: [`openai`] (the Responses and Conversations API),
//! [`agui`] (AG-UI), [`mcp`] (each agent a tool), [`a2a`] (A2A v1.0), all in docs/PROTOCOLS.md. Shared by
//! them: [`api`] (the gateway's service as a caller sees it), [`turn`] (a turn as the changes protocols
//! stream, at positions that resume anywhere), [`ids`], [`sse`], [`profiles`] (the agents a tenant may run)
//! and `admit` (the JSON-RPC protocols' door).

pub mod a2a;
mod admit;
pub mod agui;
pub mod api;
pub mod ids;
pub mod mcp;
pub mod openai;
pub mod profiles;
pub mod sse;
pub mod turn;

/// Stream positions per durable event (decision 0101): an event a protocol streams from durable event `seq`
/// is numbered `seq * SPAN + k`. Room for the deltas of a 16 MiB reply, and seqs up to 2^29 stay below
/// 2^53, the largest integer JavaScript clients read exactly.
pub const SPAN: u64 = 1 << 24;

use axum::Router;
use turnstile_gateway::Gateway;

/// Which protocols to serve, and what they need to know of the configuration.
#[derive(Clone, Debug, Default)]
pub struct Protocols {
    /// The OpenAI adapter (`[protocols] openai`); `None`: not served.
    pub openai: Option<openai::Agents>,
    /// The MCP server (`[protocols] mcp`).
    pub mcp: bool,
    /// A2A (`[protocols] a2a`).
    pub a2a: bool,
    /// The agent profiles the MCP server and A2A offer, per tenant.
    pub profiles: profiles::Profiles,
    /// The AG-UI adapter (`[protocols] agui`); `None`: not served.
    pub agui: Option<openai::Agents>,
}

/// The routes of every protocol switched on, answered by `gateway`'s service code.
pub fn router(gateway: Gateway, protocols: Protocols) -> Router {
    let mut router = Router::new();
    if let Some(agents) = protocols.openai {
        router = router.merge(openai::router(gateway.clone(), agents));
    }
    if let Some(agents) = protocols.agui {
        router = router.merge(agui::router(gateway.clone(), agents));
    }
    if protocols.mcp {
        router = router.merge(mcp::router(gateway.clone(), protocols.profiles.clone()));
    }
    if protocols.a2a {
        router = router.merge(a2a::router(gateway.clone(), protocols.profiles.clone()));
    }
    router
}
