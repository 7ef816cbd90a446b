//! Session → virtual shard: the stable hash that both storage (partition streams) and ownership (shard
//! leases) are keyed by.
//!
//! The hash is part of the storage format: changing it moves sessions to other subjects and streams, so
//! it is written out here (FNV-1a 64) rather than borrowed from a hasher whose output may change between
//! Rust releases.

use crate::message::SessionRef;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bit. Stable by construction: the same bytes give the same value on every build and platform.
///
/// ```
/// assert_eq!(turnstile_model::shard::fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(FNV_PRIME))
}

/// The virtual shard of `session`: FNV-1a 64 of `"<tenant>/<id>"` mod `shards`. `shards` 0 is read as 1.
///
/// ```
/// use turnstile_model::{SessionRef, shard::shard_of};
/// let s = SessionRef::new("acme", "a").unwrap();
/// assert!(shard_of(&s, 256) < 256);
/// ```
pub fn shard_of(session: &SessionRef, shards: u32) -> u32 {
    let hash = fnv1a64(format!("{}/{}", session.tenant, session.id).as_bytes());
    // The remainder is below `shards`, a u32, so the cast cannot truncate.
    (hash % u64::from(shards.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(tenant: &str, id: &str) -> SessionRef {
        SessionRef::new(tenant, id).unwrap()
    }

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        // From the FNV reference test suite.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        let a = s("acme", "a");
        assert_eq!(shard_of(&a, 256), (fnv1a64(b"acme/a") % 256) as u32);
        assert_eq!(shard_of(&a, 256), shard_of(&a.clone(), 256));
        for n in 0..200 {
            assert!(shard_of(&s("t", &format!("s{n}")), 256) < 256);
        }
        assert_eq!(shard_of(&a, 0), 0);
    }
}
