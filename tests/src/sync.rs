//! The harness's one poison-tolerant lock. The harness depends on `turnstile-proto` alone (see the crate
//! doc), so it keeps this copy of `turnstile_model::sync::lock` rather than taking the model crate for it.
//!
//! Every section under these locks pushes to, clones or replaces a record of what a test observed; a
//! panic in one (a failing assertion elsewhere) leaves consistent data, so the guard is taken either way.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
