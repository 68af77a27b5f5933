//! libtorch's random generator is one per process. Whoever seeds it and then draws from it
//! (a drafter's random initialisation, a test's random tensors) holds [`lock`] from the seed
//! to the last draw, so what it draws depends on its own seed alone, whatever other threads do.
use std::sync::{Mutex, MutexGuard};

static GENERATOR: Mutex<()> = Mutex::new(());

/// The one lock over libtorch's process-wide generator. Not reentrant: a holder must not call
/// anything that takes it again (drafter initialisation in `train::replica` takes it itself).
pub fn lock() -> MutexGuard<'static, ()> {
    // A panicking holder leaves no invariant behind: the next holder seeds anew.
    GENERATOR
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
