//! [`Ownership`]: which sessions this worker may serve, and under which epoch. In a cluster the shard
//! leases answer ([`crate::cluster::Leases`]); a host without one (`turnstile dev`) owns every session.
//! The host asks it before it takes a command, each runner before every append.

use turnstile_model::SessionRef;

/// Which sessions this worker may serve, under which epoch: the shard leases in a cluster.
pub trait Ownership: Send + Sync + 'static {
    /// The epoch to serve `session` under, or the owner's address (when known) if this worker must not
    /// take commands for it (not its shard, or the shard is being handed over).
    fn accepting(&self, session: &SessionRef) -> Result<u64, Option<String>>;

    /// Whether a runner started under `epoch` may still append to `session`'s log. False as soon as the
    /// lease has lapsed by this worker's own clock, so a paused worker never writes after waking.
    fn may_write(&self, session: &SessionRef, epoch: u64) -> bool;
}
