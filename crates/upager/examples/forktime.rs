//! What fork() costs with upager, measured from inside the fork
//! handlers: upager's `prepare` (the flush of writable file regions) and
//! `child` (pagers started and regions mapped again in the child) are
//! bracketed by handlers of this program registered before and after
//! upager's, so scheduling of the two processes is not in the figures.
//! Then the child's first read of an inherited region (one cold fold fill).
//!
//! Usage: forktime [REGIONS] [ROUNDS] [DIRTY_MIB]: REGIONS file regions of
//! 8 MiB each (default 1), all read once by the parent; DIRTY_MIB (up to 8) of the
//! first region written before each fork (default 0). Prints medians.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use upager::{MapOptions, Pager};

static PREP_START: AtomicU64 = AtomicU64::new(0);
static PREP_END: AtomicU64 = AtomicU64::new(0);
static CHILD_START: AtomicU64 = AtomicU64::new(0);
static CHILD_END: AtomicU64 = AtomicU64::new(0);

fn now() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

// Registered before upager's: prepare runs after upager's (LIFO), child
// before it (FIFO).
extern "C" fn outer_prepare() {
    PREP_END.store(now(), SeqCst);
}
extern "C" fn outer_child() {
    CHILD_START.store(now(), SeqCst);
}
// Registered after upager's: the other way round.
extern "C" fn inner_prepare() {
    PREP_START.store(now(), SeqCst);
}
extern "C" fn inner_child() {
    CHILD_END.store(now(), SeqCst);
}
extern "C" fn nothing() {}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1e3
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let regions: usize = a.get(1).map_or(1, |s| s.parse().unwrap());
    let rounds: usize = a.get(2).map_or(20, |s| s.parse().unwrap());
    let dirty_mib: u64 = a.get(3).map_or(0, |s| s.parse().unwrap());
    // SAFETY: registers plain functions that only store atomics.
    unsafe { libc::pthread_atfork(Some(outer_prepare), Some(nothing), Some(outer_child)) };
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let pager = Pager::new(128 << 20).unwrap();
    // SAFETY: as above.
    unsafe { libc::pthread_atfork(Some(inner_prepare), Some(nothing), Some(inner_child)) };
    let mut maps = Vec::new();
    for i in 0..regions {
        let path = dir.path().join(format!("r{i}"));
        std::fs::write(&path, vec![7u8; 8 << 20]).unwrap();
        let r = pager
            .map_file(&path, &MapOptions::new().writable(true))
            .unwrap();
        let s: u64 = r.words().iter().map(|w| w.load(SeqCst)).sum();
        assert!(s > 0);
        maps.push(r);
    }
    let (mut prep, mut child, mut read) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let words = maps[0].words();
        for w in words.iter().take(((dirty_mib << 20) / 8) as usize) {
            w.store(w.load(SeqCst), SeqCst); // a write: the folio is dirty
        }
        let mut fds = [0; 2];
        // SAFETY: a pipe into the live array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child reads one word, writes three numbers to the
        // pipe and _exits; the parent waits for it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let t = now();
            let v = maps[0].words()[0].load(SeqCst);
            let t_read = now() - t;
            let msg = [CHILD_END.load(SeqCst) - CHILD_START.load(SeqCst), t_read, v];
            // SAFETY: writes the array to the pipe and ends the child.
            unsafe {
                libc::write(fds[1], msg.as_ptr().cast(), 24);
                libc::_exit(0);
            }
        }
        let mut msg = [0u64; 3];
        // SAFETY: reads into the live array, waits for our child.
        unsafe {
            libc::close(fds[1]);
            assert_eq!(libc::read(fds[0], msg.as_mut_ptr().cast(), 24), 24);
            libc::close(fds[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert_eq!(msg[2], 0x0707_0707_0707_0707);
        prep.push(PREP_END.load(SeqCst) - PREP_START.load(SeqCst));
        child.push(msg[0]);
        read.push(msg[1]);
    }
    println!(
        "regions {regions} x 8 MiB, dirty {dirty_mib} MiB: prepare (write-back) {:.0} us, \
         child handler (pager started, regions mapped again) {:.0} us, \
         child's first read {:.0} us (medians of {rounds})",
        median(prep),
        median(child),
        median(read)
    );
}
