//! Futex wait and wake on atomics: the one blocking primitive that is
//! async-signal-safe (a SIGBUS handler may wait on a folio's state word),
//! and the doorbells of the engine's threads.
//!
//! Private futexes (`FUTEX_PRIVATE_FLAG`): every waiter and waker is in
//! this process. A wait returns on a wake, when the word no longer holds the
//! expected value, on a signal, or at the timeout; callers re-check their
//! condition in a loop, so spurious returns are harmless.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

#[cfg(not(target_endian = "little"))]
compile_error!("upager's futex on the low half of a 64-bit state word assumes little-endian");

fn futex(addr: *const u32, op: i32, val: u32, timeout: Option<Duration>) -> libc::c_long {
    futex_raw(addr, op | libc::FUTEX_PRIVATE_FLAG, val, timeout)
}

/// The futex call itself; `op` carries `FUTEX_PRIVATE_FLAG` or not (a
/// shared futex: waiters in other processes that map the word match).
fn futex_raw(addr: *const u32, op: i32, val: u32, timeout: Option<Duration>) -> libc::c_long {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `addr` points into a live atomic owned by the caller (the
    // borrow in the public functions keeps it alive for the call); the
    // kernel only reads the 32-bit word there (FUTEX_WAIT) or uses the
    // address as a key (FUTEX_WAKE). `ts_ptr` is null or points to `ts`,
    // alive until the call returns. No memory is written.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            addr,
            op,
            val,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout` (None: no
/// limit). Returns false on timeout.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> bool {
    futex(word.as_ptr(), libc::FUTEX_WAIT, expected, timeout) == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ETIMEDOUT)
}

/// Wakes up to `n` threads waiting on `word`; returns how many woke.
pub fn wake(word: &AtomicU32, n: u32) -> usize {
    futex(
        word.as_ptr(),
        libc::FUTEX_WAKE,
        n.min(i32::MAX as u32),
        None,
    )
    .max(0) as usize
}

/// The low 32 bits of a 64-bit word (little-endian: its first four bytes).
fn low_half(word: &AtomicU64) -> *const u32 {
    word.as_ptr().cast::<u32>().cast_const()
}

/// [`wait`] on the low 32 bits of a 64-bit word: sleeps while they hold
/// `expected`. Whoever changes those bits and wakes with [`wake_low`] ends
/// the wait.
pub fn wait_low(word: &AtomicU64, expected: u32, timeout: Option<Duration>) -> bool {
    futex(low_half(word), libc::FUTEX_WAIT, expected, timeout) == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ETIMEDOUT)
}

/// Wakes every thread waiting in [`wait_low`] on `word`.
pub fn wake_low(word: &AtomicU64) -> usize {
    futex(low_half(word), libc::FUTEX_WAKE, i32::MAX as u32, None).max(0) as usize
}

/// [`wait_low`] on a word in memory that other processes map too (a
/// shared futex, without `FUTEX_PRIVATE_FLAG`): the page pool's state
/// words (pool.rs), which a filler in another process wakes.
pub fn wait_low_shared(word: &AtomicU64, expected: u32, timeout: Option<Duration>) -> bool {
    futex_raw(low_half(word), libc::FUTEX_WAIT, expected, timeout) == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ETIMEDOUT)
}

/// Wakes every thread, in any process, waiting in [`wait_low_shared`] on
/// `word`.
pub fn wake_low_shared(word: &AtomicU64) -> usize {
    futex_raw(low_half(word), libc::FUTEX_WAKE, i32::MAX as u32, None).max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn a_wait_ends_on_a_changed_value_a_wake_or_the_timeout() {
        let w = AtomicU32::new(1);
        assert!(wait(&w, 0, None), "value differs: returns at once");
        assert!(!wait(&w, 1, Some(Duration::from_millis(5))), "timeout");
        let w = Arc::new(AtomicU32::new(0));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, Some(Duration::from_secs(10)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, Ordering::Release);
        wake(&w, 1);
        t.join().unwrap();
    }

    #[test]
    fn the_low_half_of_a_64_bit_word() {
        let w = Arc::new(AtomicU64::new(0xffff_0000_0000_0004));
        assert!(wait_low(&w, 5, None), "low half is 4, not 5");
        assert!(!wait_low(&w, 4, Some(Duration::from_millis(5))));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) as u32 == 4 {
                wait_low(&w2, 4, Some(Duration::from_secs(10)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(0xffff_0000_0000_0002, Ordering::Release);
        wake_low(&w);
        t.join().unwrap();
    }
}
