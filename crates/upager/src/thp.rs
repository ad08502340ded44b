//! Staged huge pages: 2 MiB folios enter the view as one PMD-mapped
//! transparent huge page.
//!
//! A fill of a 2 MiB folio takes a *staged* huge page from this pool, reads
//! the store into it, and moves it into the view with one `UFFDIO_MOVE`
//! (3.7-6.3 µs per 2 MiB, against 572-744 µs for `UFFDIO_COPY`, probe
//! movethp.c): the application then runs on one TLB entry per folio, and
//! eviction zaps one PMD. The pool is refilled off the fault path by the
//! reclaimer: it touches a 2 MiB-aligned `MADV_HUGEPAGE` buffer, so the
//! kernel allocates and zeroes a huge page there, checks with
//! `PAGEMAP_SCAN` that it got one, and charges it to the budget (staged
//! pages are resident memory). A fill that finds no staged page, or whose
//! move is refused, copies base pages as before and counts
//! `thp_fill_fallback`; it never fails for want of a huge page. Only
//! writable regions get huge pages: the kernel moves pages only between
//! writable mappings (`validate_move_areas`), and a read-only region's view
//! is `PROT_READ` (its 2 MiB fills copy and count as fallbacks). Staged
//! pages use at most an eighth of the budget (one per 16 MiB, at most 16;
//! none under 16 MiB).
//!
//! Regions of smaller folios use the same pool for their 2 MiB runs read
//! in sequence (mixed folio sizes; huge.rs): a run of N folios
//! is filled, protected, digested and recycled exactly like one 2 MiB
//! folio.
//!
//! Evicted huge pages are recycled: the slots are registered with the
//! pager's first userfaultfd (write-protect mode only: touching them faults
//! nothing to the engine), so eviction can move a PMD-mapped 2 MiB folio
//! out of the view into an empty slot (`recycle`, one `UFFDIO_MOVE`)
//! instead of zapping it. The next fill reads over it and moves it back
//! in: no huge page is freed and allocated again, and the kernel zeroes
//! none. On this KVM guest (virtio-balloon free page reporting, order 9) a
//! freshly allocated huge page cost 0.17 ms median and 0.6-1.1 ms mean to
//! fault in and zero (up to 5.6 ms at p90), 54% of all CPU samples of a
//! 2 GiB scan through 256 MiB (perf, 2026-11-25). The move costs one TLB
//! flush per folio (the unmap it replaces was one per batch).
//!
//! Rules:
//! - A slot is taken with `try_lock` only (a SIGBUS handler may take one);
//!   a taken slot holds a huge page iff `ready`. A recycled page is not
//!   `fresh` (it holds an old folio's data: the fill reads over all of it,
//!   zero-filling what the store lacks).
//! - Budget: a ready slot holds one folio's charge. The fill charged its
//!   folio already, so a successful move gives the staged charge back.
//!
//! Counters: `thp_fills`, `thp_fill_fallback` (in `fill` and `huge`), `thp_evictions`
//! (in `gather`).

use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use upager_sys::mem::{AlignedBuf, MapRange};
use upager_sys::uffd::{Fill, Uffd};

use crate::budget::Budget;

/// The folio size filled by moving a huge page: the largest folio, one PMD.
pub(crate) const HUGE: u64 = crate::config::MAX_FOLIO;

/// Staged huge pages kept ready.
const SLOTS: usize = 16;

/// One staging buffer.
pub(crate) struct Staged {
    pub buf: AlignedBuf,
    /// The buffer holds a huge page charged to the budget.
    pub ready: bool,
    /// Its contents are the kernel's zeros (staged, not yet read into).
    pub fresh: bool,
}

/// The pool of staged huge pages of a pager.
#[derive(Default)]
pub(crate) struct ThpPool {
    slots: Vec<Mutex<Staged>>,
    /// `/proc/self/pagemap`, opened by the first refill (a pager without
    /// 2 MiB regions holds no descriptor for it).
    pagemap: std::sync::OnceLock<Option<File>>,
    /// Regions with 2 MiB folios mapped now: the pool is kept filled while
    /// there are any.
    wanted: AtomicUsize,
    /// The slots are registered with the pager's first userfaultfd, so
    /// eviction can move huge pages into them (`recycle`).
    registered: bool,
}

impl ThpPool {
    /// A pool, if huge pages can be moved (`UFFD_FEATURE_MOVE`) and the
    /// staging buffers can be had (address space only); else an empty pool
    /// (every 2 MiB fill copies).
    pub fn new(can_move: bool, uffd: &Uffd) -> ThpPool {
        if !can_move {
            return ThpPool::default();
        }
        let slots: Vec<_> = (0..SLOTS)
            .filter_map(|_| AlignedBuf::huge(HUGE as usize))
            .map(|buf| {
                Mutex::new(Staged {
                    buf,
                    ready: false,
                    fresh: false,
                })
            })
            .collect();
        let registered = slots.iter().all(|s| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            uffd.register_buf(&s.buf).is_ok()
        });
        ThpPool {
            slots,
            pagemap: std::sync::OnceLock::new(),
            wanted: AtomicUsize::new(0),
            registered,
        }
    }

    /// Eviction of a PMD-mapped 2 MiB folio at `span` of a view (claimed,
    /// written back, write-protected or unmapped by nobody else): moves its
    /// huge page out into an empty slot through `uffd` (the one the slots
    /// are registered with) instead of unmapping it. True if the slot holds
    /// it now and the folio's budget charge became the staged page's (the
    /// caller must not return it); false if nothing was kept (whatever
    /// moved was freed): the caller unmaps `span` and returns the charge as
    /// for any folio. Async-signal-safe (slots are only tried).
    pub fn recycle(&self, uffd: &Uffd, span: MapRange<'_>, budget: &Budget) -> bool {
        if !self.registered || self.wanted.load(Ordering::Acquire) == 0 {
            return false;
        }
        let Some(pagemap) = self.pagemap.get().and_then(Option::as_ref) else {
            return false;
        };
        for slot in &self.slots[..self.slots_for(budget)] {
            let Ok(mut s) = slot.try_lock() else {
                continue;
            };
            if s.ready {
                continue;
            }
            let moved = matches!(uffd.move_out(span, &mut s.buf, 0), Ok(Fill::Done));
            if moved && upager_sys::pagemap::is_huge(pagemap, s.buf.addr(), HUGE).unwrap_or(false) {
                s.ready = true;
                s.fresh = false;
                if self.wanted.load(Ordering::Acquire) == 0 {
                    // The last 2 MiB region went meanwhile (see refill).
                    Self::give_back(&mut s, budget);
                }
                return true;
            }
            // Refused, partly moved, or base pages: free what arrived.
            s.buf.release_from(0);
            return false;
        }
        false
    }

    /// A region with 2 MiB folios was mapped: the reclaimer keeps the pool
    /// filled while one exists.
    pub fn want(&self) {
        self.wanted.fetch_add(1, Ordering::AcqRel);
    }

    /// A region with 2 MiB folios is gone; with the last one, the staged
    /// pages go back (budget and memory), so nothing stays resident.
    pub fn unwant(&self, budget: &Budget) {
        if self.wanted.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.drain(budget);
        }
    }

    /// `/proc/self/pagemap`, once a refill opened it (before any page was
    /// staged).
    pub fn pagemap(&self) -> Option<&File> {
        self.pagemap.get().and_then(Option::as_ref)
    }

    /// Whether 2 MiB fills can move huge pages at all.
    pub fn usable(&self) -> bool {
        !self.slots.is_empty()
    }

    /// A ready staged huge page, if one is free now; else, when `budget`
    /// has room, one staged here and now (the kernel allocates and zeroes
    /// it: ~0.1-0.2 ms, against 0.6-0.7 ms for copying 2 MiB as base
    /// pages), if the pagemap is open already. Async-signal-safe (slots
    /// are only tried; the check allocates nothing).
    pub fn take(&self, budget: &Budget) -> Option<MutexGuard<'_, Staged>> {
        let mut empty = None;
        for slot in &self.slots[..self.slots_for(budget)] {
            let Ok(s) = slot.try_lock() else {
                continue;
            };
            if s.ready {
                return Some(s);
            }
            empty.get_or_insert(s);
        }
        let mut s = empty?;
        let pagemap = self.pagemap.get()?.as_ref()?;
        self.stage(&mut s, pagemap, budget).then_some(s)
    }

    /// Stages a huge page in empty slot `s`: charge, touch, check. False
    /// (nothing charged or kept) if the budget is full or the kernel gave
    /// base pages.
    fn stage(&self, s: &mut Staged, pagemap: &File, budget: &Budget) -> bool {
        if !budget.try_charge(HUGE) {
            return false;
        }
        // The first touch of the aligned 2 MiB allocates (and zeroes) a
        // huge page where the kernel has one free.
        s.buf[0] = 0;
        if upager_sys::pagemap::is_huge(pagemap, s.buf.addr(), HUGE).unwrap_or(false) {
            s.ready = true;
            s.fresh = true;
            true
        } else {
            // Fragmented memory: base pages. Give them back; fills copy.
            s.buf.release_from(0);
            budget.uncharge(HUGE);
            false
        }
    }

    /// Stages huge pages in the empty slots while the budget has room;
    /// returns how many it staged. Off the fault path (the reclaimer).
    pub fn refill(&self, budget: &Budget) -> usize {
        if self.wanted.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let Some(pagemap) = self
            .pagemap
            .get_or_init(|| File::open("/proc/self/pagemap").ok())
        else {
            return 0;
        };
        let slots = &self.slots[..self.slots_for(budget)];
        // With recycling, evictions refill the pool without zeroing: stage
        // a new page only while none is ready (no slot left for eviction
        // to move its huge pages into would send them back to the kernel).
        let mut ready = if self.registered {
            slots
                .iter()
                .filter(|s| s.try_lock().is_ok_and(|s| s.ready))
                .count()
        } else {
            0
        };
        let mut staged = 0;
        for slot in slots {
            if self.registered && ready > 0 {
                break;
            }
            let Ok(mut s) = slot.try_lock() else {
                continue;
            };
            if s.ready {
                continue;
            }
            if !self.stage(&mut s, pagemap, budget) {
                break;
            }
            if self.wanted.load(Ordering::Acquire) == 0 {
                // The last 2 MiB region went while this page was staged: its
                // drain may have passed this slot already. (A drain that
                // comes later waits for this lock and sees the page.)
                Self::give_back(&mut s, budget);
                break;
            }
            staged += 1;
            ready += 1;
        }
        staged
    }

    /// Frees a staged page and its charge, if the slot holds one.
    fn give_back(s: &mut Staged, budget: &Budget) {
        if s.ready {
            s.buf.release_from(0);
            s.ready = false;
            s.fresh = false;
            budget.uncharge(HUGE);
        }
    }

    /// Slots in use: staged pages take at most an eighth of the budget
    /// (none below 16 MiB), so fills always find room for their folio.
    fn slots_for(&self, budget: &Budget) -> usize {
        ((budget.limit() / (8 * HUGE)) as usize).min(self.slots.len())
    }

    /// Gives back the staged pages and their budget.
    fn drain(&self, budget: &Budget) {
        for slot in &self.slots {
            let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
            Self::give_back(&mut s, budget);
        }
    }
}

/// Multiplier of the digest lanes (odd: multiplying by it is a bijection).
const DIGEST_K: u64 = 0x9E37_79B9_7F4A_7C15;

/// Lanes of the digest: independent multiply chains the CPU runs side by
/// side. Four lanes cost 0.25 ms per 2 MiB pass here (0.51 s of
/// CPU per 2 GiB scan, two passes a fill); eight, each loop step one
/// 64-byte line, 76-118 us (2 vCPU EPYC KVM, loaded, a
/// microbenchmark of both over the same 2 MiB: 4-5x). xxh3-128 (SSE2
/// build) measured 118-142 us there and needs a byte slice of the view,
/// which other threads may be writing: not better, and not safe Rust.
const LANES: usize = 8;

/// A digest of a page's 64-bit words: [`LANES`] lanes, lane `i` a chain of
/// bijections `x -> (x ^ w) * K` over words `i, i+LANES, ...`, so a
/// change of any one word always changes its lane; changes of several
/// words collide with a probability of about 2^-64. Pure computation on
/// the caller's memory (async-signal-safe: the in-thread fault path uses
/// it). Compares a staged huge page before its move with the view after
/// (huge.rs, `install_huge`). `words` is called once per word, in order.
#[inline(always)]
fn digest(n: usize, word: impl Fn(usize) -> u64) -> [u64; LANES] {
    let mut lanes = [0u64; LANES];
    let whole = n / LANES * LANES;
    let mut at = 0;
    while at < whole {
        for (k, l) in lanes.iter_mut().enumerate() {
            *l = (*l ^ word(at + k)).wrapping_mul(DIGEST_K);
        }
        at += LANES;
    }
    for (k, l) in lanes.iter_mut().enumerate().take(n - whole) {
        *l = (*l ^ word(whole + k)).wrapping_mul(DIGEST_K);
    }
    lanes
}

/// [`digest`] of bytes (a multiple of 8 long).
pub(crate) fn digest_bytes(b: &[u8]) -> [u64; LANES] {
    digest(b.len() / 8, |i| {
        u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default())
    })
}

/// [`digest`] of shared memory read word by word.
pub(crate) fn digest_words(w: &[std::sync::atomic::AtomicU64]) -> [u64; LANES] {
    digest(w.len(), |i| w[i].load(std::sync::atomic::Ordering::Relaxed))
}

#[cfg(test)]
mod digest_tests {
    use super::*;

    #[test]
    fn any_one_changed_word_changes_the_digest_and_equal_data_digests_alike() {
        let mut b = vec![0u8; 1 << 16];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 7 + 3) as u8;
        }
        let d = digest_bytes(&b);
        let words: Vec<std::sync::atomic::AtomicU64> = b
            .chunks_exact(8)
            .map(|c| std::sync::atomic::AtomicU64::new(u64::from_ne_bytes(c.try_into().unwrap())))
            .collect();
        assert_eq!(digest_words(&words), d);
        for at in [0, 8, 4096, b.len() - 8] {
            let mut c = b.clone();
            c[at] ^= 1;
            assert_ne!(digest_bytes(&c), d, "a change at byte {at} went unseen");
        }
        // Swapping two words is a change too (in one lane, and across).
        for other in [8 * LANES, 8] {
            let mut c = b.clone();
            for k in 0..8 {
                c.swap(k, other + k);
            }
            assert_ne!(digest_bytes(&c), d, "swapping word 0 and byte {other}");
        }
        // A length that is not a multiple of the lanes.
        assert_ne!(
            digest_bytes(&b[..8 * 11]),
            digest_bytes(&c_change(&b[..8 * 11]))
        );
    }

    fn c_change(b: &[u8]) -> Vec<u8> {
        let mut c = b.to_vec();
        *c.last_mut().unwrap() ^= 0x80;
        c
    }
}
