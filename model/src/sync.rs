//! Poison-tolerant locking: the one recovering `lock` (and `read`/`write`) every crate uses.
//!
//! A `std` lock is poisoned when a thread panics while holding it, and every later `lock()` returns an
//! error. Where each critical section under a lock is a plain map or list operation, a send or a counter
//! (nothing that can stop halfway and leave the data torn), a poisoned lock still guards consistent data:
//! these helpers take the guard either way instead of spreading one panic to every later user. A lock
//! whose section could tear its data must not use them. Each crate's re-export says why its locks qualify.
//!
//! ```
//! use std::sync::Mutex;
//! let seen = Mutex::new(vec![1]);
//! turnstile_model::sync::lock(&seen).push(2);
//! assert_eq!(*turnstile_model::sync::lock(&seen), [1, 2]);
//! ```

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, taking the guard of a poisoned lock too.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `lock`, taking the guard of a poisoned lock too.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `lock`, taking the guard of a poisoned lock too.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_poisoned_lock_still_hands_out_its_data() {
        let data = Arc::new(Mutex::new(vec![1]));
        let held = Arc::clone(&data);
        let panicked = std::thread::spawn(move || {
            let _guard = held.lock();
            panic!("poison the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(data.is_poisoned());
        lock(&data).push(2);
        assert_eq!(*lock(&data), [1, 2]);
    }
}
