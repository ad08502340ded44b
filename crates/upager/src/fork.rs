//! Fork: a forked child can use every file region it inherited, at the
//! same addresses, on an engine of its own.
//!
//! Regions are `MADV_DONTFORK` (a child's copy of a registered range would
//! lose its registration and read zeros), so a child has none of their
//! memory; it has the parent's handles, whose threads and userfaultfd are
//! not its own. The three `pthread_atfork` handlers, registered with the
//! first pager of the process:
//!
//! 1. `prepare` (forking thread, the engine's threads still run): write
//!    back every dirty folio of every writable file region of every pager
//!    of the process (cheap when clean: a walk of the touched chunks; no
//!    `fdatasync`, which the child does not need: it reads the same page
//!    cache), so the child, which starts cold and reads the file, sees the
//!    writes made before `fork()` was called, and switch each of those
//!    files to twins (twins.rs: parent and child are two writers of it from
//!    now on; the child's region joins the file's writers on a description
//!    of its own). Then finish the in-thread
//!    registry's initialisation and take the lineage lock, the SIGBUS
//!    handler's installation lock and the writers' table, so no other
//!    thread holds them at the fork.
//! 2. `parent`: release the locks.
//! 3. `child` (the forking thread is the only thread, before `fork()`
//!    returns there): for each pager of the parent, start a fresh engine
//!    with the same options (new userfaultfd, new threads, a budget of the
//!    same size of its own), and map each of its file regions again at its
//!    old address (free: it was `MADV_DONTFORK`; `MAP_FIXED_NOREPLACE`),
//!    cold, on the same store (descriptors are inherited; a store says it
//!    can be used so with [`Store::fork_safe`]). Record in the lineage
//!    what stands for each inherited handle; release the locks (the
//!    installation lock first).
//!
//! What the child never does with the parent's objects: take their locks,
//! wait for their threads, drop their last reference (lineage.rs).
//! Anonymous regions and regions of stores that are not fork-safe are not
//! inherited: their ranges stay reserved and inaccessible (SIGSEGV), and a
//! method of their handle panics saying why.
//!
//! Why handlers and not only an explicit call: numpy arrays and C pointers
//! into a region must work in the child from its first instruction
//! (`multiprocessing`'s fork start method runs the worker at once), and a
//! library cannot rely on every program calling a function after `fork()`.
//! [`after_fork`] is also public, and idempotent, for children made
//! without the C library's `fork()` (raw `clone`), and for Python's
//! `os.register_at_fork`.
//!
//! Deadlock analysis of `prepare`: it runs in the forking thread, which is
//! an application thread, never inside the engine (no engine lock is held
//! by it: the engine holds no lock across application code); a flush waits
//! only for folios busy with a fill or write-back, which the engine's
//! threads (still running) finish. The C library takes its malloc locks
//! after the `prepare` handlers and has reset them before the `child`
//! handlers, so both may allocate.
//!
//! Uses: `area`, `config`, `error`, `inthread`, `lineage`, `pager`,
//! `region`, `shared`, `store`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, Once, Weak};

use upager_sys::mem::{Access, Mapping};

use crate::area::Area;
use crate::config::PagerBuilder;
use crate::error::PagerError;
use crate::lineage::{self, key, Heir, Lineage};
use crate::pager::Pager;
use crate::shared::Owner;

#[cfg(doc)]
use crate::store::Store;

/// The locks the forking thread holds from `prepare` to `parent` / `child`:
/// the lineage's and the SIGBUS handler's installation lock (a child's
/// in-thread pager installs it again).
struct Held {
    lineage: MutexGuard<'static, Lineage>,
    install: MutexGuard<'static, ()>,
    writers: crate::twins::TableHeld,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Why an anonymous region is not inherited.
const ANON: &str = "anonymous regions are not inherited by a fork child (their contents \
                    live in the parent's memory and swap file); share data through a file \
                    region instead";

impl Pager {
    /// Starts a pager and records it for the fork handlers (registered
    /// with the first pager of the process).
    pub(crate) fn from_builder(cfg: PagerBuilder) -> Result<Pager, PagerError> {
        install();
        // A child made without the fork handlers (raw clone) rebuilds here
        // at the latest, before this pager counts as the process's own.
        after_fork();
        let p = Pager::start(cfg)?;
        lineage::track(p.owner());
        Ok(p)
    }
}

/// Registers the fork handlers, once per process.
fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = upager_sys::fork::at_fork(prepare, parent, child) {
            log::error!("pthread_atfork failed ({e}): a fork child cannot use the regions");
        }
    });
}

/// Makes this process's inherited regions usable, if it is a fork child
/// whose regions were not rebuilt yet (see the module doc); otherwise does
/// nothing. The fork handlers call it; call it yourself only in a child
/// made without the C library's `fork()` (a raw `clone`), before any
/// other thread starts there.
pub fn after_fork() {
    let held = HELD.with(|h| h.borrow_mut().take());
    let mut g = match held {
        Some(Held {
            lineage,
            install,
            writers,
        }) => {
            drop(install); // before a pager here installs the handler
            drop(writers); // before a region here joins its file's writers
            lineage
        }
        None => lineage::lock(),
    };
    let pagers = rebuild(&mut g);
    drop(g);
    drop(pagers); // after the lock: a pager's drop looks the lineage up
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        flush_all();
        crate::inthread::before_fork();
        let lineage = lineage::lock();
        let install = upager_sys::signal::hold_install();
        let writers = crate::twins::hold_table();
        HELD.with(|h| {
            *h.borrow_mut() = Some(Held {
                lineage,
                install,
                writers,
            })
        });
    });
}

extern "C" fn parent() {
    let _ = std::panic::catch_unwind(|| drop(HELD.with(|h| h.borrow_mut().take())));
}

extern "C" fn child() {
    let _ = std::panic::catch_unwind(after_fork);
}

/// The `prepare` write-back: every writable file region of every pager of
/// this process. Errors are logged (a fork cannot fail for them); the
/// failed folios stay dirty and the next flush reports them.
fn flush_all() {
    let owners: Vec<Arc<Owner>> = {
        let l = lineage::lock();
        if l.pid != std::process::id() {
            return; // a child whose regions were not rebuilt: nothing is ours
        }
        l.pagers.iter().filter_map(Weak::upgrade).collect()
    };
    for o in owners {
        for a in o.shared.table.all() {
            if a.writable && !a.is_anon() && !a.dying.load(Ordering::SeqCst) {
                if let Err(e) = crate::region::write_back_area(&o.shared, &a) {
                    log::warn!(
                        "writing region {} back before a fork failed: {e}; the child reads \
                         the file without the writes that are not on it",
                        a.id
                    );
                }
                // The child writes the file too: twins from now on.
                if let Some(w) = &a.writers {
                    w.switch_before_fork();
                }
            }
        }
    }
}

/// A refused region; its range stays reserved (inaccessible) if it was.
fn refuse(reserve: Option<Mapping>, why: impl Into<Arc<str>>) -> Heir {
    Heir::Refused {
        reserve: reserve.map(Arc::new),
        why: why.into(),
    }
}

/// The `child` step (see the module doc). Returns the handles of the
/// pagers started, to be dropped once the lineage lock is released.
fn rebuild(l: &mut Lineage) -> Vec<Pager> {
    let me = std::process::id();
    if l.pid == me || l.pid == 0 {
        return Vec::new(); // done already, or never had a pager
    }
    crate::inthread::forget_parent();
    let old = std::mem::take(&mut l.pagers);
    // 1) Reserve every inherited range before anything maps memory here
    //    (the new engines' thread stacks would land in them).
    let mut inherited = Vec::new();
    for w in &old {
        let Some(o) = w.upgrade() else { continue };
        l.ancestors.insert(key(&o));
        // The parent's table: a lock-free snapshot load (the `Locked`
        // ablation takes a read lock a parent thread may hold: not for
        // programs that fork).
        let regions: Vec<(Arc<Area>, Option<Mapping>)> = o
            .shared
            .table
            .all()
            .into_iter()
            .filter(|a| !a.dying.load(Ordering::SeqCst))
            .map(|a| {
                let reserve = Mapping::vacant(a.base(), a.map_len() as usize, Access::None);
                if let Err(e) = &reserve {
                    log::error!(
                        "fork child: reserving the range of region {} failed: {e}",
                        a.id
                    );
                }
                (a, reserve.ok())
            })
            .collect();
        inherited.push((o, regions));
    }
    // 2) A pager for each, each file region mapped again over its reservation.
    let mut areas: HashMap<usize, Heir> = HashMap::new();
    let mut owners: HashMap<usize, Option<Arc<Owner>>> = HashMap::new();
    let mut started = Vec::new();
    for (o, regions) in inherited {
        let pager = Pager::start(o.shared.cfg.clone())
            .inspect_err(|e| {
                log::error!(
                    "fork child: starting a pager for an inherited one failed ({e}); \
                     its regions are not usable here"
                );
            })
            .ok();
        for (a, reserve) in regions {
            let heir = match (&pager, reserve) {
                (None, r) => refuse(r, "the fork child could not start a pager for it (logged)"),
                (Some(_), r) if a.is_anon() => refuse(r, ANON),
                (Some(_), r) if !a.store.fork_safe() => refuse(
                    r,
                    format!(
                        "its store ({}) cannot be used from a fork child; map it again there",
                        a.store.describe()
                    ),
                ),
                (Some(_), None) => refuse(None, "its address range was taken in the child"),
                (Some(p), Some(r)) => match p.map_again(&a, Arc::clone(&a.store), r) {
                    Ok(r) => {
                        let (inner, owner) = r.into_parts();
                        Heir::Mapped(inner, owner)
                    }
                    Err(e) => {
                        log::error!("fork child: mapping region {} again failed: {e}", a.id);
                        refuse(None, format!("mapping it again at its address failed: {e}"))
                    }
                },
            };
            areas.insert(key(&a), heir);
            std::mem::forget(a);
        }
        owners.insert(key(&o), pager.as_ref().map(|p| Arc::clone(p.owner())));
        if let Some(p) = pager {
            l.pagers.push(Arc::downgrade(p.owner()));
            started.push(p);
        }
        std::mem::forget(o);
    }
    std::mem::forget(old);
    // What stood here for a grandparent's objects was the parent's: follow
    // it to what stands for that now.
    for v in l.areas.values_mut() {
        if let Heir::Mapped(a, _) = v {
            let next = areas
                .get(&key(a))
                .cloned()
                .unwrap_or_else(|| Heir::Refused {
                    reserve: None,
                    why: "the region was unmapped in the parent before this fork".into(),
                });
            std::mem::forget(std::mem::replace(v, next));
        }
    }
    for v in l.owners.values_mut() {
        if let Some(o) = v {
            let next = owners.get(&key(o)).cloned().flatten();
            std::mem::forget(std::mem::replace(v, next));
        }
    }
    l.areas.extend(areas);
    l.owners.extend(owners);
    l.pid = me;
    lineage::INHERITED.store(!l.ancestors.is_empty(), Ordering::Release);
    started
}
