//! Turnstile's wire contract: the public `turnstile.v1` gRPC API of docs/API.md, the durable event schema of
//! docs/SPEC.md §5 and the internal `turnstile.cluster.v1` gateway → worker API, generated from `proto/`.
//!
//! Place in the architecture: the wire format of the values of `turnstile-model`. The generated code is
//! here, and so is [`codec`], the one mapping between it and the model (both directions): the journal
//! encodes events with it, the gateway decodes requests with it, the cluster crate carries commands with
//! it. Decoding *is* validation, with errors that name the field.

pub mod codec;

/// `turnstile.v1`: public API and durable/live event messages.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("turnstile.v1");
}

impl v1::UserMessage {
    /// The message's text blocks, joined by newlines (data blocks are not text).
    pub fn text(&self) -> String {
        let texts = self.content.iter().filter_map(|b| match &b.block {
            Some(v1::content_block::Block::Text(t)) => Some(t.text.as_str()),
            _ => None,
        });
        texts.collect::<Vec<_>>().join("\n")
    }
}

/// `turnstile.cluster.v1`: the internal API between gateways and workers (not public).
pub mod cluster {
    /// The `Worker` service: a gateway forwards a command to the session's shard owner.
    pub mod v1 {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("turnstile.cluster.v1");
    }
}

/// `turnstile.hooks.v1`: the remote pre-step hook service a worker calls (SPEC §9).
pub mod hooks {
    pub mod v1 {
        #![allow(missing_docs, clippy::all, clippy::pedantic)]
        tonic::include_proto!("turnstile.hooks.v1");
    }
}

/// Encoded `FileDescriptorSet` of every Turnstile proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("turnstile_descriptor");
