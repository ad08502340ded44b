//! Kernel-call failures on demand, for tests (cargo feature `fail-inject`).
//!
//! The engine must survive results the kernel gives rarely: a refused
//! `UFFDIO_WRITEPROTECT`, a `process_madvise` that advised fewer bytes than
//! asked, a `UFFDIO_COPY` that stopped part-way with `EAGAIN`. Those are
//! hard to provoke on purpose, so with this feature the wrappers can be told
//! to give them: every `n`th call of a [`Call`] fails (or stops short) the
//! way the kernel does, and the call is counted in [`hits`]. Without the
//! feature [`fires`] is a constant `false` and nothing of this is compiled
//! in; the feature is enabled only for upager's own test builds (a
//! dev-dependency), never in a library users get.
//!
//! Process-wide: tests that use it run in their own test binary and one at
//! a time. Async-signal-safe (atomics only): a SIGBUS handler's fill may hit
//! an injected failure.

#[cfg(feature = "fail-inject")]
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A kernel call that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `UFFDIO_WRITEPROTECT` setting protection: refused with `ENOENT`
    /// before changing anything (the kernel may also have changed earlier
    /// VMAs; the engine must treat the whole range as unprotected either
    /// way).
    WriteProtect,
    /// `process_madvise(MADV_DONTNEED)` over several ranges: only the first
    /// half of them is advised and that byte count returned; over one
    /// range: `EAGAIN`, nothing advised.
    ProcessMadvise,
    /// `UFFDIO_COPY` of more than one page: only the first page is copied
    /// (installed as asked: writable or protected) and `EAGAIN` returned
    /// with that progress, as the kernel does when it is interrupted.
    Copy,
}

#[cfg(feature = "fail-inject")]
struct Knob {
    every: AtomicU64,
    calls: AtomicU64,
    hits: AtomicU64,
}

#[cfg(feature = "fail-inject")]
static KNOBS: [Knob; 3] = [const {
    Knob {
        every: AtomicU64::new(0),
        calls: AtomicU64::new(0),
        hits: AtomicU64::new(0),
    }
}; 3];

#[cfg(feature = "fail-inject")]
fn knob(c: Call) -> &'static Knob {
    &KNOBS[c as usize]
}

/// Makes every `every`th call of `call` fail from now on (1: all of them;
/// 0: none). Resets its call count.
#[cfg(feature = "fail-inject")]
pub fn set(call: Call, every: u64) {
    let k = knob(call);
    k.calls.store(0, Relaxed);
    k.every.store(every, Relaxed);
}

/// Injected failures of `call` so far (the process's lifetime).
#[cfg(feature = "fail-inject")]
pub fn hits(call: Call) -> u64 {
    knob(call).hits.load(Relaxed)
}

/// True if this call of `call` is to fail (counted).
#[cfg(feature = "fail-inject")]
#[inline]
pub(crate) fn fires(call: Call) -> bool {
    let k = knob(call);
    let every = k.every.load(Relaxed);
    if every == 0 || !(k.calls.fetch_add(1, Relaxed) + 1).is_multiple_of(every) {
        return false;
    }
    k.hits.fetch_add(1, Relaxed);
    true
}

/// Without the `fail-inject` feature nothing fails.
#[cfg(not(feature = "fail-inject"))]
#[inline(always)]
pub(crate) fn fires(_call: Call) -> bool {
    false
}

#[cfg(test)]
#[cfg(feature = "fail-inject")]
mod tests {
    use super::*;

    #[test]
    fn every_nth_call_fires_and_is_counted() {
        // Copy is not used by this crate's other unit tests.
        let h0 = hits(Call::Copy);
        set(Call::Copy, 3);
        let fired: Vec<bool> = (0..6).map(|_| fires(Call::Copy)).collect();
        set(Call::Copy, 0);
        assert_eq!(fired, [false, false, true, false, false, true]);
        assert_eq!(hits(Call::Copy) - h0, 2);
        assert!(!fires(Call::Copy));
    }
}
