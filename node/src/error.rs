//! [`NodeError`]: why a role could not start or stopped, in words that say what was wrong and how to fix it.

use std::path::PathBuf;

use turnstile_config::ConfigError;
use turnstile_gateway::auth::AuthError;
use turnstile_journal::JournalError;
use turnstile_ops::tls::TlsError;

/// Why a role (`dev`, `gateway`, `worker`) could not start, or stopped with an error.
///
/// Every message is complete by itself: what was wrong, and where possible the flag or key to change. The
/// cause of a variant is kept as a field for callers that match on it, and is also part of the message, so
/// no variant has a [`std::error::Error::source`] (an error chain printed with `{:#}` says it once).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The configuration file could not be read or was refused; the message names the file, line and key.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A command-line flag contradicts another flag or the configuration file.
    #[error("{0}")]
    Flags(String),
    /// The configuration's agents cannot run here: a model's `api_key_env` names an unset variable, a
    /// provider cannot be set up, a tool is not available, an MCP server does not start. The message names the file (when there is one),
    /// the agent or model and the variable, never a key's value.
    #[error("{}{cause}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
    Agents { file: Option<PathBuf>, cause: turnstile_agent::AgentSetupError },
    /// `--listen` is taken by another process.
    #[error("{listen} is in use; pass --listen 127.0.0.1:0 or another port")]
    ListenInUse { listen: String },
    /// `--listen` cannot be bound for another reason.
    #[error("cannot listen on {listen}; pass --listen HOST:PORT: {cause}")]
    Listen { listen: String, cause: std::io::Error },
    /// An explicit `--http` is taken by another process.
    #[error("{addr} is in use; pass --http 127.0.0.1:0 or another port")]
    HttpInUse { addr: String },
    /// `--http` cannot be bound for another reason.
    #[error("cannot listen on {addr}; pass --http HOST:PORT: {cause}")]
    HttpListen { addr: String, cause: std::io::Error },
    /// The operating system did not say which address a listener got.
    #[error("cannot read the bound address: {0}")]
    LocalAddr(std::io::Error),
    /// `--auth-tokens` or `--jwt-key` could not be loaded; `flag` names which.
    #[error("{flag}: {cause}")]
    Auth { flag: &'static str, cause: AuthError },
    /// The handler of a signal the server acts on (SIGHUP: reload the auth files) cannot be installed.
    #[error("cannot listen for {signal}: {cause}")]
    Signal { signal: &'static str, cause: std::io::Error },
    /// Serving without auth on an address other than loopback.
    #[error("{0}")]
    Exposure(AuthError),
    /// A worker's internal API on an address other than loopback without client certificates (mTLS with
    /// the cluster CA, decision 0026): anyone who reaches the port could run commands on any session.
    #[error(
        "refusing to serve the worker API on {listen} without cluster credentials; pass --tls-cert, --tls-key and \
         --tls-client-ca (the cluster CA that signs the gateways' --cluster-tls-cert), or listen on loopback"
    )]
    WorkerExposed { listen: String },
    /// A TLS file could not be loaded; `flag` names which option.
    #[error("{flag}: {cause}")]
    Tls { flag: &'static str, cause: TlsError },
    /// NATS did not answer at `url`.
    #[error("cannot reach NATS at {url}: {detail}; start nats-server with -js or pass the right --nats")]
    NatsUnreachable { url: String, detail: String },
    /// NATS answered but its JetStream journal cannot be used (another layout, no JetStream, …).
    #[error("cannot use the JetStream journal at {url}: {cause}")]
    Journal { url: String, cause: JournalError },
    /// The shard lease and worker buckets cannot be opened or watched.
    #[error("cannot use the shard lease buckets on NATS at {url}: {cause}; check that nats-server runs with -js")]
    Membership { url: String, cause: turnstile_cluster::MembershipError },
    /// The gateway could not subscribe to client tool cancels.
    #[error("cannot serve client tools over NATS at {url}: {cause}")]
    ToolHub { url: String, cause: async_nats::SubscribeError },
    /// The gateway could not open the quota counts it shares with the other gateways.
    #[error("cannot share the tenants' quotas over NATS at {url}: {cause}")]
    Quotas { url: String, cause: String },
    /// The embedded journal in `--data-dir` cannot be opened.
    #[error("cannot open the journal in {}; check --data-dir: {cause}", dir.display())]
    DataDir { dir: PathBuf, cause: JournalError },
    /// Sessions that were running when the last process stopped could not be loaded again.
    #[error("cannot resume the sessions that were running: {0}")]
    Resume(turnstile_worker::host::HostError),
    /// The agent definitions (SPEC §20) cannot be read or the file's agents imported.
    #[error("cannot read or import the agent definitions: {0}")]
    AgentStore(JournalError),
    /// The bound addresses could not be printed.
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
    /// `--ready-file` is a directory path such as `/` or `..`.
    #[error("--ready-file {} names no file", path.display())]
    ReadyFileName { path: PathBuf },
    /// `--ready-file` could not be written.
    #[error("cannot write --ready-file {}: {cause}", path.display())]
    ReadyFile { path: PathBuf, cause: std::io::Error },
    /// The public gRPC server failed.
    #[error("the gRPC server stopped: {0}")]
    Serve(turnstile_gateway::ServeError),
    /// The internal worker gRPC server failed.
    #[error("the internal gRPC server stopped: {0}")]
    WorkerServe(tonic::transport::Error),
    /// A server task panicked.
    #[error("the server task panicked: {0}")]
    Panicked(tokio::task::JoinError),
}

impl NodeError {
    /// The error of a JetStream journal at `url` that could not be opened: an unreachable server names the
    /// URL and how to start one; anything else names the URL and the journal's reason.
    pub(crate) fn nats(url: &str, err: JournalError) -> Self {
        match err {
            JournalError::Unavailable(detail) => {
                // The journal's message already says "cannot connect to NATS at <url>: "; say it once.
                let prefix = format!("cannot connect to NATS at {url}: ");
                let detail = detail.strip_prefix(&prefix).map(str::to_owned).unwrap_or(detail);
                Self::NatsUnreachable { url: url.to_owned(), detail }
            }
            cause => Self::Journal { url: url.to_owned(), cause },
        }
    }

    /// The cluster's ownership buckets cannot be used at `url`.
    pub(crate) fn membership(url: &str, cause: turnstile_cluster::MembershipError) -> Self {
        Self::Membership { url: url.to_owned(), cause }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_nats_is_named_with_the_fix() {
        let url = "nats://127.0.0.1:1";
        let err = JournalError::Unavailable(format!("cannot connect to NATS at {url}: connection refused"));
        assert_eq!(
            NodeError::nats(url, err).to_string(),
            "cannot reach NATS at nats://127.0.0.1:1: connection refused; start nats-server with -js or pass \
             the right --nats"
        );
        let err = JournalError::Storage("stream TURNSTILE_EVENTS_0 exists with replicas = 3".into());
        assert!(NodeError::nats(url, err).to_string().starts_with("cannot use the JetStream journal at nats://"));
    }

    #[test]
    fn no_variant_repeats_its_cause_as_a_source() {
        let err = NodeError::Listen { listen: "h:1".into(), cause: std::io::Error::other("boom") };
        assert!(std::error::Error::source(&err).is_none());
        assert_eq!(err.to_string(), "cannot listen on h:1; pass --listen HOST:PORT: boom");
    }
}
