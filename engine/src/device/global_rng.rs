//! libtorch's random generator is one per process, and tch offers no generator of one's own.
//! Whoever draws from it (a drafter's random initialisation, a test's random tensors) holds
//! [`lock`] over the draws, and whoever seeds it holds [`seeded`]'s guard from the seed to the
//! last draw. Every draw in the process goes through one of the two, so what a seeded holder
//! draws depends on its own seed alone, whatever other threads do: a draw that skipped the lock
//! could land between another thread's seed and its draws and change them.
//!
//! The lock is reentrant on its thread, so a seeded test may build a drafter (which takes the
//! lock itself) without deadlocking. Another thread that draws waits, so a holder drops the
//! guard before it waits on threads of its own that draw.
use parking_lot::{ReentrantMutex, ReentrantMutexGuard};

static GENERATOR: ReentrantMutex<()> = ReentrantMutex::new(());

/// The generator, held by this thread until the guard drops.
pub fn lock() -> ReentrantMutexGuard<'static, ()> {
    GENERATOR.lock()
}

/// The generator seeded with `seed`, held by this thread until the guard drops: draws made
/// while it is held are a function of `seed`.
pub fn seeded(seed: i64) -> ReentrantMutexGuard<'static, ()> {
    let guard = lock();
    tch::manual_seed(seed);
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    fn draw(seed: i64) -> Tensor {
        let _rng = seeded(seed);
        // Nested, as a seeded test that builds a drafter takes it.
        let _again = lock();
        Tensor::randn([64], (Kind::Float, Device::Cpu))
    }

    #[test]
    fn seeded_draws_repeat_while_other_threads_draw() {
        let want = draw(17);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let noise = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _rng = lock();
                    let _ = Tensor::randn([64], (Kind::Float, Device::Cpu));
                }
            })
        };
        for _ in 0..200 {
            assert!(draw(17).equal(&want));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        noise.join().unwrap();
    }
}
