//! The fault path: handler threads read userfaultfd messages and resolve them.
//!
//! Contract:
//! - No lock on the way from a fault message to its resolution: the region
//!   is found in the lock-free table ([`RegionTable`](crate::table)), the
//!   folio is claimed by CAS on its state word ([`folio`]). The only lock a
//!   fill takes is the LRU lock, once, to queue the folios it installed.
//! - A folio is filled as one unit: one store read (with readahead: one read
//!   for the whole run) and one `UFFDIO_COPY` (seed 002), without waking;
//!   the states are published, then one `UFFDIO_WAKE` over the run wakes the
//!   faulting thread, so whatever it does next (a write, a residency query)
//!   sees the folios resident. (Measured: no cost, 115K random reads/s
//!   either way.) Read faults
//!   install the folio write-protected (CLEAN); write faults install it
//!   writable (DIRTY).
//! - The first write to a CLEAN folio raises a write-protect fault: the
//!   folio is claimed, unprotected (one ioctl, one flush) and becomes DIRTY.
//! - A fault on a BUSY folio sets WAITER and returns: the BUSY owner wakes
//!   it when it is done, and the faulting access retries.
//! - Every fault ends: a store read failure or a read beyond the end of the
//!   store poisons the folio (`UFFDIO_POISON`), so the access gets SIGBUS (a
//!   system call gets EFAULT); the reclaimer clears the poison after
//!   [`POISON_HOLD`](crate::reclaim::POISON_HOLD) so a later access retries.
//!
//! Readahead (read faults only: read-ahead folios are installed
//! write-protected, so a writer would pay an unprotect flush for each): when
//! the two folios before the faulting one are resident (a sequential
//! stream, whatever thread runs it), the fill also claims the
//! following non-resident folios, up to twice the run of resident folios
//! before the fault and at most the configured readahead: the window grows
//! 2, 4, 8, … like the kernel's context readahead, with no per-stream state.
//!
//! Async readahead (issue 23; `readahead_async`, on by default): a fault
//! whose window has grown to the full readahead asks the prefetch thread
//! for the next window (`Shared::ask_ahead`: a free slot of eight takes its
//! address, a futex doorbell wakes the thread; async-signal-safe) before it
//! reads its own, so the two windows are read on two CPUs at once, and the
//! stream's next fault comes two windows on. The prefetch thread fills the
//! window as a fault would (a whole run as one huge page where the region
//! fills runs), unless its first folio is taken already; it may reclaim
//! one batch to make room. Asking one window ahead balances the two CPUs
//! best when reading a window costs more than working on it (a numpy sum
//! over data decompressed from zram: 1.4 ms against 0.2 ms per 2 MiB).
//!
//! Several writers of one file (twins.rs): the write-protect fault keeps a
//! twin of a CLEAN folio before unprotecting it, and a missing write fault
//! is filled as a read so that it does.
//!
//! Mixed folio sizes (issue 23; `huge_runs`, off by default; file regions of
//! folios below 2 MiB, at least 8 MiB, 2 MiB-aligned view): once the window
//! has grown to 2 MiB (a stream of 1 MiB resident before the fault), it
//! ends at the end of the faulting folio's 2 MiB run, so the stream's next
//! fault starts a run; a read fault at a run's first folio with the window
//! grown claims the whole run and fills it as one huge page (a staged THP
//! moved in with one `UFFDIO_MOVE`, as 2 MiB folios are, thp.rs); with
//! async readahead the prefetch thread fills the next run the same way. A
//! run filled ahead of the stream has no page table to drop first (nobody
//! touched it), unless a thread touches it while it is being filled: that
//! fault allocates one, and the move then splits the huge page and moves
//! base pages (`thp_fill_fallback`; install_huge counts what left the
//! staged page itself, `moved_from`). Random faults, write faults, a run cut
//! by the end of the file or by a resident folio, and fills that find no
//! staged page stay the region's folios. The folio state words stay per
//! folio: a huge run is N folios CLEAN (or DIRTY) together. The first write
//! to one of them unprotects that folio only (the kernel splits the PMD and
//! keeps the uffd-wp bit on the other PTEs); eviction takes a run that is
//! still one PMD whole (reclaim.rs `claim_run_rest`, gather.rs: moved out
//! into a staging slot or unmapped with one range).
//!
//! Counters: `faults_missing`, `faults_wp`, `faults_deferred`,
//! `faults_stale`, `faults_failed`, `fills`, `fills_readahead`,
//! `readahead_async`, `bytes_read`, `read_errors`, `refaults`,
//! `refaults_activated`, `wp_unprotects`.
//!
//! Uses: `area`, `folio`, `gather`, `reclaim`, `shared`, `table`.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use upager_sys::futex;
use upager_sys::mem::MapRange;
use upager_sys::uffd::{Fill, Msg};

use crate::area::Area;
use crate::config::FaultMode;
use crate::folio::{self, Kind, State, ACTIVE, QUEUED, SEQ_MASK};
use crate::shared::{Ctx, Shared, IDLE};
use crate::trace::Path;

/// Longest wait of an in-thread fault on a BUSY folio before it retries
/// (its owner wakes it sooner: this bounds a missed wake).
const BUSY_WAIT: Duration = Duration::from_millis(20);

/// How long a fill keeps retrying the install of a folio that is already
/// partly mapped writable (see `settle_writable`) before giving up on it.
const SETTLE_FOR: Duration = Duration::from_secs(1);

/// Bytes of folios a prefetch request reads with one `Store::read_batch`
/// (1 MiB: 16 folios of 64 KiB; a guess that bounds the prefetch thread's
/// extra buffer while giving a network store a batch worth a round trip).
const PREFETCH_BATCH_BYTES: u64 = 1 << 20;

thread_local! {
    /// In-thread: the page this thread last waited on as BUSY, since when
    /// and when it last waited there (ns of the realtime clock), and
    /// whether that wait was reported slow (const-initialised, no
    /// destructor: signal-safe).
    static BUSY_SINCE: std::cell::Cell<(u64, u64, u64, bool)> = const { std::cell::Cell::new((0, 0, 0, false)) };
}

/// An in-thread fault at `addr` waited on a BUSY folio once more: how long
/// this thread has been waiting at that address, the first time that passes
/// [`SLOW_FAULT`](crate::shared::SLOW_FAULT) (None otherwise). Waits at
/// another address, or after a pause of several `BUSY_WAIT`s (a new wait,
/// not the same one retried), start the clock again.
fn busy_waited(addr: u64) -> Option<Duration> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let page = addr & !(upager_sys::PAGE_SIZE as u64 - 1);
    let gap = 5 * BUSY_WAIT.as_nanos() as u64;
    BUSY_SINCE.with(|c| {
        let (at, since, last, told) = c.get();
        if at != page || now.saturating_sub(last) > gap {
            c.set((page, now, now, false));
            return None;
        }
        let waited = Duration::from_nanos(now.saturating_sub(since));
        if !told && waited > crate::shared::SLOW_FAULT {
            c.set((at, since, now, true));
            return Some(waited);
        }
        c.set((at, since, now, told));
        None
    })
}

/// What left a staged huge page in a move that did not report success
/// (`Shared::moved_from`).
enum Left {
    /// These first bytes (what moves goes in address order).
    Prefix(usize),
    /// Pages left that are not one prefix (never seen).
    Scattered,
    /// The pagemap could not tell: the kernel's count is all there is.
    Unknown,
}

/// How a fault ended in one resolution attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Outcome {
    /// Resolved, or left to someone who will wake the faulting thread.
    Done,
    /// In a SIGBUS handler, a step that is not async-signal-safe is needed
    /// (reclaim, the dirty limit, a store that may allocate, an error):
    /// nothing was changed; hand the fault to a resolver thread.
    HandOff,
    /// In-thread: the folio is poisoned (its store read failed, or a write
    /// was refused): the access must end in SIGBUS, as the kernel's
    /// poison marker gives in handler mode.
    Sigbus,
}

impl Shared {
    /// Body of a fault-handler thread: serves the faults queued on
    /// userfaultfd `shard` and, when it has none, on the next one. Each
    /// shard is watched by two handlers (with one shard, all of them): a
    /// fault wakes two threads rather than every handler, and a handler
    /// stuck in a slow store read does not stall its shard.
    pub(crate) fn handler_main(self: Arc<Self>, shard: usize) {
        use std::os::fd::AsFd;
        let n = self.uffds.len();
        let own = &self.uffds[shard % n];
        let next = &self.uffds[(shard + 1) % n];
        let mut ctx = Ctx::new(self.fill_buf_bytes(), false);
        let spin = self.cfg.handler_spin;
        let mut spin_until = std::time::Instant::now();
        while !self.stopping() {
            let mut raw = std::mem::take(&mut ctx.raw);
            let mut msgs = std::mem::take(&mut ctx.msgs);
            let read = match own.read_msgs(&mut raw, &mut msgs) {
                Ok(0) if n > 1 => next.read_msgs(&mut raw, &mut msgs),
                other => other,
            };
            match read {
                Ok(0) if !spin.is_zero() && std::time::Instant::now() < spin_until => {
                    // Just served a fault: the next one usually follows within
                    // microseconds. Yielding (not blocking) lets the woken
                    // thread run on this CPU and saves the cross-CPU wakeup
                    // of a blocked handler (30-70 us on this VM).
                    std::thread::yield_now();
                }
                Ok(0) => {
                    let ready = upager_sys::io::poll_fds(
                        [own.as_fd(), next.as_fd(), self.stop_fd().as_fd()],
                        IDLE,
                    );
                    if matches!(ready, Ok([false, false, false])) {
                        // Idle for a while: give back what a readahead run
                        // grew the buffer to (not between the faults of a
                        // scan: it would be zeroed again at the next fill).
                        self.shrink_ctx(&mut ctx);
                    }
                }
                Ok(_) => {
                    for m in &msgs {
                        if let Msg::PageFault {
                            addr, write, wp, ..
                        } = *m
                        {
                            let _ = self.handle_fault(&mut ctx, addr, write, wp);
                        }
                    }
                    spin_until = std::time::Instant::now() + spin;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::error!("reading userfaultfd failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            ctx.raw = raw;
            ctx.msgs = msgs;
        }
    }

    /// Body of the prefetch thread: fills the readahead windows faults ask
    /// for ([`Shared::ask_ahead`], async readahead) and requested folios
    /// that are not resident, as a fault would, without a faulting thread.
    /// Stops a request when the budget is full after one batch of reclaim.
    /// Windows go first, between requests (a stream is waiting for them; a
    /// request in progress, such as a long `WILLNEED`, is finished first,
    /// and a stream reaching a window not read yet reads it itself).
    pub(crate) fn prefetch_main(
        self: Arc<Self>,
        rx: std::sync::mpsc::Receiver<crate::shared::PrefetchRequest>,
    ) {
        let mut ctx = Ctx::new(self.fill_buf_bytes(), false);
        loop {
            let bell = self.ahead.bell.load(Ordering::Acquire);
            let mut worked = false;
            for slot in &self.ahead.slots {
                let addr = slot.swap(0, Ordering::AcqRel);
                if addr != 0 && !self.stopping() {
                    self.fill_ahead(&mut ctx, addr);
                    worked = true;
                }
            }
            match rx.try_recv() {
                Ok(req) => {
                    self.prefetch_one(&mut ctx, req);
                    self.prefetch_pending.fetch_sub(1, Ordering::AcqRel);
                    worked = true;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
            }
            if self.stopping() {
                return;
            }
            if !worked && !futex::wait(&self.ahead.bell, bell, Some(IDLE)) {
                self.shrink_ctx(&mut ctx);
            }
        }
    }

    /// Async readahead: fills the window from `addr` that a sequential
    /// stream's fault asked for (see `fill`) — a whole 2 MiB run as one
    /// huge page where the region fills runs, else up to the readahead
    /// window of its folios — unless the stream, or anyone, got to its
    /// first folio first. Makes room with one batch of reclaim when the
    /// budget is full; gives up when that frees nothing.
    fn fill_ahead(&self, ctx: &mut Ctx, addr: u64) {
        let Some(r) = self.table.lookup(addr) else {
            return;
        };
        let idx = ((addr - r.base()) >> r.shift) as usize;
        if idx >= r.nfolios() || r.is_anon() {
            return;
        }
        let n = r.run_folios;
        let run_start = n > 0 && idx.is_multiple_of(n);
        let want = if run_start { n } else { self.window_max(&r) };
        if !self.budget.fits(r.folio * want as u64)
            && self.evict_batch(crate::gather::Mode::Background) == 0
        {
            return;
        }
        let mut extras = std::mem::take(&mut ctx.extras);
        extras.clear();
        let first = if run_start {
            self.claim_run_ahead(&r, idx, &mut extras)
        } else {
            None
        };
        let first = first.or_else(|| {
            let end = self.window_end(&r, idx, idx + want);
            self.claim_free(&r, idx..end, &mut extras);
            (!extras.is_empty()).then(|| extras.remove(0))
        });
        if let Some(old) = first {
            self.counters.readahead_async.inc();
            let _ = self.fill_claimed(ctx, &r, idx, old, &extras, false, true);
        }
        ctx.extras = extras;
    }

    /// Fills the folios of one prefetch request, a batch at a time: claim
    /// up to [`PREFETCH_BATCH_BYTES`] of non-resident folios (budget charged
    /// without reclaim), read them with one [`Store::read_batch`] (a
    /// network store sends them together: one round trip per server), then
    /// install each. A folio whose read failed goes back to its old state
    /// (a later fault reads it again and gets the error itself). When the
    /// budget has no room, one folio goes the way of a fault (fill
    /// reserves, reclaiming).
    ///
    /// [`Store::read_batch`]: crate::Store::read_batch
    fn prefetch_one(&self, ctx: &mut Ctx, req: crate::shared::PrefetchRequest) {
        let Some(r) = crate::area::Inflight::enter(&req.region) else {
            return;
        };
        let per_batch = if r.folio >= crate::thp::HUGE {
            1 // staged huge pages read into their own buffers
        } else {
            (PREFETCH_BATCH_BYTES / r.folio).max(1) as usize
        };
        let mut claimed: Vec<(usize, State)> = Vec::with_capacity(per_batch);
        let mut next = req.folios.start;
        while next < req.folios.end {
            // Unmap waits for this request (it holds the region in flight):
            // stop at the next batch once the region is dying.
            if self.stopping() || r.dying.load(Ordering::SeqCst) {
                return;
            }
            // Make room by evicting at most one batch per batch; stop when
            // even that frees nothing (a prefetch must not push out the
            // working set wholesale).
            let full = !self.budget.fits(r.folio);
            if full && self.evict_batch(crate::gather::Mode::Background) == 0 {
                break;
            }
            claimed.clear();
            while next < req.folios.end && claimed.len() < per_batch {
                if !self.budget.try_charge(r.folio) {
                    break;
                }
                match folio::try_claim(r.state(next), |s| {
                    matches!(s.kind(), Kind::Never | Kind::Evicted)
                }) {
                    Some(old) => claimed.push((next, old)),
                    None => self.budget.uncharge(r.folio),
                }
                next += 1;
            }
            if claimed.is_empty() {
                if next < req.folios.end && !self.budget.fits(r.folio) {
                    // No room without reclaim: one folio as a fault would.
                    if let Some(old) = folio::try_claim(r.state(next), |s| {
                        matches!(s.kind(), Kind::Never | Kind::Evicted)
                    }) {
                        let _ = self.fill(ctx, &r, next, old, false, true);
                    }
                    next += 1;
                }
                continue;
            }
            let ok = self.prefetch_read(ctx, &r, &claimed);
            for (k, &(idx, old)) in claimed.iter().enumerate() {
                if !ok[k] {
                    self.counters.read_errors.inc();
                    self.budget.uncharge(r.folio);
                    let prev = folio::release(r.state(idx), |_| old);
                    self.wake_if_waiter(&r, idx, prev);
                    continue;
                }
                if per_batch > 1 {
                    ctx.pre = Some((idx, k * r.folio as usize));
                }
                let _ = self.fill_claimed(ctx, &r, idx, old, &[], false, true);
                ctx.pre = None;
            }
            ctx.pre_buf = None;
        }
    }

    /// Reads the claimed folios of a prefetch batch into `ctx.pre_buf` with
    /// one [`Store::read_batch`](crate::Store::read_batch) (never-written
    /// anonymous folios are zeros, not read). Whether each read succeeded.
    fn prefetch_read(&self, ctx: &mut Ctx, r: &Area, claimed: &[(usize, State)]) -> Vec<bool> {
        if claimed.len() == 1 {
            return vec![true]; // fill_claimed reads it, as for a fault
        }
        let folio = r.folio as usize;
        let mut buf = upager_sys::mem::AlignedBuf::zeroed(claimed.len() * folio);
        let mut reqs = Vec::with_capacity(claimed.len());
        let mut which = Vec::with_capacity(claimed.len());
        let mut ok = vec![true; claimed.len()];
        let store_len = r.store.len();
        for ((k, part), &(idx, old)) in buf.chunks_mut(folio).enumerate().zip(claimed) {
            if let Some(off) = r.store_offset(idx, old) {
                let want = (folio as u64).min(store_len.saturating_sub(off)) as usize;
                if want > 0 {
                    reqs.push(crate::store::ReadReq {
                        buf: &mut part[..want.next_multiple_of(upager_sys::PAGE_SIZE).min(folio)],
                        offset: off,
                    });
                    which.push((k, want));
                }
            }
        }
        let done = r.store.read_batch(&mut reqs);
        drop(reqs);
        for ((k, want), res) in which.into_iter().zip(done) {
            match res {
                Ok(n) if n >= want => {
                    self.counters.bytes_read.add(want as u64);
                    buf[k * folio + want..(k + 1) * folio].fill(0);
                }
                _ => ok[k] = false,
            }
        }
        ctx.pre_buf = Some(buf);
        ok
    }

    /// Resolves one fault at `addr` reported by the userfaultfd (handler
    /// mode) or handed over by an in-thread SIGBUS handler.
    pub(crate) fn handle_fault(&self, ctx: &mut Ctx, addr: u64, write: bool, wp: bool) -> Outcome {
        if self.cfg.fault_timing {
            ctx.mark = Some(std::time::Instant::now());
        }
        let Some(r) = self.table.lookup(addr) else {
            // Being unmapped: the unmap wakes the thread once the range is
            // inaccessible, and the retry gets SIGSEGV.
            self.counters.faults_stale.inc();
            return Outcome::Done;
        };
        self.resolve(ctx, &r, addr, write, wp)
    }

    /// Resolves a fault at `addr` in region `r` (pinned by the caller).
    /// `wp`: a write to a resident folio (a write-protect fault). With
    /// `ctx.in_signal`, takes only async-signal-safe steps and returns
    /// [`Outcome::HandOff`], having changed nothing, where it would need
    /// another.
    pub(crate) fn resolve(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        addr: u64,
        write: bool,
        wp: bool,
    ) -> Outcome {
        let in_thread = self.mode == FaultMode::InThread;
        let idx = ((addr - r.base()) >> r.shift) as usize;
        let w = r.state(idx);
        // A fault at PTE level: a page table is under this run now (a huge
        // fill there must drop it first; see Area::take_table).
        if r.run_folios > 0 {
            r.note_table(idx, 1);
        }
        // The dirty limit: a write that would make a file folio dirty waits
        // for write-back above it, and is refused (SIGBUS) when the store
        // refuses writes. Reads never wait here.
        // (A pinned folio is exempt: it may not be dropped to refuse a write.)
        let s0 = folio::load(w);
        if (write || wp)
            && r.writable
            && !r.is_anon()
            && s0.kind() != Kind::Dirty
            && !s0.has(folio::PINNED)
        {
            if ctx.in_signal {
                if !self.budget.dirty_fits(r.folio) {
                    return Outcome::HandOff;
                }
            } else if !self.balance_dirty(r) && self.refuse_write(r, idx) {
                return Outcome::Done;
            }
        }
        loop {
            let s = folio::load(w);
            match s.kind() {
                Kind::Never | Kind::Evicted => {
                    if ctx.in_signal && !r.store.signal_safe() {
                        return Outcome::HandOff;
                    }
                    if let Some(old) =
                        folio::try_claim(w, |s| matches!(s.kind(), Kind::Never | Kind::Evicted))
                    {
                        // In a signal handler, counted when the fill is
                        // published (it may still be handed off).
                        if !ctx.in_signal {
                            self.counters.faults_missing.inc();
                        }
                        // A file with several writers is filled for
                        // reading: the write then faults on the protected
                        // folio, which makes its twin (twins.rs).
                        let write = write && !r.twinning();
                        return self.fill(ctx, r, idx, old, write, false);
                    }
                }
                Kind::Busy if in_thread => {
                    // The faulting thread waits on the state word (a
                    // resolver thread does not: the faulting thread retries
                    // and waits itself).
                    if !ctx.in_signal {
                        return Outcome::Done;
                    }
                    if folio::add_waiter(w) {
                        self.counters.faults_deferred.inc();
                        let v = folio::load(w);
                        if v.kind() == Kind::Busy && !v.has(folio::WAITER) {
                            // The BUSY period we registered in ended and a
                            // new one began (a wp fault, an eviction) that
                            // knows of no waiter: its owner would wake
                            // nobody. Register again. (Found by the shuttle
                            // model, tests/model.rs: a 20 ms stall per
                            // occurrence, the BUSY_WAIT timeout.)
                            continue;
                        }
                        if v.kind() == Kind::Busy {
                            futex::wait_low(w, v.0 as u32, Some(BUSY_WAIT));
                        }
                        if let Some(waited) = busy_waited(addr) {
                            self.note_slow_fault(r, idx, waited, true);
                        }
                        return Outcome::Done;
                    }
                }
                Kind::Busy => {
                    if folio::add_waiter(w) {
                        self.counters.faults_deferred.inc();
                        return Outcome::Done;
                    }
                }
                Kind::Clean | Kind::Dirty if wp && r.writable => {
                    // Several writers of the file: a twin first (twins.rs).
                    let twin = match self.twin_charge(ctx.in_signal, r, idx, s) {
                        Ok(t) => t,
                        Err(out) => return out,
                    };
                    let claimed =
                        folio::try_claim(w, |s| matches!(s.kind(), Kind::Clean | Kind::Dirty));
                    self.twin_claimed(r, idx, claimed, twin);
                    if let Some(old) = claimed {
                        self.counters.faults_wp.inc();
                        r.trace.record(idx, Path::WpClaim, old.kind(), Kind::Busy);
                        let fresh = old.kind() == Kind::Clean;
                        if fresh {
                            self.dirty_add(r, 1);
                        }
                        self.make_dirty(r, idx, ctx.in_signal, fresh);
                        return Outcome::Done;
                    }
                }
                Kind::Poisoned if in_thread => return Outcome::Sigbus,
                Kind::Poisoned if !self.info.uffd_poison => {
                    // No UFFDIO_POISON (before 6.6), and the folio's
                    // PROT_NONE was lifted (a region-wide mprotect): again.
                    self.counters.faults_stale.inc();
                    self.protect_poisoned(r, idx);
                    let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), r.folio);
                    return Outcome::Done;
                }
                Kind::Clean | Kind::Dirty | Kind::Poisoned => {
                    // Resolved before we got here (or poisoned: the retry
                    // raises SIGBUS). Waking is harmless if no one waits.
                    self.counters.faults_stale.inc();
                    if !in_thread {
                        let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), r.folio);
                    }
                    return Outcome::Done;
                }
            }
        }
    }

    /// A write fault on folio `idx` that the dirty limit refuses (the store
    /// refuses writes): the access gets SIGBUS (EFAULT in a system call)
    /// and nothing is lost — a clean folio is dropped (the store has its
    /// data) and poisoned for a moment, a missing one is poisoned. Returns
    /// false if the folio turned out dirty already (the write needs no new
    /// dirty memory: resolve it as usual).
    pub(crate) fn refuse_write(&self, r: &Arc<Area>, idx: usize) -> bool {
        let w = r.state(idx);
        loop {
            let s = folio::load(w);
            match s.kind() {
                Kind::Dirty => return false,
                Kind::Never | Kind::Evicted | Kind::Clean => {
                    let Some(old) = folio::try_claim(w, |t| t.kind() == s.kind()) else {
                        continue;
                    };
                    if old.kind() == Kind::Clean {
                        // CLEAN: write-protected, so no store landed in it.
                        self.zap(&[r.span(idx, 1)], "a clean folio refused a write", false);
                        self.counters.tlb_flush_batches.inc();
                        self.budget.uncharge(r.folio);
                    }
                    self.counters.writes_refused.inc();
                    self.counters.faults_failed.inc();
                    r.trace.record(idx, Path::Refused, old.kind(), Kind::Busy);
                    self.report_sigbus(
                        r,
                        idx,
                        format_args!(
                            "a write needs dirty memory beyond the dirty limit and the store refuses write-backs ({}); writes resume once it accepts them",
                            r.last_error_text().unwrap_or_else(|| "no error kept".into())
                        ),
                    );
                    self.poison(r, idx);
                    return true;
                }
                Kind::Busy => {
                    if self.mode == FaultMode::InThread || folio::add_waiter(w) {
                        self.counters.faults_deferred.inc();
                        return true;
                    }
                }
                Kind::Poisoned => {
                    self.counters.faults_stale.inc();
                    self.wake_resolved(r, idx, 1, false);
                    return true;
                }
            }
        }
    }

    /// First write to a claimed resident folio: unprotect it, mark it dirty.
    /// `fresh`: it was CLEAN (its dirty age starts now).
    fn make_dirty(&self, r: &Area, idx: usize, quiet: bool, fresh: bool) {
        // Unprotect without waking, publish DIRTY, then wake: when the
        // faulting thread's write lands, the folio is already DIRTY.
        // (In a huge run this splits the PMD: the run is base pages now.)
        r.clear_run_mapped(idx);
        let res = self
            .uffd_of(r, idx)
            .writeprotect(r.span(idx, 1), false, false);
        if let Err(e) = res {
            // Still protected: DIRTY is right either way (a DIRTY folio may
            // be protected: the next write faults and unprotects again).
            self.counters.kernel_call_errors.inc();
            if !quiet {
                log::error!(
                    "region {}: removing the write protection of folio {idx} failed: {e}; the write will fault again",
                    r.id
                );
            }
        }
        self.counters.wp_unprotects.inc();
        r.trace.record(idx, Path::WpDirty, Kind::Busy, Kind::Dirty);
        let tick = self.dirty_tick();
        let prev = folio::release(r.state(idx), |s| {
            let s = s.with_kind(Kind::Dirty);
            if fresh {
                s.with_seq(tick)
            } else {
                s
            }
        });
        self.wake_resolved(r, idx, 1, prev.has(folio::WAITER));
        self.maybe_kick_reclaimer();
    }

    /// After resolving a fault on folios `[idx, idx+n)`: in handler mode,
    /// wake the faulting thread and any waiters (`UFFDIO_WAKE`); in-thread,
    /// the faulting thread is running, so wake only waiters (`waiters`:
    /// some replaced state had WAITER).
    fn wake_resolved(&self, r: &Area, idx: usize, n: usize, waiters: bool) {
        match self.mode {
            FaultMode::InThread if !waiters => {}
            _ => self.wake_folios(r, idx, n),
        }
    }

    /// Fills claimed folio `idx` (previous state `old`), plus readahead.
    fn fill(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        idx: usize,
        old: State,
        write: bool,
        prefetch: bool,
    ) -> Outcome {
        let folio = r.folio;
        // Counted at its start, like `faults_missing`: the faulting thread
        // may read the counters as soon as the wake below lets it go.
        if self.lap(&mut ctx.mark, &self.phases.lookup) && !ctx.in_signal {
            self.phases.fills.inc();
        }
        let beyond_end =
            !r.is_anon() && r.store_offset(idx, old).is_some_and(|o| o >= r.store.len());
        if ctx.in_signal {
            // No reclaim here: the background reclaimer keeps room ahead of
            // the faults; when it is behind, a resolver thread reclaims.
            if beyond_end || !self.budget.try_charge(folio) {
                self.kick_reclaimer();
                return self.fill_undo(r, idx, old, &[], false, false);
            }
        } else if beyond_end || !self.reserve(folio) {
            self.counters.faults_failed.inc();
            if beyond_end {
                self.report_sigbus(
                    r,
                    idx,
                    format_args!(
                        "it is beyond the end of the store ({} bytes): was the file truncated under the mapping?",
                        r.store.len()
                    ),
                );
            } else {
                self.report_sigbus(
                    r,
                    idx,
                    format_args!(
                        "no memory could be freed within the budget ({} bytes) for {} s: every resident folio is pinned, busy or dirty with a store refusing writes",
                        self.budget.limit(),
                        crate::budget::DIRECT_RECLAIM_GIVE_UP.as_secs()
                    ),
                );
            }
            self.poison(r, idx);
            return Outcome::Done;
        }
        self.lap(&mut ctx.mark, &self.phases.reserve);
        // Readahead on read faults only: folios read ahead are installed
        // write-protected (CLEAN), so a writer streaming through them would
        // pay one write-protect fault and one unprotect flush per folio
        // (2,042 shootdowns for 2,048 folios written in order, test
        // tlb_dirty); without readahead each folio costs one missing fault
        // and no flush.
        let mut extras = std::mem::take(&mut ctx.extras);
        extras.clear();
        if !write {
            self.claim_readahead(r, idx, &mut extras);
        }
        // Async readahead: a window grown to its largest is a stream; the
        // prefetch thread reads the next window on another CPU while this
        // fault reads this one (and while the stream works on it), so the
        // stream's faults read every other window. (Asking for one window
        // ahead balances the two CPUs best: the stream's next fault comes
        // two windows on, and reads in parallel again.)
        let n = 1 + extras.len();
        if !prefetch && n > 1 && n >= self.window_max(r) && self.cfg.readahead_async {
            let next = idx + n;
            if next < r.nfolios() && r.store_offset(next, old).is_some_and(|o| o < r.store.len()) {
                let _ = self.ask_ahead(r.folio_addr(next));
            }
        }
        let out = self.fill_claimed(ctx, r, idx, old, &extras, write, prefetch);
        ctx.extras = extras;
        out
    }

    /// Claims all folios of the 2 MiB run from `start` (mixed folio
    /// sizes) if every one is non-resident and the budget has room without
    /// reclaim: the first one's old state is returned, the others' pushed
    /// to `out`. Nothing is claimed (or charged) otherwise.
    fn claim_run_ahead(&self, r: &Area, start: usize, out: &mut Vec<State>) -> Option<State> {
        let n = r.run_folios;
        let end_folio = r.store.len().saturating_sub(r.store_off).div_ceil(r.folio) as usize;
        let gone = |k: usize| matches!(folio::load(r.state(k)).kind(), Kind::Never | Kind::Evicted);
        if start + n > end_folio.min(r.nfolios())
            || r.shard_end(start) < start + n
            || !(start..start + n).all(gone)
            || !self.budget.try_charge(r.folio * n as u64)
        {
            return None;
        }
        let pred = |s: State| matches!(s.kind(), Kind::Never | Kind::Evicted);
        let mut first = None;
        for k in start..start + n {
            match folio::try_claim(r.state(k), pred) {
                Some(o) if k == start => first = Some(o),
                Some(o) => out.push(o),
                None => {
                    // Someone else got there: give back what was claimed.
                    for (j, o) in first.iter().chain(out.iter()).enumerate() {
                        let prev = folio::release(r.state(start + j), |_| *o);
                        self.wake_if_waiter(r, start + j, prev);
                    }
                    out.clear();
                    self.budget.uncharge(r.folio * n as u64);
                    return None;
                }
            }
        }
        first
    }

    /// [`fill`](Self::fill) once the budget is reserved and the readahead
    /// folios `extras` are claimed: read, install, publish.
    #[allow(clippy::too_many_arguments)]
    fn fill_claimed(
        &self,
        ctx: &mut Ctx,
        r: &Arc<Area>,
        idx: usize,
        old: State,
        extras: &[State],
        write: bool,
        prefetch: bool,
    ) -> Outcome {
        let folio = r.folio;
        let n = 1 + extras.len();
        let started = std::time::Instant::now();
        // Before anything can see these folios resident (whole-region walks
        // visit touched chunks only).
        for k in 0..n {
            r.mark_touched(idx + k);
            let o = if k == 0 { old } else { extras[k - 1] };
            r.trace
                .record(idx + k, Path::FillClaim, o.kind(), Kind::Busy);
        }
        let total = n * folio as usize;
        let quiet = ctx.in_signal;
        // A 2 MiB folio is read into a staged huge page and moved in whole
        // (thp.rs); without one it is copied as base pages. Read-only
        // regions copy: UFFDIO_MOVE moves only between writable mappings
        // (EINVAL otherwise).
        // A region of smaller folios fills a whole 2 MiB-aligned run the
        // same way (mixed folio sizes: claim_readahead ends a sequential
        // window at its run's end, so a stream's next fault starts a run).
        let run = r.run_folios > 0 && n == r.run_folios && idx.is_multiple_of(n);
        let huge = (folio == crate::thp::HUGE && n == 1 || run) && self.thp.usable();
        // (A huge run of a read-only region is moved in through a moment of
        // write access: install_huge.)
        if huge && !r.writable && !run {
            self.counters.thp_fill_fallback.inc();
        }
        let mut staged = if huge && (r.writable || run) {
            let s = self.thp.take(&self.budget);
            if s.is_none() {
                self.counters.thp_fill_fallback.inc();
            }
            s
        } else {
            None
        };
        // A folio its prefetch batch read already is copied into the view
        // straight from that batch's buffer, at this offset.
        let mut prefetched = None;
        let read = match staged.as_mut() {
            // Never-written anonymous memory is zeros: a fresh staged page
            // is zeros already.
            Some(st) if st.fresh && r.store_offset(idx, old).is_none() => Ok(()),
            Some(st) => {
                st.fresh = false;
                self.read_folios(r, idx, old, &mut st.buf[..])
            }
            None => match (ctx.pre.take(), ctx.pre_buf.is_some()) {
                // Read already, with the rest of its prefetch batch.
                (Some((at, off)), true) if at == idx && n == 1 => {
                    prefetched = Some(off);
                    Ok(())
                }
                _ => {
                    self.note_buf_use(ctx, total);
                    self.read_folios(r, idx, old, &mut ctx.buf[..total])
                }
            },
        };
        if read.is_err() {
            drop(staged);
            if ctx.in_signal {
                return self.fill_undo(r, idx, old, extras, true, false);
            }
            self.counters.read_errors.inc();
            if let Err(e) = &read {
                self.report_sigbus(
                    r,
                    idx,
                    format_args!("reading it from the store failed: {e}"),
                );
            }
            self.fill_failed(r, idx, extras);
            return Outcome::Done;
        }
        self.lap(&mut ctx.mark, &self.phases.read);
        let now = self.evict_seq.load(Ordering::Relaxed);
        let addr = r.folio_addr(idx);
        // The LRU entries: (folio, active) for each folio without one. In a
        // SIGBUS handler they are queued BEFORE anything is installed (the
        // folios are BUSY: reclaim passes over them), with a lock that is
        // only tried and lists that must have room; when that fails the
        // fill is undone and handed off with nothing installed. (Queueing
        // after the install and undoing it on failure lost writes: a write
        // fill is installed writable, and a store another thread made to
        // the page before the undo's MADV_DONTNEED was thrown away —
        // issue 20; test
        // `concurrent_stores_to_fresh_folios_survive_a_failed_lru_try`.)
        ctx.queue.clear();
        for k in 0..n {
            let o = if k == 0 { old } else { extras[k - 1] };
            let hot = o.kind() == Kind::Evicted && self.refault_is_hot(now, o);
            if !folio::load(r.state(idx + k)).has(QUEUED) {
                ctx.queue.push((idx + k, hot));
            }
        }
        let queued_early = ctx.in_signal;
        if ctx.in_signal && !self.lru.try_add(r, &ctx.queue) {
            drop(staged);
            return self.fill_undo(r, idx, old, extras, true, false);
        }
        // A huge read fill that a write raced (see install_huge) is DIRTY.
        let mut raced = false;
        let ok = if let Some(st) = staged.as_mut() {
            match self.install_huge(r, idx, n, st, write, quiet) {
                Some(written) => {
                    raced = written;
                    true
                }
                None => false,
            }
        } else {
            let src: &[u8] = match (prefetched, ctx.pre_buf.as_deref()) {
                (Some(off), Some(pre)) => &pre[off..off + total],
                _ => &ctx.buf[..total],
            };
            if write {
                // Installed writable: from the first page copied on, other
                // threads may store into it without a fault. It is never
                // dropped once part of it is in (see settle_writable).
                debug_assert!(extras.is_empty(), "write fills read no ahead");
                match self.copy_all(r, r.span(idx, 1), &src[..folio as usize], false, quiet) {
                    Ok(()) => true,
                    Err(0) => false,
                    Err(done) => self.settle_writable(r, r.span(idx, 1), done, src, quiet),
                }
            } else {
                // Installed write-protected (or into a read-only region): no
                // store can land before the folio is published, so a
                // failure may drop what was installed.
                self.copy_all(r, r.span(idx, n), src, r.writable, quiet)
                    .is_ok()
            }
        };
        drop(staged);
        if !ok {
            // Drop whatever part of the run was installed before giving up
            // (nothing of it was writable: see above and install_huge).
            self.zap(&[r.span(idx, n)], "a failed fill", ctx.in_signal);
            if ctx.in_signal {
                return self.fill_undo(r, idx, old, extras, true, queued_early);
            }
            self.report_sigbus(
                r,
                idx,
                format_args!("the kernel refused to install it (UFFDIO_COPY/MOVE; logged above)"),
            );
            self.fill_failed(r, idx, extras);
            return Outcome::Done;
        }
        self.lap(&mut ctx.mark, &self.phases.copy);
        // Counted before the faulting thread is woken (it may read the
        // counters next).
        let took = started.elapsed();
        if took > crate::shared::SLOW_FAULT {
            self.note_slow_fault(r, idx, took, ctx.in_signal);
        }
        // Publish: counters and state words (Release), then wake the
        // faulting thread and any waiters (the COPY did not: whoever runs
        // next sees the folios resident and counted), then the LRU (one
        // lock) unless queued above.
        // A store that raced the protection of a huge run landed in one of
        // its folios, which one is not known: all of them are DIRTY.
        let all_dirty = raced && n > 1;
        let write = write || raced;
        if all_dirty {
            self.dirty_add(r, n as u64);
        } else if write {
            self.dirty_add(r, 1);
        }
        if ctx.in_signal && !prefetch {
            self.counters.faults_missing.inc();
            if ctx.mark.is_some() {
                self.phases.fills.inc();
            }
        }
        self.counters.fills.add(n as u64);
        self.counters
            .fills_readahead
            .add(extras.len() as u64 + u64::from(prefetch));
        let mut waiters = false;
        let tick = self.dirty_tick();
        for k in 0..n {
            let o = if k == 0 { old } else { extras[k - 1] };
            let hot = o.kind() == Kind::Evicted && self.refault_is_hot(now, o);
            if o.kind() == Kind::Evicted {
                self.counters.refaults.inc();
                self.counters.refaults_activated.add(u64::from(hot));
            }
            let kind = if (k == 0 && write) || all_dirty {
                Kind::Dirty
            } else {
                Kind::Clean
            };
            r.trace.record(idx + k, Path::FillPublish, Kind::Busy, kind);
            // A DIRTY folio's sequence field holds when it became dirty
            // (the age the background writer goes by); a CLEAN one keeps
            // its eviction sequence (unused while resident).
            let prev = folio::release(r.state(idx + k), |s| {
                let s = s.with_kind(kind).set(ACTIVE, hot).set(QUEUED, true);
                if kind == Kind::Dirty {
                    s.with_seq(tick)
                } else {
                    s
                }
            });
            waiters |= prev.has(folio::WAITER);
        }
        match self.mode {
            FaultMode::InThread => {
                if waiters {
                    self.wake_folios(r, idx, n);
                }
            }
            _ => {
                if !prefetch || waiters {
                    let _ = self.uffd_of(r, idx).wake(addr, total as u64);
                }
            }
        }
        self.lap(&mut ctx.mark, &self.phases.wake);
        if !ctx.in_signal {
            self.lru.add(r, &ctx.queue);
        }
        self.maybe_kick_reclaimer();
        self.lap(&mut ctx.mark, &self.phases.lru);
        ctx.mark = None;
        Outcome::Done
    }

    /// Undoes a fill started in a SIGBUS handler, so that a resolver thread
    /// can do it again from the start: the readahead folios and the
    /// faulting one go back to their old states (waking waiters) and the
    /// budget is returned (`charged`: also the faulting folio's).
    fn fill_undo(
        &self,
        r: &Arc<Area>,
        idx: usize,
        old: State,
        extras: &[State],
        charged: bool,
        queued: bool,
    ) -> Outcome {
        // `queued`: LRU entries were pushed for them (QUEUED is kept so the
        // entry is not doubled by a later fill; reclaim drops it as stale).
        let back = |o: State| o.set(QUEUED, o.has(QUEUED) || queued);
        for (k, o) in extras.iter().enumerate() {
            r.trace
                .record(idx + 1 + k, Path::FillUndo, Kind::Busy, o.kind());
            let prev = folio::release(r.state(idx + 1 + k), |_| back(*o));
            self.wake_if_waiter(r, idx + 1 + k, prev);
        }
        let n = extras.len() as u64 + u64::from(charged);
        self.budget.uncharge(r.folio * n);
        r.trace.record(idx, Path::FillUndo, Kind::Busy, old.kind());
        let prev = folio::release(r.state(idx), |_| back(old));
        self.wake_if_waiter(r, idx, prev);
        Outcome::HandOff
    }

    /// Adds the time since the last mark to `phase` and marks now, when a
    /// fault is being timed (`fault_timing`; prefetch fills are not).
    /// Returns whether it timed.
    fn lap(&self, mark: &mut Option<std::time::Instant>, phase: &crate::stats::Padded) -> bool {
        let Some(then) = *mark else {
            return false;
        };
        let now = std::time::Instant::now();
        phase.add(now.duration_since(then).as_nanos() as u64);
        *mark = Some(now);
        true
    }

    /// A claimed fill could not complete: readahead folios go back to their
    /// old state, the faulting folio is poisoned, the budget is returned.
    fn fill_failed(&self, r: &Arc<Area>, idx: usize, extras: &[State]) {
        self.counters.faults_failed.inc();
        for (k, o) in extras.iter().enumerate() {
            r.trace
                .record(idx + 1 + k, Path::FillUndo, Kind::Busy, o.kind());
            let prev = folio::release(r.state(idx + 1 + k), |_| *o);
            self.wake_if_waiter(r, idx + 1 + k, prev);
        }
        self.budget.uncharge(r.folio * (1 + extras.len() as u64));
        self.poison(r, idx);
    }

    /// A refault within half the budget (in pages) of its eviction.
    fn refault_is_hot(&self, now: u64, old: State) -> bool {
        let distance = (now.wrapping_sub(old.seq())) & SEQ_MASK;
        distance <= (self.budget.limit() / 4096 / 2).min(SEQ_MASK)
    }

    /// Claims up to the readahead window of non-resident folios after `idx`
    /// (file regions only), each with budget reserved without reclaiming.
    /// Pushes their old states to `out` (whose capacity the window never
    /// exceeds: no allocation).
    fn claim_readahead(&self, r: &Area, idx: usize, out: &mut Vec<State>) {
        let max = self.window_max(r);
        if r.is_anon() || self.cfg.readahead < r.folio || idx == 0 {
            return;
        }
        let mut run = 0;
        // BUSY counts: the COPY of the previous run wakes the faulting thread
        // before its filler publishes CLEAN.
        while run < max
            && run < idx
            && matches!(
                folio::load(r.state(idx - 1 - run)).kind(),
                Kind::Clean | Kind::Dirty | Kind::Busy
            )
        {
            run += 1;
        }
        // One resident predecessor is weak evidence: with 1/8 of a file
        // resident, random faults see one 1/8 of the time (15-17% of fills
        // were readahead in the random-read benchmark). Two in a row is a
        // stream (1/64 by chance).
        if run < 2 {
            return;
        }
        let mut end = self.window_end(r, idx, idx + 1 + (2 * run).min(max - 1));
        // Mixed folio sizes: once the window has grown to 2 MiB, it ends
        // at the end of the faulting folio's 2 MiB run, so the stream's
        // next fault starts a run, which fill_claimed fills as one huge
        // page (a whole run claimed from its first folio). A run cut by
        // the end of the file or a resident folio stays base folios.
        if r.run_folios > 0 && 2 * run >= r.run_folios {
            end = end.min(r.run_start(idx) + r.run_folios);
        }
        self.claim_free(r, idx + 1..end, out);
    }

    /// Folios in a full readahead window of `r` (the faulting one
    /// included): the configured readahead, bounded by the fill buffer;
    /// at least 1.
    fn window_max(&self, r: &Area) -> usize {
        ((self.cfg.readahead / r.folio) as usize)
            .min(self.fill_buf_bytes() / r.folio as usize)
            .max(1)
    }

    /// `end` of a window from `idx`, cut at the end of the store and of
    /// `idx`'s shard (a window is filled by one UFFDIO_COPY, which must
    /// stay inside one registration).
    fn window_end(&self, r: &Area, idx: usize, end: usize) -> usize {
        let end_folio = r.store.len().saturating_sub(r.store_off).div_ceil(r.folio) as usize;
        end.min(r.shard_end(idx)).min(end_folio)
    }

    /// Claims the non-resident folios of `span` in order, each with budget
    /// reserved without reclaiming, up to the first that is resident or
    /// busy or does not fit; pushes their old states to `out`.
    fn claim_free(&self, r: &Area, span: std::ops::Range<usize>, out: &mut Vec<State>) {
        for j in span {
            if !self.budget.try_charge(r.folio) {
                break;
            }
            match folio::try_claim(r.state(j), |s| {
                matches!(s.kind(), Kind::Never | Kind::Evicted)
            }) {
                Some(o) => out.push(o),
                None => {
                    self.budget.uncharge(r.folio);
                    break;
                }
            }
        }
    }

    /// Reads folios `[idx, idx + buf.len()/folio)` into `buf`.
    fn read_folios(&self, r: &Area, idx: usize, old: State, buf: &mut [u8]) -> io::Result<()> {
        let Some(off) = r.store_offset(idx, old) else {
            buf.fill(0); // anonymous, never written: zero
            return Ok(());
        };
        // Read what the store has for this range; a store may return short
        // reads, so keep reading, and fail (SIGBUS) if it stops early.
        let want = (buf.len() as u64).min(r.store.len().saturating_sub(off)) as usize;
        let mut got = 0;
        while got < want {
            match r.store.read_at(&mut buf[got..], off + got as u64)? {
                // The store returned fewer bytes than its length promises
                // (no message: this may run in a signal handler).
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => got += n,
            }
        }
        buf[got..].fill(0);
        self.counters.bytes_read.add(got as u64);
        Ok(())
    }

    /// Installs claimed 2 MiB folio `idx` (or the `n` folios of a 2 MiB run
    /// from `idx`, mixed folio sizes) from staged huge page `st`
    /// (holding its data): one `UFFDIO_MOVE` of the whole PMD, then, for a
    /// read fill of a writable region, write-protect it (CLEAN) before
    /// anyone is woken. A move the kernel refuses (or makes partly) is
    /// finished by copying the rest from the staged page. `None` if the
    /// folio could not be installed; else whether a write landed in it
    /// before the protection (the caller publishes it DIRTY).
    ///
    /// That window is real: the kernel installs a moved PMD writable
    /// whatever the source was (`move_pages_huge_pmd`), and write-protects
    /// only in the next call, so a thread touching the folio for the first
    /// time in between writes without a fault. A read fill therefore takes
    /// a digest of the staged page before the move and of the protected
    /// view after it: a write in the window changed the data, and the
    /// folio is DIRTY, not CLEAN (a write that left the data as it was
    /// loses nothing). After the protection every write faults and waits
    /// for this fill to publish.
    fn install_huge(
        &self,
        r: &Area,
        idx: usize,
        n: usize,
        st: &mut crate::thp::Staged,
        write: bool,
        quiet: bool,
    ) -> Option<bool> {
        let uffd = self.uffd_of(r, idx);
        let span = r.span(idx, n);
        let wp = !write && r.writable;
        let len = span.len() as usize;
        let before = wp.then(|| crate::thp::digest_bytes(&st.buf[..len]));
        // A page table under the folio must go first, or the move splits
        // the huge page into base pages: drop it (CONFIG_PT_RECLAIM frees
        // empty page tables on MADV_DONTNEED; a TLB flush). A missing fault
        // leaves one in a view that may not hold huge pages (the kernel
        // allocates it before it raises the fault); in a `huge_view` read
        // faults come at PMD level and leave none, so only folios that had
        // base pages installed (copy, poison) have one.
        if r.take_table(idx) {
            self.zap(&[span], "a page table before a huge fill", quiet);
        }
        // A read-only region (a huge run, mixed folio sizes): the kernel
        // moves pages only into writable mappings (validate_move_areas), so
        // the run is writable from just before the move until just after
        // it (two mprotect calls; the second flushes the run's TLB entry).
        // Its folios are BUSY meanwhile: a thread touching the run waits on
        // the fault, except one that touches it in that window for the
        // first time, whose store lands instead of raising SIGSEGV; a
        // read-only region is never written back, so the store reaches no
        // file, and it is gone at the next eviction (docs/benchmarks.md,
        // issue 23).
        let opened = !r.writable && span.protect(upager_sys::mem::Access::ReadWrite).is_ok();
        let moved = if !r.writable && !opened {
            None
        } else {
            Some(uffd.move_in(span, &mut st.buf, 0))
        };
        // Moved whole as one PMD (not split into base pages on the way).
        let whole = matches!(moved, Some(Ok(Fill::Done)));
        let mut done = match moved {
            None => 0,
            Some(Ok(Fill::Done)) => len,
            Some(other) => {
                let reported = match other {
                    Ok(Fill::Retry { done } | Fill::Exists { done }) => done as usize,
                    _ => 0,
                };
                match self.moved_from(st, len) {
                    Left::Prefix(d) => d,
                    Left::Unknown => reported,
                    Left::Scattered => {
                        // Never seen: the run cannot be completed from the
                        // staged page. Dropped by the caller (nothing of it
                        // was published; its data is in the store).
                        self.counters.kernel_call_errors.inc();
                        if opened {
                            self.close_read_only(r, span, idx, quiet);
                        }
                        st.ready = false;
                        st.buf.release_from(0);
                        self.budget.uncharge(crate::thp::HUGE);
                        return None;
                    }
                }
            }
        };
        if opened {
            self.close_read_only(r, span, idx, quiet);
        }
        if done > 0 {
            // The staged page left (all or part of it): its charge goes
            // back, the fill's own charge covers the folio.
            st.ready = false;
            self.budget.uncharge(crate::thp::HUGE);
            self.kick_reclaimer();
        }
        // A read fill of a writable region is CLEAN: write-protected before
        // any faulting thread is woken (the move woke no one); a thread that
        // touched the folio in between is caught by the digest below. If
        // the protect fails the folio is published DIRTY (a DIRTY folio may
        // be writable; a CLEAN one may not): never dropped, since the moved
        // PMD is writable and a store may have landed in it.
        let mut protect_failed = false;
        if done > 0 && wp {
            if let Err(e) = uffd.writeprotect(span.sub(0, done), true, false) {
                protect_failed = true;
                self.counters.kernel_call_errors.inc();
                if !quiet {
                    log::error!(
                        "region {}: write-protecting huge folio {idx} after its move failed: {e}; kept dirty",
                        r.id
                    );
                }
            }
        }
        if done == len && whole {
            self.counters.thp_fills.inc();
            r.set_run_mapped(idx);
        } else if done == len {
            // Moved as base pages (a fault put a page table under the run
            // while it was being filled): whole, but not one PMD.
            self.counters.thp_fill_fallback.inc();
        } else {
            self.counters.thp_fill_fallback.inc();
            // What did not move is still in the staged buffer (what moved
            // reads as zeros there now): copy the rest, write-protected if
            // need be. What moved is writable: if the copy fails it must
            // not be dropped (settle_writable retries, then saves it).
            match self.copy_all(r, span.sub(done, len - done), &st.buf[done..], wp, quiet) {
                Ok(()) => done = len,
                Err(d) if done == 0 && d == 0 => return None,
                // Nothing moved, and what was copied is protected.
                Err(_) if done == 0 && wp => return None,
                Err(d) => {
                    // `st.buf` holds zeros where the moved part was: give
                    // settle_writable the data it must compare with only
                    // for the copied rest; the moved part counts as written.
                    let installed = done + d;
                    if self.settle_writable(r, span, installed, &st.buf[..], quiet) {
                        return Some(true);
                    }
                    return None;
                }
            }
        }
        if done < len {
            return None;
        }
        if protect_failed {
            return Some(true);
        }
        let first = (idx << r.shift) / 8;
        let view = &r.map.atomic_words()[first..first + len / 8];
        let raced = before.is_some_and(|b| b != crate::thp::digest_words(view));
        if raced {
            self.counters.thp_fill_raced.inc();
        }
        Some(raced)
    }

    /// After a `UFFDIO_MOVE` out of staged page `st` (its first `len`
    /// bytes) that did not report success: what left it, for the view —
    /// what is still present in the staged page did not move. The kernel's
    /// own count is not trusted: on Linux 6.18 a move whose destination got
    /// a page table while the run was being filled (a thread touching the
    /// run waits on it as BUSY, and its fault allocates one) split the huge
    /// page, moved every base page, and reported EEXIST with nothing moved;
    /// copying "the rest" from the emptied staged page then put zeros in
    /// the view, and a digest that saw them took them for a racing store
    /// and wrote them back (issue 23, `tests/mixed.rs`).
    fn moved_from(&self, st: &crate::thp::Staged, len: usize) -> Left {
        use upager_sys::pagemap::{present_runs, PRESENT_RUNS};
        let Some(pagemap) = self.thp.pagemap() else {
            return Left::Unknown;
        };
        let base = st.buf.addr();
        let mut runs = [(0, 0); PRESENT_RUNS];
        match present_runs(pagemap, base, len as u64, &mut runs) {
            Ok(Some(0)) => Left::Prefix(len),
            Ok(Some(1)) if runs[0].1 == base + len as u64 => {
                Left::Prefix((runs[0].0 - base) as usize)
            }
            Ok(_) => Left::Scattered,
            Err(_) => Left::Unknown,
        }
    }

    /// Makes `span` of read-only region `r` read-only again after a huge
    /// page moved through it (see install_huge, gather.rs); a refusal is
    /// logged (unless `quiet`) and counted: stores there would land
    /// without SIGSEGV (never written back: nothing is lost).
    pub(crate) fn close_read_only(&self, r: &Area, span: MapRange<'_>, idx: usize, quiet: bool) {
        if let Err(e) = span.protect(upager_sys::mem::Access::Read) {
            self.counters.kernel_call_errors.inc();
            if !quiet {
                log::error!(
                    "region {}: making folios {idx}.. of the read-only region read-only again failed: {e}; stores there land without SIGSEGV",
                    r.id
                );
            }
        }
    }

    /// UFFDIO_COPY of `src` to `dst`, retrying partial copies. `Err(done)`
    /// if the range could not be filled, with the bytes at its start that
    /// were (logged unless `quiet`: in a signal handler, the resolver thread
    /// that redoes the fill logs it).
    fn copy_all(
        &self,
        r: &Area,
        dst: MapRange<'_>,
        src: &[u8],
        wp: bool,
        quiet: bool,
    ) -> Result<(), usize> {
        let mut done = 0usize;
        let len = src.len();
        // Base pages (and their page table) under these folios from now on.
        let first = ((dst.addr() - r.base()) >> r.shift) as usize;
        r.note_table(first, (len as u64).div_ceil(r.folio) as usize);
        // Any userfaultfd of the pager may fill a registered range (the run
        // stays inside one shard's registration); the wake comes later.
        let uffd = self.uffd_of(r, ((dst.addr() - r.base()) >> r.shift) as usize);
        for _attempt in 0..16 {
            if done >= len {
                return Ok(());
            }
            match uffd.copy(dst.sub(done, len - done), &src[done..], wp, false) {
                Ok(Fill::Done) => return Ok(()),
                Ok(Fill::Retry { done: d }) => done += d as usize,
                Ok(Fill::Exists { done: d }) => {
                    // A page we own (BUSY) is mapped: a leftover (e.g. an
                    // earlier fill interrupted part-way). Drop the rest of
                    // the range we own and copy again. (Never a page this
                    // fill installed: those are before `done`.)
                    done += d as usize;
                    if done < len {
                        self.zap(&[dst.sub(done, len - done)], "a leftover page", quiet);
                    }
                }
                Err(_) if quiet => return Err(done),
                Err(e) => {
                    log::error!(
                        "UFFDIO_COPY at {:#x} (region {}) failed: {e}",
                        dst.addr() + done as u64,
                        r.id
                    );
                    return Err(done);
                }
            }
        }
        if done >= len {
            Ok(())
        } else {
            Err(done)
        }
    }

    /// A writable install of `dst` (one folio, from `src`) stopped after
    /// `done` bytes. Those bytes are mapped writable: another thread may
    /// have stored into them already, so they must not be dropped. Retries
    /// the rest for up to [`SETTLE_FOR`]; true once the folio is whole (the
    /// caller publishes it DIRTY). If the kernel keeps refusing, the
    /// installed part is write-protected and compared with `src`: unchanged
    /// (no store landed), it may be dropped (false); changed, it is written
    /// to the store first (file regions), and only a store that refuses that
    /// loses the store — logged, and counted in `writes_lost`.
    fn settle_writable(
        &self,
        r: &Area,
        dst: MapRange<'_>,
        mut done: usize,
        src: &[u8],
        quiet: bool,
    ) -> bool {
        let len = dst.len() as usize;
        let deadline = std::time::Instant::now() + SETTLE_FOR;
        while std::time::Instant::now() < deadline {
            match self.copy_all(r, dst.sub(done, len - done), &src[done..len], false, true) {
                Ok(()) => return true,
                Err(d) => done += d,
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let idx = ((dst.addr() - r.base()) >> r.shift) as usize;
        let installed = dst.sub(0, done);
        if self
            .uffd_of(r, idx)
            .writeprotect(installed, true, false)
            .is_err()
        {
            // Stores to it cannot be stopped, so its contents cannot be
            // known: report.
            self.counters.writes_lost.inc();
            if !quiet {
                log::error!(
                    "region {}: folio {idx} could neither be installed whole nor protected; stores to its first {done} bytes may be lost",
                    r.id
                );
            }
            return false;
        }
        // Compare in place (no allocation: this may run in a SIGBUS
        // handler). `done` is a multiple of the page size.
        let first = (idx << r.shift) / 8;
        let view = &r.map.atomic_words()[first..first + done / 8];
        let changed = view
            .iter()
            .zip(src[..done].chunks_exact(8))
            .any(|(w, b)| w.load(Ordering::Relaxed).to_ne_bytes() != b);
        if !changed {
            return false; // nothing landed: dropping loses nothing
        }
        // Anonymous regions have no slot for a folio being filled: nowhere
        // to save it.
        let saved = !r.is_anon()
            && r.store_offset(idx, folio::load(r.state(idx)))
                .is_some_and(|o| r.store.write_from(r.src(idx, done as u64), o).is_ok());
        if !saved {
            self.counters.writes_lost.inc();
            log::error!(
                "region {}: folio {idx} could not be installed whole and the stores that landed in its first {done} bytes could not be saved to the store",
                r.id
            );
        }
        false
    }

    /// Logs (at most once a second per region) why an access to folio `idx`
    /// of `r` is about to get SIGBUS (EFAULT in a system call): the store,
    /// the offset, the reason — before the access is answered, so a program
    /// killed by the signal leaves a reason behind. Never in a signal
    /// handler (those hand the fault to a resolver thread, which logs).
    fn report_sigbus(&self, r: &Area, idx: usize, why: std::fmt::Arguments<'_>) {
        let Some(held) = r.trace.may_report() else {
            return;
        };
        let more = if held > 0 {
            format!(" ({held} more such errors in this region since the last message)")
        } else {
            String::new()
        };
        log::error!(
            "region {} ({}): the access at region offset {} gets SIGBUS (EFAULT in a system call): {why}{more}",
            r.id,
            r.store.describe(),
            (idx as u64) << r.shift,
        );
    }

    /// Where the kernel has no `UFFDIO_POISON`, handler mode: folio `idx`
    /// of `r` becomes inaccessible (an access gets SIGSEGV, a system call
    /// EFAULT; never a fault that would come back here for ever). The
    /// reclaimer restores its access when it clears the poison.
    pub(crate) fn protect_poisoned(&self, r: &Area, idx: usize) {
        if self.mode == FaultMode::InThread {
            return;
        }
        if let Err(e) = r.span(idx, 1).protect(upager_sys::mem::Access::None) {
            log::error!("protecting a poisoned folio failed: {e}; the access will fault again");
        }
    }

    /// Makes an access to claimed folio `idx` raise SIGBUS (EFAULT in a
    /// system call) until the reclaimer clears it (without UFFDIO_POISON,
    /// in handler mode: SIGSEGV, see [`Shared::protect_poisoned`]). Holds
    /// no budget.
    fn poison(&self, r: &Arc<Area>, idx: usize) {
        r.note_table(idx, 1);
        // Without UFFDIO_POISON (before 6.6): in-thread, the woken access
        // faults again and finds the folio POISONED (SIGBUS then: resolve);
        // handler threads make the folio PROT_NONE instead (SIGSEGV for an
        // access, EFAULT for a system call) until the reclaimer clears it.
        if !self.info.uffd_poison {
            self.protect_poisoned(r, idx);
        }
        let poisoned = self.info.uffd_poison && {
            let res = self.uffd_of(r, idx).poison(r.span(idx, 1));
            if !matches!(res, Ok(Fill::Done)) {
                log::error!("UFFDIO_POISON failed ({res:?}); the access will fault again");
            }
            matches!(res, Ok(Fill::Done))
        };
        r.trace
            .record(idx, Path::FillFailed, Kind::Busy, Kind::Poisoned);
        let prev = folio::release(r.state(idx), |s| s.with_kind(Kind::Poisoned));
        if poisoned {
            self.wake_if_waiter(r, idx, prev);
        } else {
            // The POISON did not wake the faulting thread: wake it (and any
            // waiter) so it retries rather than sleeping for ever.
            let _ = self.uffd_of(r, idx).wake(r.folio_addr(idx), r.folio);
        }
        self.lru.add_poisoned(r, idx);
    }
}

/// Several writers of one file (twins.rs): the twin of a folio at its
/// first write.
impl Shared {
    /// Before a write-protect fault claims folio `idx` (state `s`) of `r`:
    /// if it is CLEAN and its file keeps twins, charge the twin's memory.
    /// `Ok(true)`: charged (hand it to [`Shared::twin_claimed`]). `Err`:
    /// the fault ends here (handed off from a signal handler, which may not
    /// allocate; or refused because the budget has no room).
    pub(crate) fn twin_charge(
        &self,
        in_signal: bool,
        r: &Arc<Area>,
        idx: usize,
        s: State,
    ) -> Result<bool, Outcome> {
        if s.kind() != Kind::Clean || !r.twinning() {
            return Ok(false);
        }
        if in_signal {
            return Err(Outcome::HandOff);
        }
        if self.reserve(r.folio) {
            return Ok(true);
        }
        log::error!(
            "region {}: no room in the budget for the twin of folio {idx} (its file has several writers): the write is refused",
            r.id
        );
        if self.refuse_write(r, idx) {
            return Err(Outcome::Done);
        }
        Ok(false)
    }

    /// After the claim of folio `idx` (previous state `old`) by a
    /// write-protect fault that charged a twin (`charged`): keep the copy
    /// if the folio was CLEAN, else give the charge back.
    pub(crate) fn twin_claimed(&self, r: &Area, idx: usize, old: Option<State>, charged: bool) {
        if !charged {
            return;
        }
        if old.is_some_and(|o| o.kind() == Kind::Clean) {
            let mut t = vec![0u8; r.folio as usize].into_boxed_slice();
            r.map.read_at(idx << r.shift, &mut t);
            r.twins.insert(idx, t);
            self.counters.twins_made.inc();
        } else {
            self.budget.uncharge(r.folio);
        }
    }
}
