//! Counters with stable names.
//!
//! The names are ABI: the C API, the Python package and the CLI print the
//! same snake_case names (like `mm/vmstat.c`'s `vmstat_text`). Add new ones at
//! the end; never rename. Paired counters follow the kernel's PGSCAN/PGSTEAL
//! pattern: `reclaim_scanned` vs `evictions`, split by actor
//! (`evict_direct` / `evict_background` / `evict_pageout`), plus the
//! shootdown-causing calls (`tlb_flush_batches`, `wp_unprotects`).
//!
//! Each counter is a relaxed atomic padded to its own cache line: they are
//! statistics, never used for synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Live counters of one pager (internal; read them with [`Stats`]).
        #[derive(Default, Debug)]
        pub(crate) struct Counters {
            $(pub $name: Padded,)*
        }

        /// A snapshot of a pager's counters. Field names are stable.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Stats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Stats {
            /// Every counter's stable name, in a fixed order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name),)*];

            /// `(name, value)` pairs in [`Stats::NAMES`] order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name),)*].into_iter()
            }

            /// The value of the counter called `name`.
            pub fn get(&self, name: &str) -> Option<u64> {
                self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
            }

            /// Adds `v` to the counter called `name` (none: nothing).
            pub(crate) fn add(&mut self, name: &str, v: u64) {
                $(if name == stringify!($name) { self.$name += v; return; })*
            }
        }

        impl Counters {
            pub fn snapshot(&self) -> Stats {
                Stats { $($name: self.$name.get(),)* }
            }
        }
    };
}

counters! {
    /// Faults on a page with no mapping (first touch or after eviction).
    faults_missing,
    /// Write faults on a write-protected (clean) page: the folio becomes dirty.
    faults_wp,
    /// Faults that found their folio busy and waited for it.
    faults_deferred,
    /// Fault messages already resolved by someone else when read.
    faults_stale,
    /// Faults answered with SIGBUS (store read failed, beyond end of file, no memory).
    faults_failed,
    /// Folios filled from the store or with zeros.
    fills,
    /// Of `fills`, folios filled by readahead or prefetch rather than a fault.
    fills_readahead,
    /// Bytes read from stores.
    bytes_read,
    /// Bytes written to stores.
    bytes_written,
    /// Folios evicted (memory released).
    evictions,
    /// Eviction batches (each: one unmap flush, plus one write-protect flush per span of dirty folios).
    evict_batches,
    /// Of `evictions`, by a fault that found the budget full (direct reclaim).
    evict_direct,
    /// Of `evictions`, by the background reclaimer.
    evict_background,
    /// Of `evictions`, by `pageout`.
    evict_pageout,
    /// Folios examined by reclaim (isolated, skipped, or moved between lists).
    reclaim_scanned,
    /// Folios written back (eviction or flush).
    writebacks,
    /// Folio write-backs that failed (the folio stays resident and dirty).
    writeback_errors,
    /// Store reads that failed.
    read_errors,
    /// Calls that flush the TLB for eviction or write-back: write-protect spans plus process_madvise calls.
    tlb_flush_batches,
    /// Write-protect removals on first write (one flush each).
    wp_unprotects,
    /// Faults that had to reclaim memory themselves before filling.
    direct_reclaim_stalls,
    /// Fills of folios that had been evicted before.
    refaults,
    /// Of `refaults`, those soon enough after eviction to go to the active list.
    refaults_activated,
    /// Active folios moved back to the inactive list.
    deactivations,
    /// `flush()` calls completed.
    flushes,
    /// Resident bytes now (gauge).
    resident_bytes,
    /// Highest `resident_bytes` seen (never above the budget).
    resident_peak_bytes,
    /// The budget (gauge).
    budget_bytes,
    /// Folios discarded (contents dropped).
    discards,
    /// Lock acquisitions by reclaim (LRU isolation and swap-slot allocation): one per batch each when removal is batched.
    reclaim_lock_acquisitions,
    /// Folios evicted with their contents in the store: the markers of seed 004 (gauge; counted when read).
    evicted_markers,
    /// Bytes of file-backed memory dirty now (gauge; at most the dirty limit, plus what write faults in flight add).
    dirty_bytes,
    /// Write faults that found the dirty limit reached and wrote dirty folios back first.
    dirty_throttled,
    /// Write faults answered with SIGBUS because the store refuses writes (full disk, I/O error) and the dirty limit is reached.
    writes_refused,
    /// In-thread mode: faults taken by upager's SIGBUS handler in the faulting thread.
    faults_in_thread,
    /// Of `faults_in_thread`, those handed to a resolver thread (reclaim needed, the dirty limit, a store that is not signal-safe, an error).
    faults_handed_off,
    /// Bytes pinned now (`Region::pin`; gauge).
    pinned_bytes,
    /// System calls that submitted write-back I/O to stores (`io_uring_enter`, or one `pwrite` per run of folios without batching): against `writebacks`, how well batches are submitted together.
    writeback_submits,
    /// Fills of 2 MiB folios moved into the view as one huge page (`UFFDIO_MOVE` of a staged THP).
    thp_fills,
    /// Fills of 2 MiB folios that could not get a huge page (fragmented memory, no staged THP) and were copied as base pages instead.
    thp_fill_fallback,
    /// 2 MiB folios evicted while mapped as one huge page.
    thp_evictions,
    /// Bytes of memory the engine itself holds besides the folios (fill buffers, staging, tables; gauge).
    overhead_bytes,
    /// Of `thp_evictions`, huge pages moved out of the view into a staging slot (recycled for a later fill, not freed).
    thp_recycled,
    /// Read fills of 2 MiB folios that a write reached between the move and the write-protect (published dirty, so the write is kept).
    thp_fill_raced,
    /// Stores that landed in a folio upager then could not keep (a fill the kernel refused half-way and a store that refused the rescue write); always logged. Should stay 0.
    writes_lost,
    /// Calls the kernel refused where it should not have (write-protect, unprotect, unmap of a batch); each logged, the folios concerned kept resident and dirty.
    kernel_call_errors,
    /// Folios written back by the background writer because they had been dirty longer than the dirty expiry (`dirty_expire`).
    writebacks_aged,
    /// Faults (or waits of a faulting thread) that took longer than a second; each logged with its folio's trace.
    faults_slow,
    /// Twins made: copies of a clean folio taken at its first write because its file is mapped writable more than once (in this process or another); charged to the budget until the folio is written back or dropped.
    twins_made,
    /// Folios written back as a diff against their twin (only the bytes this region changed, merged into the store's current contents under a byte-range lock of the folio).
    diff_writebacks,
    /// Times this pager found a second writer of a file it maps writable (another region, pager or process) and turned twins on for that file, writing back its dirty folios first.
    writer_switches,
    /// Readahead windows the prefetch thread filled ahead of a sequential stream while the stream's fault filled the window before (async readahead; `fills_readahead` counts their folios).
    readahead_async,
    /// Folios read ahead of the program in the order a warm-start trace recorded (`MapOptions::warm`, warm.rs).
    replay_reads,
    /// Of `replay_reads`, folios the program's faults had passed in the trace's order by the time they were counted (userfaultfd does not see a read of an installed page: this is the trace's progress, not an access).
    replay_hits,
    /// Of `replay_reads`, folios evicted before the program's faults reached their place in the trace (read for nothing).
    replay_wasted,
    /// Compressed tier (ztier.rs): folios evicted into the compressed pool instead of the swap file.
    ztier_stores,
    /// Compressed tier: refaults served by decompressing from the pool instead of reading the swap file.
    ztier_loads,
    /// Compressed tier: evicted folios sent to the swap file because they did not compress (their batch's sample, or the folio itself, above 3/4 of its size) or the pool had no room.
    ztier_rejects,
    /// Compressed tier: pool entries written out to the swap file to make room (the pool at its cap, or the budget under pressure).
    ztier_writebacks,
    /// Compressed tier: folios the pool holds now (gauge).
    ztier_folios,
    /// Compressed tier: compressed bytes the pool holds now (gauge).
    ztier_bytes,
    /// Compressed tier: bytes of the budget the pool takes now, headers and holes included (gauge; part of `resident_bytes`).
    ztier_pool_bytes,
    /// Compressed tier: folio bytes held in the pool less the pool's bytes: what it saves of the budget now (gauge).
    ztier_saved_bytes,
    /// Compressed tier: nanoseconds spent compressing (sampling included).
    ztier_compress_ns,
    /// Compressed tier: nanoseconds spent decompressing refaults.
    ztier_decompress_ns,
}

/// Where the fills of missing faults spend their time in the engine,
/// summed over the fills timed ([`PagerBuilder::fault_timing`]): what
/// upager adds to a fault besides the kernel's own round trip (the wake of a
/// handler thread, the faulting thread's retry), which no handler can see.
///
/// [`PagerBuilder::fault_timing`]: crate::PagerBuilder::fault_timing
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultPhases {
    /// Fills timed (counted when they start; a fill that fails early adds
    /// to the phases it went through).
    pub fills: u64,
    /// From the handler taking the message to the folio claimed: region
    /// lookup, state word, dirty-limit check.
    pub lookup_ns: u64,
    /// Charging the budget (direct reclaim included when it was full).
    pub reserve_ns: u64,
    /// Readahead decision and the store read.
    pub read_ns: u64,
    /// `UFFDIO_COPY`.
    pub copy_ns: u64,
    /// Publishing counters and state words, `UFFDIO_WAKE`.
    pub wake_ns: u64,
    /// LRU insertion and the reclaimer's kick.
    pub lru_ns: u64,
}

impl FaultPhases {
    /// `(phase, µs per fill)` in fault order.
    pub fn per_fill_us(&self) -> [(&'static str, f64); 6] {
        let n = self.fills.max(1) as f64 * 1000.0;
        [
            ("lookup", self.lookup_ns as f64 / n),
            ("reserve", self.reserve_ns as f64 / n),
            ("read", self.read_ns as f64 / n),
            ("copy", self.copy_ns as f64 / n),
            ("wake", self.wake_ns as f64 / n),
            ("lru", self.lru_ns as f64 / n),
        ]
    }
}

impl std::fmt::Display for FaultPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phases = self.per_fill_us();
        let total: f64 = phases.iter().map(|p| p.1).sum();
        write!(f, "{} fills, {total:.2} us each in the engine:", self.fills)?;
        for (name, us) in phases {
            write!(f, " {name} {us:.2}")?;
        }
        Ok(())
    }
}

/// The running sums behind [`FaultPhases`].
#[derive(Default, Debug)]
pub(crate) struct PhaseClock {
    pub fills: Padded,
    pub lookup: Padded,
    pub reserve: Padded,
    pub read: Padded,
    pub copy: Padded,
    pub wake: Padded,
    pub lru: Padded,
}

impl PhaseClock {
    pub fn snapshot(&self) -> FaultPhases {
        FaultPhases {
            fills: self.fills.get(),
            lookup_ns: self.lookup.get(),
            reserve_ns: self.reserve.get(),
            read_ns: self.read.get(),
            copy_ns: self.copy.get(),
            wake_ns: self.wake.get(),
            lru_ns: self.lru.get(),
        }
    }
}

/// A relaxed counter on its own cache line.
#[derive(Default, Debug)]
#[repr(align(64))]
pub(crate) struct Padded(AtomicU64);

impl Padded {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_unique() {
        let mut n = Stats::NAMES.to_vec();
        assert_eq!(n[0], "faults_missing");
        assert!(n.contains(&"tlb_flush_batches") && n.contains(&"evict_batches"));
        n.sort_unstable();
        n.dedup();
        assert_eq!(n.len(), Stats::NAMES.len());
        let c = Counters::default();
        c.evictions.add(3);
        assert_eq!(c.snapshot().get("evictions"), Some(3));
    }
}
