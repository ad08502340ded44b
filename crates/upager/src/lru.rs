//! The LRU lists: which resident folios reclaim looks at first.
//!
//! Two lists as in mm/workingset.c: new folios enter the inactive list; a
//! folio refaulted soon after its eviction enters the active list (capped at
//! half the budget by reclaim, which deactivates its oldest entries). Beside
//! them, the poisoned folios waiting for their hold time to pass.
//!
//! Contract: an entry is pushed with the folio's `QUEUED` bit set and the bit
//! is cleared only when the entry is dropped as stale, so a resident folio
//! has exactly one entry. The lock is held only to move entries, never
//! across a system call; one acquisition per batch ([`Lru::add`] takes a
//! group, isolation takes one for the whole batch: seed 003).
//!
//! Uses: `area`, `folio`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::area::Area;
use crate::folio::{Kind, State, QUEUED};

/// One entry of an LRU list.
pub(crate) struct Entry {
    pub region: Arc<Area>,
    pub idx: usize,
}

/// The lists behind the LRU lock.
#[derive(Default)]
pub(crate) struct Lists {
    inactive: VecDeque<Entry>,
    active: VecDeque<Entry>,
    active_bytes: u64,
    poisoned: VecDeque<(Entry, Instant)>,
}

/// The LRU lists of a pager, under one lock.
pub(crate) struct Lru {
    lists: Mutex<Lists>,
    /// Test knob ([`PagerBuilder::debug_lru_try_fail_every`]): every n-th
    /// [`Lru::try_add`] fails after spinning as a contended one would
    /// (0: never).
    ///
    /// [`PagerBuilder::debug_lru_try_fail_every`]: crate::PagerBuilder::debug_lru_try_fail_every
    fail_every: std::sync::atomic::AtomicU32,
    tries: std::sync::atomic::AtomicU32,
}

impl Default for Lru {
    /// Empty lists with [`SPARE`] entries of room each, so the first fills
    /// in SIGBUS handlers need not hand off to grow them.
    fn default() -> Self {
        let mut l = Lists::default();
        l.keep_spare();
        Lru {
            lists: Mutex::new(l),
            fail_every: std::sync::atomic::AtomicU32::new(0),
            tries: std::sync::atomic::AtomicU32::new(0),
        }
    }
}

impl Lru {
    /// Makes every `n`-th [`Lru::try_add`] fail (test knob; 0: never).
    pub fn fail_try_add_every(&self, n: u32) {
        self.fail_every.store(n, Ordering::Relaxed);
    }

    /// Takes the lock (poisoning is ignored: the lists stay consistent
    /// between statements).
    pub fn lock(&self) -> MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds newly filled folios `(idx, active)` of `r`: one lock for the
    /// group. Keeps [`SPARE`] entries of room in each list for
    /// [`Lru::try_add`].
    pub fn add(&self, r: &Arc<Area>, items: &[(usize, bool)]) {
        if items.is_empty() {
            return;
        }
        let mut l = self.lock();
        l.push_all(r, items);
        l.keep_spare();
    }

    /// Adds like [`Lru::add`], but async-signal-safe (a SIGBUS handler
    /// calls it): the lock is only tried, a bounded number of times, and
    /// the lists must have room (no allocation). False if not added (then
    /// nothing was).
    pub fn try_add(&self, r: &Arc<Area>, items: &[(usize, bool)]) -> bool {
        if items.is_empty() {
            return true;
        }
        let every = self.fail_every.load(Ordering::Relaxed);
        if every > 0
            && self
                .tries
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(every)
        {
            // As a try-lock that lost to a long holder: ~200 us, then no.
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            }
            return false;
        }
        for attempt in 0..TRY_LOCK_ATTEMPTS {
            let mut l = match self.lists.try_lock() {
                Ok(l) => l,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    if attempt % 32 == 31 {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                    continue;
                }
            };
            let active = items.iter().filter(|(_, a)| *a).count();
            let fits = |q: &VecDeque<Entry>, n: usize| q.capacity() - q.len() >= n;
            if !(fits(&l.active, active) && fits(&l.inactive, items.len() - active)) {
                return false;
            }
            l.push_all(r, items);
            return true;
        }
        false
    }

    /// Records a poisoned folio, cleared after its hold time.
    pub fn add_poisoned(&self, r: &Arc<Area>, idx: usize) {
        self.lock().poisoned.push_back((
            Entry {
                region: Arc::clone(r),
                idx,
            },
            Instant::now(),
        ));
    }

    /// Drops every entry of an area being unmapped (one lock).
    pub fn purge(&self, id: u64) {
        let mut l = self.lock();
        l.inactive.retain(|e| e.region.id != id);
        l.active.retain(|e| e.region.id != id);
        l.active_bytes = l.active.iter().map(|e| e.region.folio).sum();
        l.poisoned.retain(|(e, _)| e.region.id != id);
    }

    /// Poisoned folios held at least `hold` (all of them if `all`).
    pub fn take_poisoned(&self, hold: Duration, all: bool) -> Vec<Entry> {
        let mut l = self.lock();
        let mut out = Vec::new();
        while let Some((_, t)) = l.poisoned.front() {
            if !all && t.elapsed() < hold {
                break;
            }
            out.push(l.poisoned.pop_front().expect("non-empty").0);
        }
        out
    }
}

/// Room kept free in each list so that fills in SIGBUS handlers can queue
/// without allocating (the lists grow in normal context: `add`).
const SPARE: usize = 1024;
/// Times [`Lru::try_add`] tries the lock before giving up (the lock is held
/// for microseconds at most: a batch's isolation).
const TRY_LOCK_ATTEMPTS: u32 = 256;

impl Lists {
    fn push_all(&mut self, r: &Arc<Area>, items: &[(usize, bool)]) {
        for &(idx, active) in items {
            let e = Entry {
                region: Arc::clone(r),
                idx,
            };
            if active {
                self.push_active(e);
            } else {
                self.push_inactive(e);
            }
        }
    }
    fn keep_spare(&mut self) {
        for q in [&mut self.inactive, &mut self.active] {
            if q.capacity() - q.len() < SPARE / 2 {
                q.reserve(SPARE);
            }
        }
    }
    pub fn inactive_len(&self) -> usize {
        self.inactive.len()
    }
    pub fn active_len(&self) -> usize {
        self.active.len()
    }
    pub fn active_bytes(&self) -> u64 {
        self.active_bytes
    }
    pub fn pop_inactive(&mut self) -> Option<Entry> {
        self.inactive.pop_front()
    }
    pub fn push_inactive(&mut self, e: Entry) {
        self.inactive.push_back(e);
    }
    pub fn pop_active(&mut self) -> Option<Entry> {
        let e = self.active.pop_front()?;
        self.active_bytes -= e.region.folio;
        Some(e)
    }
    pub fn push_active(&mut self, e: Entry) {
        self.active_bytes += e.region.folio;
        self.active.push_back(e);
    }
    /// Every entry, inactive (oldest first) then active.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.inactive.iter().chain(self.active.iter())
    }

    /// An entry whose folio is no longer resident: clear `QUEUED` unless a
    /// fill made it resident again meanwhile (then it keeps its entry).
    pub fn drop_stale(&mut self, e: Entry) {
        let w = e.region.state(e.idx);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let s = State(cur);
            if matches!(s.kind(), Kind::Clean | Kind::Dirty | Kind::Busy) {
                self.inactive.push_back(e);
                return;
            }
            match w.compare_exchange_weak(cur, cur & !QUEUED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(v) => cur = v,
            }
        }
    }
}
