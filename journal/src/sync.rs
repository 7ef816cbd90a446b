//! Poison-tolerant locking for the journal's in-memory maps and caches ([`turnstile_model::sync`]).
//!
//! Every critical section under these locks is a plain insert, lookup, removal, push or clone that cannot
//! leave the data half-changed, so a panic elsewhere that poisoned a lock leaves consistent data behind:
//! the guard is taken either way. A lock whose section could tear its data must not use these.

pub(crate) use turnstile_model::sync::{lock, read, write};
