//! Poison-tolerant locking for the journal's in-memory maps and caches.
//!
//! Every critical section under these locks is a plain insert, lookup, removal, push or clone that cannot
//! leave the data half-changed, so a panic elsewhere that poisoned a lock leaves consistent data behind:
//! the guard is taken either way. A lock whose section could tear its data must not use these.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
