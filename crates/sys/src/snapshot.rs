//! A value readers can use from a signal handler while writers replace it.
//!
//! [`SignalSafeCell`] is a minimal read-copy-update cell: a reader counts
//! itself in, loads the current pointer, uses the value and counts itself
//! out (three atomic operations, no allocation, no lock, no thread-local
//! state — what a SIGBUS handler may do). A writer swaps in a new value and
//! frees the old one only once it has seen no reader in flight after the
//! swap: every reader that could have loaded the old pointer counted
//! itself in before loading it, so it is done by then.
//!
//! Writers are serialised by a spin lock (a flag, so a fork child can clear
//! it: [`SignalSafeCell::replace_in_child`]) and may wait (microseconds: a
//! reader's window is a binary search). A writer must never run inside a
//! reader (never replace from a signal handler).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

/// See the module documentation.
pub struct SignalSafeCell<T> {
    ptr: AtomicPtr<T>,
    readers: AtomicUsize,
    /// Held by the one writer at work.
    writer: AtomicBool,
}

// SAFETY: readers on any thread get `&T` (needs T: Sync); a writer drops
// the old value on its own thread (needs T: Send).
unsafe impl<T: Send + Sync> Sync for SignalSafeCell<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Send for SignalSafeCell<T> {}

impl<T> SignalSafeCell<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> Self {
        SignalSafeCell {
            ptr: AtomicPtr::new(Box::into_raw(Box::new(value))),
            readers: AtomicUsize::new(0),
            writer: AtomicBool::new(false),
        }
    }

    /// Calls `f` with the current value. Async-signal-safe if `f` is.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        self.readers.fetch_add(1, SeqCst);
        let p = self.ptr.load(SeqCst);
        // SAFETY: `p` came from Box::into_raw and is freed only by `update`
        // after it observed `readers == 0` following the swap that retired
        // it; this reader counted itself in before loading `p`, so `p` stays
        // valid until the fetch_sub below.
        let r = f(unsafe { &*p });
        self.readers.fetch_sub(1, SeqCst);
        r
    }

    /// Replaces the value with `f(current)` and frees the old one once no
    /// reader can hold it. Writers run one at a time.
    pub fn update(&self, f: impl FnOnce(&T) -> T) {
        let mut spins = 0u32;
        while self
            .writer
            .compare_exchange_weak(false, true, SeqCst, SeqCst)
            .is_err()
        {
            backoff(&mut spins);
        }
        let _unlock = Unlock(&self.writer); // also if `f` panics
        let cur = self.ptr.load(SeqCst);
        // SAFETY: only writers free values, and they are serialised by
        // `writer`, which this thread holds: `cur` is live.
        let new = Box::into_raw(Box::new(f(unsafe { &*cur })));
        let old = self.ptr.swap(new, SeqCst);
        let mut spins = 0u32;
        while self.readers.load(SeqCst) != 0 {
            backoff(&mut spins);
        }
        // SAFETY: `old` is retired (no longer reachable through `ptr`) and
        // no reader was in flight after the swap, so none holds it.
        drop(unsafe { Box::from_raw(old) });
    }

    /// Replaces the value in a fork child, where this is the only thread:
    /// the threads of the parent that were reading or replacing it at the
    /// fork do not exist here, so their reader counts and the writer lock
    /// are cleared, and the old value is leaked, not dropped (it may refer
    /// to the parent's threads and state, which the child must not touch).
    ///
    /// Call it only in a fork child before it starts a thread or installs a
    /// handler that reads this cell (a `pthread_atfork` child handler); in
    /// any other place it is still memory safe but may leak a value and
    /// let a concurrent writer's value be lost.
    pub fn replace_in_child(&self, value: T) {
        let new = Box::into_raw(Box::new(value));
        // The old value is leaked on purpose (see above).
        let _old = self.ptr.swap(new, SeqCst);
        self.readers.store(0, SeqCst);
        self.writer.store(false, SeqCst);
    }
}

/// Releases the writer lock when dropped.
struct Unlock<'a>(&'a AtomicBool);

impl Drop for Unlock<'_> {
    fn drop(&mut self) {
        self.0.store(false, SeqCst);
    }
}

/// Spin, then yield, then sleep 20 µs per round.
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else if *spins < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

impl<T> Drop for SignalSafeCell<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or writer is active.
        drop(unsafe { Box::from_raw(*self.ptr.get_mut()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn readers_see_whole_values_while_writers_replace_them() {
        let cell = Arc::new(SignalSafeCell::new(vec![0u64; 16]));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (c, s, n) = (Arc::clone(&cell), Arc::clone(&stop), Arc::clone(&reads));
                std::thread::spawn(move || {
                    while !s.load(Ordering::Relaxed) {
                        c.read(|v| {
                            assert!(v.iter().all(|x| *x == v[0]), "torn value {v:?}");
                        });
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Replace while the readers run (at least 2,000 times, and until
        // they have read 10,000 times: on 2 CPUs they may start late).
        let start = std::time::Instant::now();
        let mut i = 0u64;
        while i < 2000 || reads.load(Ordering::Relaxed) < 10_000 {
            i += 1;
            cell.update(|_| vec![i; 16]);
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "readers never ran"
            );
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        cell.read(|v| assert_eq!(v[0], i));
    }
}
