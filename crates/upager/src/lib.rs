//! upager: a user-space demand pager for Linux.
//!
//! Ask a [`Pager`] for a region of any size, backed by a file or by private
//! swap space, and get an ordinary pointer: pages arrive on first touch and
//! leave again under a hard memory budget, in batches, with the mechanisms
//! that keep Linux's own memory manager fast under pressure — from user space
//! (userfaultfd, process_madvise), with no kernel module.
//!
//! ```no_run
//! use upager::{MapOptions, Pager};
//! let pager = Pager::new(256 << 20)?;                      // 256 MiB budget
//! let data = pager.map_file("big.bin", &MapOptions::new())?;   // read-only, 4 KiB folios
//! let sum: u64 = data.words().iter().map(|w| w.load(std::sync::atomic::Ordering::Relaxed)).sum();
//! let scratch = pager.map_anonymous(64 << 30, &MapOptions::new())?; // 64 GiB, zero-filled
//! scratch.write_at(1 << 35, &sum.to_le_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The five mechanisms
//! 1. **One TLB shootdown per eviction batch** ([`gather`](crate::gather),
//!    [`reclaim`](crate::reclaim)): victims leave with one
//!    `process_madvise(MADV_DONTNEED)`; dirty ones are write-protected first
//!    (one call per span of dirty folios), then written back.
//! 2. **A fault path without locks** ([`table`](crate::table),
//!    [`folio`](crate::folio)): lock-free region lookup, CAS on per-folio state.
//! 3. **Folios as one unit**: one read, one `UFFDIO_COPY`, one state update;
//!    2 MiB folios enter the view as one huge page moved in from a staged
//!    one ([`thp`](crate::thp)).
//! 4. **Batched removal under one lock** ([`lru`](crate::lru),
//!    [`store`](crate::store)): a batch is isolated from the LRU, and gets
//!    its swap slots, under one lock acquisition each.
//! 5. **Markers for evicted pages** ([`advice`](crate::advice)): the state
//!    word says evicted vs never touched without touching the store.
//!
//! # Invariants
//! - **No lost write**: write-protect (flush) → write back → unmap (flush) →
//!   release; a racing write waits and is kept.
//! - **Budget**: resident bytes never exceed the budget (the peak is the
//!   `resident_peak_bytes` counter).
//! - **Every fault ends**: resolved, or SIGBUS (EFAULT inside a system call).
//! - **Durable flush**: after [`Region::flush`] returns Ok, the store holds
//!   every earlier write (fdatasync).
//!
//! # Requirements and non-goals
//! Linux 5.7 or later on x86-64 (6.10 on arm64), no privilege: features are
//! probed at start and missing ones fall back (one TLB flush per
//! `process_madvise` call needs 6.16; an ordinary user's userfaultfd is
//! user-mode-only, 5.11: [`Userfaultfd`], [`PagerInfo`]). A `fork` child
//! can use every file region it inherited, at the same address, on an
//! engine of its own started before `fork()` returns there (cold, with a
//! budget of the same size; the parent's writes made before the fork are
//! flushed first); anonymous regions are not inherited (see [`after_fork`]
//! and docs/design.md, "fork"). Read-only regions enforce read-only access
//! with SIGSEGV like a `PROT_READ` mapping. Not a goal: sharing a region
//! between processes (use the kernel's `MAP_SHARED`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

// The layer order of these modules is `tests::LAYERS` (rustfmt sorts the
// list below); docs/design.md draws it.
mod advice;
mod ahead;
mod area;
mod budget;
mod cache;
mod config;
mod direct;
mod dirty;
mod error;
mod fault;
mod file_store;
mod fill;
mod folio;
mod fork;
mod gather;
mod huge;
mod info;
mod install;
mod inthread;
mod lineage;
mod lru;
mod pager;
mod poison;
mod pool;
mod poolfault;
mod private_dir;
mod readahead;
mod reclaim;
mod region;
mod rings;
mod shared;
mod shares;
mod stats;
mod store;
mod swap;
mod sync;
mod table;
mod thp;
mod trace;
mod twins;
mod warm;
mod warm_format;
mod warm_record;
mod warm_replay;
mod ztier;

pub use advice::Residency;
pub use cache::{
    clear as cache_clear, remove as cache_remove, scan as cache_scan, CacheConfig, CacheError,
    CachedStore, DirInfo as CacheDirInfo, EntryInfo as CacheEntryInfo, CHUNK as CACHE_CHUNK,
};
pub use config::WarmStart;
pub use config::{
    format_size, parse_size, FaultMode, Lookup, MapOptions, PagerBuilder, Userfaultfd,
    DEFAULT_ANON_FOLIO, DEFAULT_DIRTY_EXPIRE, DEFAULT_FOLIO, HUGE_RUNS_MIN_BYTES, MAX_FOLIO,
    MIN_FOLIO,
};
pub use config::{CACHE_DIR_ENV, CACHE_SIZE_ENV, POOL_ENV};
pub use error::{
    errno, error_chain, AdviseError, ErrorCode, FileKind, FlushError, MapError, PagerError,
    RangeError, UnmapError,
};
pub use file_store::{open_regular_file, FileStore, OpenRegularError};
pub use fork::after_fork;
pub use info::PagerInfo;
pub use pager::Pager;
pub use pool::{pools, PoolError, PoolInfo, POOL_DIR_ENV};
pub use region::Region;
pub use stats::{FaultPhases, Stats};
pub use store::{ReadReq, Src, Store, Write, Written};
pub use swap::SwapFile;
pub use upager_sys::mem::FixedRange;
#[doc(hidden)]
pub use warm_format::{decode_trace_for_fuzz, encode_trace_for_fuzz, seal_trace_for_fuzz};
pub use warm_format::{trace_info, trace_path, trace_version_of, TraceInfo, TRACE_SUFFIX};
pub use ztier::ZTIER_ENV;

/// Sends the engine's log messages (warnings and errors: a write-back that
/// failed on drop, an unmap waiting long for faults in flight) to standard
/// error, prefixed `upager:`, unless the program installed a `log` logger
/// already. The library reports through the `log` facade and never prints
/// on its own; the CLI, the C library and the Python module call this.
pub fn log_to_stderr() {
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, m: &log::Metadata<'_>) -> bool {
            m.level() <= log::Level::Warn
        }
        fn log(&self, r: &log::Record<'_>) {
            if self.enabled(r.metadata()) {
                eprintln!("upager: {}", r.args());
            }
        }
        fn flush(&self) {}
    }
    static LOGGER: Stderr = Stderr;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

#[cfg(test)]
mod tests {
    /// The engine's modules, lowest layer first: each may use only the ones
    /// before it.
    // (Not formatted: rustfmt lays out an array one element a line once an
    // element is longer than 10 characters, as "readahead" is.)
    #[rustfmt::skip]
    const LAYERS: &[&str] = &[
        "sync", "private_dir", "config", "info", "error", "folio", "trace", "stats",
        "store", "direct", "cache", "rings", "swap", "file_store", "shares",
        "pool", "warm_format", "warm_record", "warm_replay", "warm", "twins",
        "budget", "ztier",
        "area", "table", "lru", "thp", "shared", "gather", "reclaim", "poison", "install", "huge",
        "readahead", "fill", "poolfault", "dirty", "ahead", "fault", "inthread", "lineage", "region",
        "advice", "pager", "fork",
    ];

    /// The engine's modules form the DAG that lib.rs lists and
    /// docs/design.md draws: a module uses (`crate::x`) only modules listed
    /// before it, so no import cycle can come back unnoticed.
    #[test]
    fn modules_form_the_documented_dag() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let lib = std::fs::read_to_string(format!("{dir}/lib.rs")).unwrap();
        let mut mods: Vec<&str> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        mods.sort_unstable();
        let mut listed = LAYERS.to_vec();
        listed.sort_unstable();
        assert_eq!(mods, listed, "every module has its place in LAYERS");
        let order = LAYERS;
        for (pos, m) in order.iter().enumerate() {
            let src = std::fs::read_to_string(format!("{dir}/{m}.rs")).unwrap();
            for line in src.lines() {
                let code = line.split("//").next().unwrap_or("");
                for part in code.split("crate::").skip(1) {
                    let used: String = part
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let Some(at) = order.iter().position(|x| *x == used) else {
                        continue; // a re-export from lib.rs (crate::MapOptions)
                    };
                    assert!(
                        at < pos,
                        "{m} uses crate::{used}, which comes after it in the layer order \
                         ({order:?}): move the code, or move the module, not both ways"
                    );
                }
            }
        }
    }
}
