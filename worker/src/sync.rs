//! Poison-tolerant locking for the worker's maps (the host's sessions, the leases held, a runner's marks),
//! from [`turnstile_model::sync`].
//!
//! No code under these locks can leave the data half-changed: the sections are map operations, channel
//! sends and counters, with no callback into other code. A lock poisoned by a panic elsewhere therefore
//! still guards consistent data, and the guard is taken either way instead of spreading the panic to every
//! session of the worker.

pub(crate) use turnstile_model::sync::lock;
