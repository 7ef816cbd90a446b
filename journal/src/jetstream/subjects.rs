//! Where a session lives in NATS: its virtual shard, its partition stream and its subjects.
//!
//! The hash is part of the storage format: changing it moves sessions to other subjects and streams, so it
//! is written out here (FNV-1a 64) rather than borrowed from a hasher whose output may change between
//! Rust releases. The session → shard hash itself is `turnstile_model::shard`, shared with the
//! cluster's shard leases.

use turnstile_model::SessionRef;
pub use turnstile_model::shard::{fnv1a64, shard_of};

/// Prefix of every durable event subject: `turnstile.ev.<p>.<tenant>.<session>`.
pub const EVENT_PREFIX: &str = "turnstile.ev";

/// Prefix of every archive subject: `turnstile.archive.<p>.<tenant>.<session>` (decision 0181), outside
/// `turnstile.ev.>` so that observers of the events never see an archive message.
pub const ARCHIVE_PREFIX: &str = "turnstile.archive";

/// Prefix of every live event subject: `turnstile.live.<tenant>.<session>.<type>`.
pub const LIVE_PREFIX: &str = "turnstile.live";

/// The partition (event stream) of a virtual shard: shard mod `partitions`. `partitions` 0 is read as 1.
pub fn partition_of(shard: u32, partitions: u32) -> u32 {
    shard % partitions.max(1)
}

/// The event stream of partition `p`.
pub fn stream_name(partition: u32) -> String {
    format!("TURNSTILE_EVENTS_{partition}")
}

/// The subjects of partition `p`'s stream: `turnstile.ev.<p>.>`.
pub fn stream_subjects(partition: u32) -> String {
    format!("{EVENT_PREFIX}.{partition}.>")
}

/// The durable subject of `session` in partition `p`.
pub fn event_subject(partition: u32, session: &SessionRef) -> String {
    format!("{EVENT_PREFIX}.{partition}.{}.{}", session.tenant, session.id)
}

/// The archive stream of partition `p`: a session's sealed history rewritten as few large messages.
pub fn archive_stream_name(partition: u32) -> String {
    format!("TURNSTILE_ARCHIVE_{partition}")
}

/// The subjects of partition `p`'s archive stream: `turnstile.archive.<p>.>`.
pub fn archive_stream_subjects(partition: u32) -> String {
    format!("{ARCHIVE_PREFIX}.{partition}.>")
}

/// The archive subject of `session` in partition `p`.
pub fn archive_subject(partition: u32, session: &SessionRef) -> String {
    format!("{ARCHIVE_PREFIX}.{partition}.{}.{}", session.tenant, session.id)
}

/// The sessions of one tenant in partition `p`: `turnstile.ev.<p>.<tenant>.*`.
pub fn tenant_filter(partition: u32, tenant: &str) -> String {
    format!("{EVENT_PREFIX}.{partition}.{tenant}.*")
}

/// The session named by a durable subject, if it is one (tenant and id are re-validated).
pub fn parse_event_subject(subject: &str) -> Option<SessionRef> {
    let rest = subject.strip_prefix(EVENT_PREFIX)?.strip_prefix('.')?;
    let mut parts = rest.split('.');
    let (_partition, tenant, id) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    SessionRef::new(tenant, id).ok()
}

/// The live subject of one event: `turnstile.live.<tenant>.<session>.<type>` with `/` written as `.`.
pub fn live_subject(session: &SessionRef, event_type: &str) -> String {
    format!("{LIVE_PREFIX}.{}.{}.{}", session.tenant, session.id, event_type.replace('/', "."))
}

/// Every live event of `session`: `turnstile.live.<tenant>.<session>.>`.
pub fn live_filter(session: &SessionRef) -> String {
    format!("{LIVE_PREFIX}.{}.{}.>", session.tenant, session.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(tenant: &str, id: &str) -> SessionRef {
        SessionRef::new(tenant, id).unwrap()
    }

    /// The session's shard is `turnstile_model::shard`'s, tested there; its partition is this module's.
    #[test]
    fn partitions_are_in_range() {
        for shard in 0..256 {
            assert!(partition_of(shard, 3) < 3);
        }
        assert_eq!(partition_of(7, 3), 1);
        assert_eq!(partition_of(7, 0), 0);
    }

    #[test]
    fn subjects_round_trip() {
        let a = s("acme", "sess-1_x");
        assert_eq!(event_subject(2, &a), "turnstile.ev.2.acme.sess-1_x");
        assert_eq!(parse_event_subject(&event_subject(2, &a)), Some(a.clone()));
        assert_eq!(parse_event_subject("turnstile.ev.2.acme"), None);
        assert_eq!(parse_event_subject("turnstile.ev.2.acme.a.b"), None);
        assert_eq!(parse_event_subject("other.ev.2.acme.a"), None);
        assert_eq!(live_subject(&a, "agent/inbox/claimed"), "turnstile.live.acme.sess-1_x.agent.inbox.claimed");
        assert_eq!(live_filter(&a), "turnstile.live.acme.sess-1_x.>");
        assert_eq!(stream_name(0), "TURNSTILE_EVENTS_0");
        assert_eq!(stream_subjects(1), "turnstile.ev.1.>");
        assert_eq!(archive_subject(2, &a), "turnstile.archive.2.acme.sess-1_x");
        assert_eq!(archive_stream_name(1), "TURNSTILE_ARCHIVE_1");
        assert_eq!(archive_stream_subjects(1), "turnstile.archive.1.>");
        // An archive subject is no session's event subject.
        assert_eq!(parse_event_subject(&archive_subject(2, &a)), None);
    }
}
