//! The shared core of a pager: the state its handles, regions and threads share
//! ([`Shared`]), and the owner of its threads ([`Owner`]).
//!
//! `Shared` holds one of each service the mechanisms above it use — the
//! userfaultfd, the pidfd for batched `process_madvise`, the options, the
//! counters, the region table, the budget, the LRU lists, the shared stores
//! — and the small amount of state of its own (the eviction clock, the
//! reclaimer's kick, the stop flag). Each mechanism adds its behaviour in
//! its own module (`reclaim`, `gather`, `fault`), never the other way round.
//!
//! Lifetime: regions hold the [`Owner`], so a pager's threads and its
//! userfaultfd outlive every region; dropping the last handle stops the
//! threads (`stop`, the stop eventfd, the reclaimer's kick) and joins them.
//!
//! Uses: `area`, `budget`, `config`, `error`, `folio`, `lru`, `stats`,
//! `store`, `table`.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use upager_sys::futex;
use upager_sys::mem::{AlignedBuf, SelfPidfd};
use upager_sys::uffd::{feature, Uffd};

use crate::area::Area;
use crate::budget::Budget;
use crate::config::{FaultMode, PagerBuilder, DEFAULT_BATCH_BYTES, MAX_FOLIO, MIN_FOLIO};
use crate::error::PagerError;
use crate::folio::{State, WAITER};
use crate::lru::Lru;
use crate::shares::Shares;
use crate::stats::{Counters, PhaseClock};
use crate::table::RegionTable;

/// State shared by a pager's handles, regions and threads.
pub(crate) struct Shared {
    /// The userfaultfds regions are registered on: one per shard (handler
    /// mode; see [`PagerBuilder::uffd_shards`]), one in-thread.
    ///
    /// [`PagerBuilder::uffd_shards`]: crate::PagerBuilder::uffd_shards
    pub uffds: Vec<Uffd>,
    pub pidfd: SelfPidfd,
    /// What the kernel let this pager use (probed at start).
    pub info: crate::info::PagerInfo,
    pub cfg: PagerBuilder,
    /// How faults are resolved (from `cfg`, checked by the builder).
    pub mode: FaultMode,
    pub counters: Counters,
    /// Phase times of fills, when `fault_timing` is on.
    pub phases: PhaseClock,
    pub table: RegionTable,
    pub budget: Budget,
    pub lru: Lru,
    /// Stores shared between regions (files, swap).
    pub stores: Shares,
    /// Pages evicted so far (the clock of refault distances).
    pub evict_seq: AtomicU64,
    /// Prefetch requests queued or in progress.
    pub prefetch_pending: AtomicU64,
    /// In-thread mode: faults handed to resolver threads.
    pub handoff: Handoff,
    /// Windows the fault path asks the prefetch thread to read ahead.
    pub ahead: Ahead,
    /// In-thread mode: scratch spaces for SIGBUS handlers (taken with
    /// `try_lock`, never waited for).
    pub sig_ctxs: Vec<Mutex<Ctx>>,
    /// Staged huge pages for 2 MiB folios.
    pub thp: crate::thp::ThpPool,
    /// Bytes of fill buffers grown beyond [`CTX_KEEP`] (gauge).
    buf_grown: AtomicU64,
    kick: Kick,
    stop: AtomicBool,
    stop_fd: upager_sys::io::EventFd,
    next_id: AtomicU64,
    /// When the pager started: the clock of [`Shared::dirty_tick`].
    born: std::time::Instant,
    /// A slow fault noticed in a SIGBUS handler (its address; 0: none),
    /// logged by the reclaimer thread ([`Shared::log_slow_fault`]).
    slow_addr: AtomicU64,
}

/// The background reclaimer's doorbell: a futex word (1 = rung), so a
/// SIGBUS handler may ring it too.
#[derive(Default)]
struct Kick {
    bell: AtomicU32,
}

/// Most readahead windows waiting for the prefetch thread at once (async
/// readahead, readahead.rs); a request finding every slot taken is dropped
/// (the stream's next fault then reads that window itself).
pub(crate) const AHEAD_SLOTS: usize = 8;

/// Async readahead requests: the address of a window's first folio per
/// slot (0: free), and the prefetch thread's doorbell, bumped for each
/// request (a futex word: a SIGBUS handler may post one); `reached`: the
/// address of the last folio a stream on a network store waited for
/// while it was read ahead (readahead.rs, `note_reached`; 0: none) — one
/// word for all streams: a second stream's note may replace the first's,
/// whose next window then waits for its next fault, as without it;
/// `reading`: the window each window reader (the prefetch thread, the
/// window thread) is reading from a network store now, so that a stream
/// reaching it asks for the next one at once (`note_reached`).
#[derive(Default)]
pub(crate) struct Ahead {
    pub bell: AtomicU32,
    pub slots: [AtomicU64; AHEAD_SLOTS],
    pub reached: AtomicU64,
    pub reading: [Reading; WINDOW_READERS],
    /// The window thread's doorbell (`ring_window`).
    pub window_bell: AtomicU32,
}

/// Threads that read async readahead windows: the prefetch thread (any
/// window, reader 0) and the window thread (windows of stores whose reads
/// are round trips, reader 1), so that a stream on a network store has
/// two windows in flight.
pub(crate) const WINDOW_READERS: usize = 2;

/// The folio addresses `[first, past)` of the window one reader is reading
/// (`past` 0: none). Set before its folios are claimed, cleared after they
/// went in; read without a lock (a stale pair asks for a window the
/// readers then find taken or resident).
#[derive(Default)]
pub(crate) struct Reading {
    pub first: AtomicU64,
    pub past: AtomicU64,
}

/// Most faults that can wait for a resolver thread at once (in-thread
/// mode); a fault finding every slot taken yields and retries.
pub(crate) const HANDOFF_SLOTS: usize = 32;

/// Faults an in-thread SIGBUS handler hands to a resolver thread (see
/// `inthread`): the slots and the resolvers' doorbell, all futex words.
#[derive(Default)]
pub(crate) struct Handoff {
    /// Bumped for each posted fault; resolvers wait on it.
    pub bell: AtomicU32,
    pub slots: [Slot; HANDOFF_SLOTS],
}

/// One handed-off fault: `state` goes FREE -> CLAIMED (by the faulting
/// thread) -> POSTED -> TAKEN (by a resolver) -> DONE -> FREE (by the
/// faulting thread); the faulting thread waits on `state`.
#[derive(Default)]
pub(crate) struct Slot {
    pub state: AtomicU32,
    pub addr: AtomicU64,
    /// 0 read, 1 write, 2 unknown.
    pub write: AtomicU32,
}

/// Per-thread scratch space of fault resolution: a fill buffer, the
/// userfaultfd message buffers, and the lists of the fill in progress, all
/// allocated up front so a fill allocates nothing (a SIGBUS handler may
/// run it).
pub(crate) struct Ctx {
    pub buf: AlignedBuf,
    pub raw: Vec<u8>,
    pub msgs: Vec<upager_sys::uffd::Msg>,
    /// LRU entries of the fill in progress.
    pub queue: Vec<(usize, bool)>,
    /// Previous states of the readahead folios claimed by the fill.
    pub extras: Vec<State>,
    /// Start of the phase being timed (`fault_timing`).
    pub mark: Option<std::time::Instant>,
    /// Running in a SIGBUS handler: only async-signal-safe steps; anything
    /// else is handed to a resolver thread.
    pub in_signal: bool,
    /// Bytes of `buf` fills may have touched since it was last shrunk
    /// ([`Shared::shrink_ctx`]); at least [`CTX_KEEP`].
    pub high: usize,
    /// A prefetch batch's data, read with one `Store::read_batch`: the
    /// next fill of folio `.0` takes its bytes from `.1` (an offset in the
    /// prefetch buffer) instead of reading the store.
    pub pre: Option<(usize, usize)>,
    /// The prefetch batch's buffer, kept from batch to batch until the
    /// thread idles (`shrink_ctx`).
    pub pre_buf: Option<AlignedBuf>,
    /// The prefetch thread's: it serves posted readahead windows between
    /// the batches of a request (ahead.rs).
    pub prefetcher: bool,
    /// Which window reader this is (`Ahead::reading`): 0 the prefetch
    /// thread, 1 the window thread.
    pub reader: usize,
    /// A warm-start replay's batches are being filled (ahead.rs,
    /// `replay_step`): not the program's own fills, which a replay that
    /// the program left records for the next map (warm.rs).
    pub replaying: bool,
}

/// Bytes of a fill buffer kept resident when its thread is idle: a default
/// folio. A readahead run touches up to the whole buffer (2 MiB by
/// default); idle threads give the rest back, so the engine's own memory
/// grows with work and shrinks back after it (counter `overhead_bytes`).
pub(crate) const CTX_KEEP: usize = 64 << 10;

/// How long a handler, resolver or prefetch thread waits for work before
/// it checks for shutdown; a thread that waited this long without work
/// gives back the part of its fill buffer a readahead run grew.
/// Logs that a fault on folio `idx` of `r` waited `how_long`, with the
/// folio's trace.
fn warn_slow(r: &Area, idx: usize, how_long: &str) {
    log::warn!(
        "a fault waited {how_long} for region {} ({}) folio {idx}; its last state changes:\n{}",
        r.id,
        r.store.describe(),
        r.trace.dump(idx..idx + 1)
    );
}

/// A fault that waits longer than this is logged with its folio's trace
/// (`faults_slow`): a stall explains itself.
pub(crate) const SLOW_FAULT: Duration = Duration::from_secs(1);

/// Resolution of the dirty-age clock ([`Shared::dirty_tick`]).
pub(crate) const DIRTY_TICK: Duration = Duration::from_millis(100);

pub(crate) const IDLE: Duration = Duration::from_millis(200);

/// What one engine thread costs besides its scratch space, as
/// `overhead_bytes` counts it: its stack and its allocator arena as far as
/// they are touched. Measured (2026-11-24, glibc 2.36, Linux 6.18): the
/// process's resident memory minus the folios and the counted buffers and
/// tables, after a scan, came to 180-330 KiB per engine thread.
pub(crate) const THREAD_BYTES: u64 = 320 << 10;

/// Messages read per `read(2)` of the userfaultfd.
pub(crate) const MSGS_PER_READ: usize = 64;

impl Ctx {
    pub fn new(buf_bytes: usize, in_signal: bool) -> Ctx {
        let folios = buf_bytes / MIN_FOLIO as usize + 1;
        Ctx {
            buf: AlignedBuf::zeroed(buf_bytes),
            raw: vec![0; MSGS_PER_READ * upager_sys::uffd::MSG_SIZE],
            msgs: Vec::with_capacity(MSGS_PER_READ),
            queue: Vec::with_capacity(folios),
            extras: Vec::with_capacity(folios),
            mark: None,
            in_signal,
            high: CTX_KEEP,
            pre: None,
            pre_buf: None,
            prefetcher: false,
            reader: 0,
            replaying: false,
        }
    }
}

impl Shared {
    /// Opens the userfaultfd (with the features upager needs) and the pidfd,
    /// probing what the kernel and any seccomp filter allow (kernel
    /// features, not the version: `upager_sys::features`), and decides
    /// the fault mode where the builder left it open.
    pub fn new(cfg: PagerBuilder) -> Result<Shared, PagerError> {
        upager_sys::features::init().map_err(PagerError::MaskFeatures)?;
        let choice = cfg.userfaultfd.clone().map_err(PagerError::Userfaultfd)?;
        let first = Uffd::open(choice.policy()).map_err(crate::error::no_userfaultfd)?;
        let user_mode_only = first.user_mode_only();
        // Where only a user-mode-only userfaultfd may be had, system calls
        // on non-resident region memory fail with EFAULT in either mode,
        // so the faster in-thread mode costs nothing (measured: docs/benchmarks.md, "The fault path and the two fault modes").
        let mode = match cfg.fault_mode.clone() {
            Ok(Some(m)) => m,
            Ok(None) if user_mode_only => FaultMode::InThread,
            Ok(None) => FaultMode::Handlers,
            Err(e) => return Err(PagerError::FaultMode(e)),
        };
        let sigbus = if mode == FaultMode::InThread {
            feature::SIGBUS
        } else {
            0
        };
        let shards = match mode {
            FaultMode::InThread => 1,
            _ => cfg.uffd_shards.unwrap_or(cfg.handler_threads),
        };
        // The other shards the same kind as the first.
        let same = if user_mode_only {
            upager_sys::uffd::OpenPolicy::UserModeOnly
        } else {
            upager_sys::uffd::OpenPolicy::KernelFaults
        };
        // UFFDIO_API refuses (EINVAL) a feature bit the kernel does not
        // know, so ask a throw-away userfaultfd what it supports (asking
        // for none, it reports all) and ask for no more than that.
        let supported = Uffd::open(same)
            .map_err(crate::error::no_userfaultfd)?
            .api(0)
            .map_err(PagerError::Api)?;
        let want = (feature::THREAD_ID
            | feature::PAGEFAULT_FLAG_WP
            | feature::POISON
            | feature::MOVE
            | sigbus)
            & supported;
        let mut uffds = Vec::with_capacity(shards);
        let mut can_move = true;
        let mut can_poison = true;
        let mut first = Some(first);
        for _ in 0..shards {
            let uffd = match first.take() {
                Some(u) => u,
                None => Uffd::open(same).map_err(crate::error::no_userfaultfd)?,
            };
            let got = uffd.api(want).map_err(PagerError::Api)?;
            can_move &= got & feature::MOVE != 0;
            can_poison &= got & feature::POISON != 0;
            for (bit, name) in [
                (feature::PAGEFAULT_FLAG_WP, "write-protect faults on anonymous memory (UFFD_FEATURE_PAGEFAULT_FLAG_WP: Linux 5.7 on x86-64, 6.10 on arm64)"),
                (sigbus, "UFFD_FEATURE_SIGBUS, which the in-thread fault mode needs (the handlers mode does not)"),
            ] {
                if got & bit != bit {
                    return Err(PagerError::MissingFeature(name));
                }
            }
            uffds.push(uffd);
        }
        // Whether a huge page moved in landed as one is checked with
        // PAGEMAP_SCAN (6.7): without it, no moves (6.8) either.
        let scan = upager_sys::pagemap::scan_available();
        can_move &= scan;
        let pidfd = SelfPidfd::open();
        let info = crate::info::PagerInfo {
            fault_mode: mode,
            user_mode_only,
            batched_unmap: pidfd.batched(),
            io_uring: uring_available(),
            uffd_move: can_move,
            uffd_poison: can_poison,
            pagemap_scan: scan,
            masked: upager_sys::features::masked_names(),
        };
        info.log_once(pidfd.unbatched_reason());
        let thp = crate::thp::ThpPool::new(can_move, &uffds[0]);
        Ok(Shared {
            uffds,
            pidfd,
            info,
            counters: Counters::default(),
            phases: PhaseClock::default(),
            table: RegionTable::new(cfg.lookup),
            budget: Budget::new(cfg.budget, cfg.dirty_limit),
            lru: {
                let l = Lru::default();
                l.fail_try_add_every(cfg.debug_lru_try_fail_every);
                l
            },
            stores: Shares::default(),
            evict_seq: AtomicU64::new(0),
            prefetch_pending: AtomicU64::new(0),
            buf_grown: AtomicU64::new(0),
            thp,
            kick: Kick::default(),
            stop: AtomicBool::new(false),
            stop_fd: upager_sys::io::EventFd::new().map_err(PagerError::EventFd)?,
            next_id: AtomicU64::new(1),
            born: std::time::Instant::now(),
            slow_addr: AtomicU64::new(0),
            handoff: Handoff::default(),
            ahead: Ahead::default(),
            sig_ctxs: if mode == FaultMode::InThread {
                let n = (2 * upager_sys::io::online_cpus() + 2).min(64);
                let bytes = fill_buf_bytes(&cfg);
                (0..n).map(|_| Mutex::new(Ctx::new(bytes, true))).collect()
            } else {
                Vec::new()
            },
            mode,
            cfg,
        })
    }

    /// Now, in ticks of [`DIRTY_TICK`] since the pager started, modulo
    /// 2^24 (the width of the state word's sequence field, where a DIRTY
    /// folio keeps the tick it became dirty at: 19 days before it wraps).
    /// Async-signal-safe (a clock read).
    pub fn dirty_tick(&self) -> u64 {
        (self.born.elapsed().as_millis() as u64 / DIRTY_TICK.as_millis() as u64)
            & crate::folio::SEQ_MASK
    }

    /// A fault at `addr` (in region `r`, folio `idx`) has waited `waited`,
    /// more than [`SLOW_FAULT`]: counted in `faults_slow` and logged with
    /// the folio's trace, so a stall explains itself. In a SIGBUS handler
    /// (`in_signal`) nothing may be logged: the address is left for the
    /// reclaimer thread, which logs it (one at a time; a second one noticed
    /// meanwhile is only counted).
    pub fn note_slow_fault(&self, r: &Area, idx: usize, waited: Duration, in_signal: bool) {
        self.counters.faults_slow.inc();
        if in_signal {
            let _ = self.slow_addr.compare_exchange(
                0,
                r.folio_addr(idx).max(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            self.kick_reclaimer();
            return;
        }
        warn_slow(r, idx, &format!("{:.1} s", waited.as_secs_f64()));
    }

    /// Logs a slow fault a SIGBUS handler noticed (reclaimer thread).
    pub fn log_slow_fault(&self) {
        let addr = self.slow_addr.swap(0, Ordering::AcqRel);
        if addr == 0 {
            return;
        }
        if let Some(r) = self.table.lookup(addr) {
            let idx = ((addr - r.base()) >> r.shift) as usize;
            warn_slow(&r, idx, &format!("more than {} s", SLOW_FAULT.as_secs()));
        }
    }

    /// `MADV_DONTNEED` over `ranges` (one `process_madvise`), checked:
    /// false if the kernel refused or advised fewer bytes than asked
    /// (counted in `kernel_call_errors`, logged unless `quiet`: a SIGBUS
    /// handler may not log). `what` says what was being dropped.
    pub fn zap(&self, ranges: &[upager_sys::mem::MapRange<'_>], what: &str, quiet: bool) -> bool {
        let want: u64 = ranges.iter().map(upager_sys::mem::MapRange::len).sum();
        let res = self.pidfd.dontneed(ranges);
        if matches!(res, Ok(n) if n >= want) {
            return true;
        }
        self.counters.kernel_call_errors.inc();
        if !quiet {
            log::error!(
                "dropping {what} ({want} bytes in {} ranges) failed: {res:?}",
                ranges.len()
            );
        }
        false
    }

    /// A new region id.
    pub fn next_region_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
    /// The pager is shutting down.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    /// Readable when the pager shuts down (handlers poll it beside the uffd).
    pub fn stop_fd(&self) -> &upager_sys::io::EventFd {
        &self.stop_fd
    }
    /// Bytes an eviction batch covers when no batch of folios was chosen:
    /// the builder's `batch_bytes`, else 4 MiB, or half the budget if that
    /// is less (small budgets work with the defaults).
    pub fn batch_bytes(&self) -> u64 {
        self.cfg.batch_bytes.unwrap_or_else(|| {
            DEFAULT_BATCH_BYTES
                .min(self.budget.limit() / 2)
                .max(MIN_FOLIO)
        })
    }
    /// Folios per eviction batch for a folio size.
    pub fn batch_folios(&self, folio: u64) -> usize {
        self.cfg
            .batch
            .unwrap_or(((self.batch_bytes() / folio) as usize).clamp(1, upager_sys::mem::MAX_IOV))
    }
    /// Fill buffer per handler thread: the largest readahead or folio.
    pub fn fill_buf_bytes(&self) -> usize {
        fill_buf_bytes(&self.cfg)
    }
    /// `n` folios of `r` became DIRTY (file-backed areas are counted).
    pub fn dirty_add(&self, r: &Area, n: u64) {
        if !r.is_anon() && n > 0 {
            self.budget.dirty_charge(n * r.folio);
        }
    }
    /// `n` DIRTY folios of `r` were written back, evicted or dropped.
    pub fn dirty_sub(&self, r: &Area, n: u64) {
        if !r.is_anon() && n > 0 {
            self.budget.dirty_uncharge(n * r.folio);
        }
    }
    /// Wakes faults waiting on folio `idx` if `prev` (the BUSY value just
    /// replaced) says there are any.
    pub fn wake_if_waiter(&self, r: &Area, idx: usize, prev: State) {
        if prev.has(WAITER) {
            self.wake_folios(r, idx, 1);
        }
    }
    /// Wakes the faults waiting on folios `[idx, idx+n)`: in handler mode
    /// they sleep in the kernel (`UFFDIO_WAKE` over the range); in-thread
    /// they wait on the folios' state words (futex). Async-signal-safe.
    pub fn wake_folios(&self, r: &Area, idx: usize, n: usize) {
        match self.mode {
            FaultMode::InThread => {
                for k in idx..idx + n {
                    futex::wake_low(r.state(k));
                }
            }
            _ => {
                // One UFFDIO_WAKE per shard the folios span.
                for (k, m) in r.shard_runs(idx, n) {
                    let _ = self.uffd_of(r, k).wake(r.folio_addr(k), r.folio * m as u64);
                }
            }
        }
    }

    /// A fill is about to use `bytes` of `ctx`'s buffer: counts what it
    /// touches beyond what was touched before. Async-signal-safe.
    pub fn note_buf_use(&self, ctx: &mut Ctx, bytes: usize) {
        if bytes > ctx.high {
            self.buf_grown
                .fetch_add((bytes - ctx.high) as u64, Ordering::Relaxed);
            ctx.high = bytes;
        }
    }

    /// A prefetch batch buffer of `bytes` was mapped (`overhead_bytes`).
    pub fn note_pre_buf(&self, bytes: usize) {
        self.buf_grown.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Unmaps a prefetch batch buffer (`overhead_bytes`).
    pub fn release_pre_buf(&self, buf: Option<AlignedBuf>) {
        if let Some(b) = buf {
            self.buf_grown.fetch_sub(b.len() as u64, Ordering::Relaxed);
        }
    }

    /// Gives back the part of an idle thread's fill buffer beyond
    /// [`CTX_KEEP`], if a fill used it, and its prefetch batch buffer.
    pub fn shrink_ctx(&self, ctx: &mut Ctx) {
        self.release_pre_buf(ctx.pre_buf.take());
        if ctx.high > CTX_KEEP {
            ctx.buf.release_from(CTX_KEEP);
            self.buf_grown
                .fetch_sub((ctx.high - CTX_KEEP) as u64, Ordering::Relaxed);
            ctx.high = CTX_KEEP;
        }
    }

    /// Shrinks the SIGBUS handlers' scratch spaces that are free now
    /// (in-thread mode; taken with `try_lock`, as the handlers do).
    pub fn shrink_sig_ctxs(&self) {
        for c in &self.sig_ctxs {
            if let Ok(mut ctx) = c.try_lock() {
                self.shrink_ctx(&mut ctx);
            }
        }
    }

    /// The engine's own memory besides folios, as counter `overhead_bytes`:
    /// the scratch spaces of fault resolution (the kept part of each fill
    /// buffer and its message buffer, plus what grown buffers hold now), the
    /// folio state tables of the regions (the chunks in use), and
    /// [`THREAD_BYTES`] per engine thread.
    pub fn overhead_bytes(&self) -> u64 {
        let ctxs = self.cfg.handler_threads + WINDOW_READERS + self.sig_ctxs.len();
        let per_ctx = (CTX_KEEP.min(self.fill_buf_bytes())
            + MSGS_PER_READ * upager_sys::uffd::MSG_SIZE) as u64;
        let tables: u64 = self.table.all().iter().map(|r| r.table_bytes()).sum();
        // Handlers (or resolvers), the window readers, the reclaimer.
        let threads = (self.cfg.handler_threads + WINDOW_READERS) as u64 + 1;
        ctxs as u64 * per_ctx
            + self.buf_grown.load(Ordering::Relaxed)
            + tables
            + threads * THREAD_BYTES
    }

    /// The userfaultfd folio `idx` of `r` is registered on.
    pub fn uffd_of(&self, r: &Area, idx: usize) -> &Uffd {
        &self.uffds[r.shard(idx) % self.uffds.len()]
    }

    /// Rings the reclaimer's doorbell (once until it answers).
    /// Async-signal-safe.
    pub fn kick_reclaimer(&self) {
        if self.kick.bell.swap(1, Ordering::AcqRel) == 0 {
            futex::wake(&self.kick.bell, 1);
        }
    }
    /// The reclaimer waits for its doorbell, at most `timeout`.
    /// True if it was rung, false after the timeout.
    pub fn wait_for_kick(&self, timeout: Duration) -> bool {
        if self.kick.bell.load(Ordering::Acquire) == 0 {
            futex::wait(&self.kick.bell, 0, Some(timeout));
        }
        self.kick.bell.swap(0, Ordering::AcqRel) != 0
    }

    /// Asks the prefetch thread to fill the readahead window whose first
    /// folio is at `addr` (async readahead). False if every slot is taken.
    /// Async-signal-safe.
    pub fn ask_ahead(&self, addr: u64) -> bool {
        if self
            .ahead
            .slots
            .iter()
            .any(|s| s.load(Ordering::Relaxed) == addr)
        {
            return true; // asked already
        }
        for s in &self.ahead.slots {
            if s.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.ring_prefetch();
                return true;
            }
        }
        false
    }

    /// [`Shared::ask_ahead`] for a window of `r`, waking the window thread
    /// too where `r`'s store is a network store's (its windows are the
    /// window thread's as well; a local stream's wake no one else: a
    /// second wake per 2 MiB window: a local numpy pass 2-4% slower,
    /// within the noise of 8 runs).
    /// Async-signal-safe.
    pub fn ask_window(&self, r: &Area, addr: u64) -> bool {
        let asked = self.ask_ahead(addr);
        if asked && r.store.round_trips() {
            self.ring_window();
        }
        asked
    }

    /// Wakes the prefetch thread (a window, a request or the stop is
    /// waiting). Async-signal-safe.
    pub fn ring_prefetch(&self) {
        self.ahead.bell.fetch_add(1, Ordering::AcqRel);
        futex::wake(&self.ahead.bell, 1);
    }

    /// Wakes the window thread (a network store's window or the stop is
    /// waiting). Async-signal-safe.
    pub fn ring_window(&self) {
        self.ahead.window_bell.fetch_add(1, Ordering::AcqRel);
        futex::wake(&self.ahead.window_bell, 1);
    }

    /// Tells every thread to stop.
    fn shut_down(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.stop_fd.signal();
        self.kick.bell.store(1, Ordering::Release);
        futex::wake(&self.kick.bell, u32::MAX);
        self.handoff.bell.fetch_add(1, Ordering::AcqRel);
        futex::wake(&self.handoff.bell, u32::MAX);
        self.ring_prefetch();
        self.ring_window();
    }
}

/// Fill buffer per fault-resolving thread: the largest readahead or folio.
fn fill_buf_bytes(cfg: &PagerBuilder) -> usize {
    cfg.readahead.max(MAX_FOLIO) as usize + MAX_FOLIO as usize
}

/// A prefetch request for the prefetch thread.
pub(crate) struct PrefetchRequest {
    pub region: Arc<Area>,
    pub folios: Range<usize>,
}

/// Owns the threads: dropped when the last handle (pager or region) goes.
pub(crate) struct Owner {
    pub shared: Arc<Shared>,
    /// Requests for the prefetch thread; dropped first on shutdown.
    prefetch_tx: Mutex<Option<std::sync::mpsc::Sender<PrefetchRequest>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Owner {
    /// An owner of `shared` whose prefetch requests go to `tx`.
    pub fn new(shared: Arc<Shared>, tx: std::sync::mpsc::Sender<PrefetchRequest>) -> Owner {
        Owner {
            shared,
            prefetch_tx: Mutex::new(Some(tx)),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Adopts a started thread (joined when the owner drops).
    pub fn adopt(&self, t: JoinHandle<()>) {
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t);
    }

    /// Queues a prefetch (the thread drops requests of unmapped regions).
    pub fn prefetch(&self, req: PrefetchRequest) {
        if let Some(tx) = self
            .prefetch_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            self.shared.prefetch_pending.fetch_add(1, Ordering::AcqRel);
            if tx.send(req).is_err() {
                self.shared.prefetch_pending.fetch_sub(1, Ordering::AcqRel);
            } else {
                self.shared.ring_prefetch();
            }
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.prefetch_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.shared.shut_down();
        for t in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = t.join();
        }
    }
}

/// Whether io_uring write-back rings can be made here: probed on a thread
/// of its own. A ring made and closed on the program's thread (the one
/// creating the pager) leaves the kernel's teardown work queued for that
/// thread (`task_work` with `TWA_SIGNAL`), and its next blocking socket
/// read with a timeout fails with `EINTR` (seen: the first Redis Cluster
/// GET of a warm start after `Pager::new`, which then reconnected to
/// every node, 0.2-0.4 s on a network of 10 ms round trips).
fn uring_available() -> bool {
    std::thread::Builder::new()
        .name("upager-probe".into())
        .spawn(|| upager_sys::uring::WriteRing::new(2).is_ok())
        .ok()
        .and_then(|t| t.join().ok())
        .unwrap_or(false)
}
