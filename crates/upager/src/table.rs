//! The region table: address → region, with no lock on the fault path
//! (seed 001).
//!
//! Contract:
//! - Lookup ([`RegionTable::lookup`]) loads an immutable, sorted snapshot of
//!   the regions (`arc-swap`: a lock-free load), binary-searches it, and pins
//!   the region with its in-flight count ([`Inflight`]).
//! - Insert/remove build a new snapshot under a writer mutex (writers only;
//!   faults never take it).
//! - Unmap marks the region dying, removes it, then waits until its in-flight
//!   count drains: faults and evictions already working on it finish, new
//!   ones see it dying and back off. Unmapping one region never blocks faults
//!   on another.
//!
//! Memory ordering (Dekker pairing, both sides SeqCst):
//!
//! ```text
//!   fault / evictor                    unmap
//!   inflight.fetch_add(1)              dying.store(true)
//!   if dying.load() { back off }       while inflight.load() != 0 { wait }
//! ```
//! Either the fault sees `dying` and backs off, or unmap sees its increment
//! and waits for it: never both missed.
//!
//! [`Lookup::Locked`](crate::Lookup::Locked) replaces the snapshot with a
//! reader-writer lock taken on every lookup, for the ablation benchmark.
//!
//! Uses: `area`, `config`.

use std::sync::{Arc, Mutex, RwLock};

use arc_swap::ArcSwap;

use crate::area::{Area, Inflight};
use crate::config::Lookup;

type Snapshot = Vec<Arc<Area>>;

pub(crate) enum RegionTable {
    LockFree {
        snap: ArcSwap<Snapshot>,
        writer: Mutex<()>,
    },
    Locked(RwLock<Snapshot>),
}

fn find(snap: &Snapshot, addr: u64) -> Option<&Arc<Area>> {
    let i = snap.partition_point(|r| r.base() <= addr);
    let r = snap.get(i.checked_sub(1)?)?;
    (addr < r.base() + r.map_len()).then_some(r)
}

impl RegionTable {
    pub fn new(kind: Lookup) -> RegionTable {
        match kind {
            Lookup::LockFree => RegionTable::LockFree {
                snap: ArcSwap::from_pointee(Vec::new()),
                writer: Mutex::new(()),
            },
            Lookup::Locked => RegionTable::Locked(RwLock::new(Vec::new())),
        }
    }

    /// The region containing `addr`, pinned; None if there is none or it is
    /// being unmapped.
    pub fn lookup(&self, addr: u64) -> Option<Inflight> {
        match self {
            RegionTable::LockFree { snap, .. } => {
                let g = snap.load();
                find(&g, addr).and_then(Inflight::enter)
            }
            RegionTable::Locked(l) => {
                let g = l.read().unwrap_or_else(|e| e.into_inner());
                find(&g, addr).and_then(Inflight::enter)
            }
        }
    }

    fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        match self {
            RegionTable::LockFree { snap, writer } => {
                let _w = writer.lock().unwrap_or_else(|e| e.into_inner());
                let mut v: Snapshot = snap.load().as_ref().clone();
                f(&mut v);
                snap.store(Arc::new(v));
            }
            RegionTable::Locked(l) => f(&mut l.write().unwrap_or_else(|e| e.into_inner())),
        }
    }

    pub fn insert(&self, r: Arc<Area>) {
        self.update(|v| {
            let i = v.partition_point(|x| x.base() < r.base());
            v.insert(i, r);
        });
    }

    pub fn remove(&self, id: u64) {
        self.update(|v| v.retain(|x| x.id != id));
    }

    /// All live regions (for stat and tests).
    pub fn all(&self) -> Snapshot {
        match self {
            RegionTable::LockFree { snap, .. } => snap.load().as_ref().clone(),
            RegionTable::Locked(l) => l.read().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}
