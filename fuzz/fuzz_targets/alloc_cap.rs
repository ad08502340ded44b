//! A global allocator that aborts on any one allocation of more than
//! [`CAP`] bytes: no input of at most a few KiB may make a parser reserve
//! that much (a length field believed before the bytes behind it are
//! seen). libFuzzer's own -malloc_limit_mb needs a sanitizer's malloc
//! hooks, which these builds do not have; the abort is a crash libFuzzer
//! reports, with its input.
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write as _;

/// 64 MiB.
pub const CAP: usize = 64 << 20;

pub struct Capped;

// SAFETY: System's allocator, with a size check before each allocation.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn check(size: usize) {
    if size > CAP {
        // No allocation here (stderr is unbuffered).
        let _ = std::io::stderr().write_all(b"alloc_cap: one allocation of more than 64 MiB\n");
        std::process::abort();
    }
}

#[global_allocator]
static CAPPED: Capped = Capped;
