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
use std::sync::{Arc, Mutex, MutexGuard};
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
#[derive(Default)]
pub(crate) struct Lru {
    lists: Mutex<Lists>,
}

impl Lru {
    /// Takes the lock (poisoning is ignored: the lists stay consistent
    /// between statements).
    pub fn lock(&self) -> MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds newly filled folios `(idx, active)` of `r`: one lock for the group.
    pub fn add(&self, r: &Arc<Area>, items: &[(usize, bool)]) {
        if items.is_empty() {
            return;
        }
        let mut l = self.lock();
        for &(idx, active) in items {
            let e = Entry {
                region: Arc::clone(r),
                idx,
            };
            if active {
                l.push_active(e);
            } else {
                l.push_inactive(e);
            }
        }
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

impl Lists {
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
