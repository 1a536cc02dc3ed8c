//! Locks whose guarded data stays consistent at every step, so a thread that panicked while
//! holding one left nothing half-updated: the next user takes the lock as it is.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`'s guard, poisoned or not.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
