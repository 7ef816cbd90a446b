//! Turnstile's wire contract: the public `turnstile.v1` gRPC API of API.md, the durable event schema of
//! SPEC.md §5 and the internal `turnstile.cluster.v1` gateway → worker API, generated from `proto/`.
//!
//! This crate sits at the bottom of the workspace (`proto ← journal ← worker, gateway ← cli`): it has no
//! behaviour, only types. The journal maps them to and from its domain model; the gateway serves them.

/// `turnstile.v1`: public API and durable/live event messages.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("turnstile.v1");
}

/// `turnstile.cluster.v1`: the internal API between gateways and workers (not public).
pub mod cluster {
    /// The `Worker` service: a gateway forwards a command to the session's shard owner.
    pub mod v1 {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("turnstile.cluster.v1");
    }
}

/// Encoded `FileDescriptorSet` of every Turnstile proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("turnstile_descriptor");
