//! Lineage: which engine objects in this process's memory are its own, and
//! which it inherited from the process it was forked from (and what stands
//! in for those here).
//!
//! A fork child has a copy of its parent's memory, so the parent's
//! [`Region`](crate::Region) and [`Pager`](crate::Pager) handles are in it,
//! but not the parent's threads, and not the regions' memory (it is
//! `MADV_DONTFORK`). The fork handlers (`fork.rs`) map every inherited file
//! region again at its old address on a fresh engine started in the child,
//! and record here, keyed by the address of the parent's object, what
//! stands in for it: an [`Heir`] per region, a new pager per pager. A
//! handle asks [`heir_of_region`] / [`heir_of_pager`] before it touches the
//! engine; in a process that never forked with live pagers the answer is a
//! single relaxed load ([`INHERITED`]).
//!
//! Rules for the parent's objects in a child (they are in the child's
//! memory, but belong to threads that do not exist there):
//! - never take one of their locks (a parent thread may have held it at the
//!   fork: it stays locked forever) and never wait for their threads;
//! - never drop the last reference to them (an `Owner`'s drop joins its
//!   threads, an `Area`'s unmaps the address the child's engine now uses):
//!   a stale handle that goes away forgets a clone of its references first.
//!
//! Keys never collide with the child's own objects: the parent's objects
//! are never freed in the child, so their addresses are never reused.
//!
//! Lock: [`LINEAGE`] is taken briefly by handles and pagers (creation,
//! drop); the fork handlers hold it from `prepare` to `parent`/`child`, so
//! no other thread holds it at the fork.
//!
//! Uses: `area`, `shared`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use upager_sys::mem::Mapping;

use crate::area::Area;
use crate::shared::Owner;

/// What stands in a fork child for a region of an ancestor process.
#[derive(Clone)]
pub(crate) enum Heir {
    /// The region mapped again at its old address on this process's engine.
    Mapped(Arc<Area>, Arc<Owner>),
    /// Not inherited; its range is kept reserved and inaccessible (an
    /// access raises SIGSEGV, the address is not reused by another mapping).
    Refused {
        reserve: Option<Arc<Mapping>>,
        why: Arc<str>,
    },
}

/// The process's engines and what it inherited.
#[derive(Default)]
pub(crate) struct Lineage {
    /// The process whose pagers `pagers` are (0: none yet); a fork child
    /// sees its parent's pid here until the fork handlers ran.
    pub pid: u32,
    /// The pagers started in this process, held weakly.
    pub pagers: Vec<Weak<Owner>>,
    /// Regions of ancestors, by the address of their `Area`.
    pub areas: HashMap<usize, Heir>,
    /// Pagers of ancestors, by the address of their `Owner`: the pager
    /// started for it here (None: the child could not start one, or the
    /// handle dropped it).
    pub owners: HashMap<usize, Option<Arc<Owner>>>,
    /// Every ancestor `Owner` address (kept when the handle drops its
    /// entry of `owners`: a handle with such an owner is never this
    /// process's own).
    pub ancestors: HashSet<usize>,
}

/// The process's lineage.
pub(crate) static LINEAGE: LazyLock<Mutex<Lineage>> = LazyLock::new(Mutex::default);

/// Set once the process inherited anything: handles look it up from then on.
pub(crate) static INHERITED: AtomicBool = AtomicBool::new(false);

/// The lineage, locked.
pub(crate) fn lock() -> MutexGuard<'static, Lineage> {
    LINEAGE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The address of an object, the key of the maps above.
pub(crate) fn key<T>(a: &Arc<T>) -> usize {
    Arc::as_ptr(a) as usize
}

/// Records a pager started in this process.
pub(crate) fn track(owner: &Arc<Owner>) {
    let mut l = lock();
    l.pid = std::process::id();
    l.pagers.retain(|w| w.strong_count() > 0);
    l.pagers.push(Arc::downgrade(owner));
}

/// What a region handle (of `area` on `owner`) stands for here: None if
/// it is this process's own; with `take`, the entry is removed (the handle
/// goes away).
pub(crate) fn heir_of_region(area: &Arc<Area>, owner: &Arc<Owner>, take: bool) -> Option<Heir> {
    if !INHERITED.load(Ordering::Acquire) {
        return None;
    }
    let mut l = lock();
    let k = key(area);
    let found = if take {
        l.areas.remove(&k)
    } else {
        l.areas.get(&k).cloned()
    };
    match found {
        Some(h) => Some(h),
        None if l.ancestors.contains(&key(owner)) => Some(Heir::Refused {
            reserve: None,
            why: "the region was being unmapped when the process forked, or was unmapped \
                  in this fork child already"
                .into(),
        }),
        None => None,
    }
}

/// What a pager handle (of `owner`) stands for here: None if it is this
/// process's own, Some(None) if it is an ancestor's that has no pager
/// here; with `take`, the entry is removed (the handle goes away).
pub(crate) fn heir_of_pager(owner: &Arc<Owner>, take: bool) -> Option<Option<Arc<Owner>>> {
    if !INHERITED.load(Ordering::Acquire) {
        return None;
    }
    let mut l = lock();
    let k = key(owner);
    if !l.ancestors.contains(&k) {
        return None;
    }
    Some(if take {
        l.owners.remove(&k).flatten()
    } else {
        l.owners.get(&k).cloned().flatten()
    })
}

/// Lets a stale handle's references to an ancestor's objects go without
/// ever dropping the last one (see the module doc).
pub(crate) fn forget_ancestor<T>(a: &Arc<T>) {
    std::mem::forget(Arc::clone(a));
}
