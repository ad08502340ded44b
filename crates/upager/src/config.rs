//! Pager and region options, and size parsing ("512M", "64KiB").

use std::path::PathBuf;

/// Smallest folio: one base page.
pub const MIN_FOLIO: u64 = 4096;
/// Largest folio: one PMD.
pub const MAX_FOLIO: u64 = 2 << 20;
/// Largest readahead a pager accepts (each handler thread keeps a fill
/// buffer this large).
pub const MAX_READAHEAD: u64 = 64 << 20;
/// Default folio of a file or store region: one base page. A random fault
/// fills 4 KiB; a sequential stream fills its readahead window (up to 2 MiB)
/// as one read and one copy, so streams keep large I/O without large folios
/// (the kernel's split, page_cache_ra_order: large folios for readahead,
/// order-0 for random faults). A folio set with
/// [`MapOptions::folio`] overrides it.
pub const DEFAULT_FOLIO: u64 = 4 << 10;
/// Default folio of an anonymous region: the unit swapped out and in.
/// Anonymous memory has no readahead to batch its swap-ins, and measured on
/// the swap benchmark, 64 KiB folios spend 0.26-0.40x the kernel's system
/// time where 4 KiB ones spend 1.6-2.8x.
pub const DEFAULT_ANON_FOLIO: u64 = 64 << 10;
/// Bytes an eviction batch covers by default: 4 MiB = 1024 base pages, so a
/// batch of clean folios costs one TLB shootdown per 1024 pages (the unmap),
/// plus one per span of dirty folios (the write-protect before write-back:
/// one for clustered dirty data, more when it is scattered; see `gather`).
/// 1024 is also the most ranges one process_madvise call takes.
pub const DEFAULT_BATCH_BYTES: u64 = 4 << 20;

/// How fault handlers find the region of a faulting address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Lookup {
    /// Lock-free snapshot of the region table (seed 001's design). Default.
    #[default]
    LockFree,
    /// A reader-writer lock around the table, taken on every fault (the
    /// `mmap_sem` design the seed removed; kept for the ablation benchmark).
    Locked,
}

/// How a pager resolves faults: one name on every face (Rust, C, the UMap
/// drop-in, Python, the CLI and the `UPAGER_FAULT_MODE` environment
/// variable): `handlers` or `in-thread`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FaultMode {
    /// Handler threads read fault messages from the userfaultfd and resolve
    /// them; the faulting thread sleeps in the kernel meanwhile. System calls
    /// on region memory (`write(fd, region, n)`) fault pages in like any
    /// access (with a userfaultfd that serves them: see [`Userfaultfd`]).
    /// Default where such a userfaultfd could be opened.
    #[default]
    Handlers,
    /// The faulting thread resolves its own fault: regions are registered on
    /// a userfaultfd opened with `UFFD_FEATURE_SIGBUS`, and a SIGBUS handler
    /// installed by upager fills the folio (or waits for it) and returns, so
    /// the access retries. Saves the cross-CPU wakeup of a handler thread
    /// (the largest cost of a fault on a VM). A system call that reads or
    /// writes a non-resident page of a region fails with EFAULT instead of
    /// faulting it in: make the range resident first
    /// ([`Region::fault_in`](crate::Region::fault_in)) or use
    /// [`Region::read_at`](crate::Region::read_at) /
    /// [`Region::write_at`](crate::Region::write_at). Default where only a
    /// user-mode-only userfaultfd could be opened (an ordinary user's
    /// process, [`Userfaultfd`]): system calls fail with EFAULT there in
    /// either mode, and this one resolves faults faster.
    InThread,
}

impl FaultMode {
    /// The environment variable that chooses the mode where no code does.
    pub const ENV: &'static str = "UPAGER_FAULT_MODE";

    /// The mode's name: `handlers` or `in-thread`.
    pub fn name(self) -> &'static str {
        match self {
            FaultMode::Handlers => "handlers",
            FaultMode::InThread => "in-thread",
        }
    }

    /// The mode named by `UPAGER_FAULT_MODE`: None when unset or empty, an
    /// error naming the variable when it names no mode.
    pub fn from_env() -> Result<Option<FaultMode>, String> {
        env_choice(Self::ENV)
    }
}

impl std::str::FromStr for FaultMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "handlers" => Ok(FaultMode::Handlers),
            "in-thread" => Ok(FaultMode::InThread),
            other => Err(format!(
                "unknown fault mode {other:?}: use \"handlers\" or \"in-thread\""
            )),
        }
    }
}

impl std::fmt::Display for FaultMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable that turns page pools on or off where no code
/// does ([`PagerBuilder::pool`]).
pub const POOL_ENV: &str = "UPAGER_POOL";

/// The environment variable naming the disk tier's directory
/// ([`PagerBuilder::cache_dir`]).
pub const CACHE_DIR_ENV: &str = "UPAGER_CACHE_DIR";
/// The environment variable setting the disk tier's size
/// ([`PagerBuilder::cache_size`]: `20G`, `512M`; `0` turns it off).
pub const CACHE_SIZE_ENV: &str = "UPAGER_CACHE_SIZE";

/// A size an environment variable sets: None when unset or blank, an
/// error naming the variable when it is not a size ([`parse_size`]).
fn env_size(var: &str) -> Result<Option<u64>, String> {
    match std::env::var(var) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => parse_size(&v)
            .map(Some)
            .map_err(|e| format!("{var}={v:?}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{var} is not valid UTF-8")),
    }
}

/// An on/off setting of an environment variable: `on`, `1`, `true`, `yes`
/// or `off`, `0`, `false`, `no`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Switch(bool);

impl std::str::FromStr for Switch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "on" | "1" | "true" | "yes" => Ok(Switch(true)),
            "off" | "0" | "false" | "no" => Ok(Switch(false)),
            other => Err(format!("unknown setting {other:?}: use \"on\" or \"off\"")),
        }
    }
}

/// The choice environment variable `var` names: None when unset or blank,
/// an error naming the variable when it names none or is not UTF-8.
fn env_choice<T: std::str::FromStr<Err = String>>(var: &str) -> Result<Option<T>, String> {
    match std::env::var(var) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v.parse().map(Some).map_err(|e| format!("{var}={v:?}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{var} is not valid UTF-8")),
    }
}

/// Which userfaultfd a pager opens: one name on every face, and the
/// `UPAGER_USERFAULTFD` environment variable (`auto`, `kernel-faults`,
/// `user-mode-only`).
///
/// A userfaultfd that serves faults raised inside system calls
/// (`write(fd, region, n)` on a non-resident page) needs
/// `/dev/userfaultfd` (root, or the device's permissions) or privilege
/// (`CAP_SYS_PTRACE`, or `vm.unprivileged_userfaultfd = 1`). Every process
/// may open a user-mode-only one (Linux 5.11): faults in user code are
/// served the same, but such a system call fails with EFAULT — the
/// contract the in-thread fault mode has anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Userfaultfd {
    /// One that serves system calls where allowed, else user-mode-only
    /// (said once in the log, and in [`Pager::info`](crate::Pager::info)).
    /// Default.
    #[default]
    Auto,
    /// Only one that serves system calls: refuse to start otherwise.
    KernelFaults,
    /// Always user-mode-only: the behaviour an ordinary user gets, on every
    /// machine (for tests, and for code that must work the same
    /// everywhere).
    UserModeOnly,
}

impl Userfaultfd {
    /// The environment variable that chooses where no code does.
    pub const ENV: &'static str = "UPAGER_USERFAULTFD";

    /// Its name: `auto`, `kernel-faults` or `user-mode-only`.
    pub fn name(self) -> &'static str {
        match self {
            Userfaultfd::Auto => "auto",
            Userfaultfd::KernelFaults => "kernel-faults",
            Userfaultfd::UserModeOnly => "user-mode-only",
        }
    }

    /// The choice named by `UPAGER_USERFAULTFD` (`Auto` when unset or
    /// empty), or an error naming the variable.
    pub fn from_env() -> Result<Userfaultfd, String> {
        env_choice(Self::ENV).map(Option::unwrap_or_default)
    }

    pub(crate) fn policy(self) -> upager_sys::uffd::OpenPolicy {
        match self {
            Userfaultfd::Auto => upager_sys::uffd::OpenPolicy::Auto,
            Userfaultfd::KernelFaults => upager_sys::uffd::OpenPolicy::KernelFaults,
            Userfaultfd::UserModeOnly => upager_sys::uffd::OpenPolicy::UserModeOnly,
        }
    }
}

impl std::str::FromStr for Userfaultfd {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Userfaultfd::Auto),
            "kernel-faults" => Ok(Userfaultfd::KernelFaults),
            "user-mode-only" => Ok(Userfaultfd::UserModeOnly),
            other => Err(format!(
                "unknown userfaultfd choice {other:?}: use \"auto\", \"kernel-faults\" or \"user-mode-only\""
            )),
        }
    }
}

impl std::fmt::Display for Userfaultfd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Smallest region that fills sequential 2 MiB runs as huge pages
/// ([`PagerBuilder::huge_runs`]): four huge pages. (A guess: below that a
/// region's whole sequential pass is a few faults either way, and the
/// staged pages a pager keeps would outweigh it.)
pub const HUGE_RUNS_MIN_BYTES: u64 = 4 * MAX_FOLIO;

/// Default of [`PagerBuilder::dirty_expire`]: a few seconds, so a worker
/// killed a little after its writes keeps them (the kernel waits 30 s).
pub const DEFAULT_DIRTY_EXPIRE: std::time::Duration = std::time::Duration::from_secs(5);

/// Options of a [`Pager`](crate::Pager); build one with [`Pager::builder`](crate::Pager::builder).
#[derive(Debug, Clone)]
pub struct PagerBuilder {
    pub(crate) budget: u64,
    pub(crate) batch: Option<usize>,
    pub(crate) batch_bytes: Option<u64>,
    pub(crate) handler_threads: usize,
    pub(crate) uffd_shards: Option<usize>,
    pub(crate) background_reclaim: bool,
    pub(crate) lookup: Lookup,
    pub(crate) batched_removal: bool,
    pub(crate) readahead: u64,
    pub(crate) swap_dir: PathBuf,
    pub(crate) direct_io: bool,
    pub(crate) batched_writeback: bool,
    pub(crate) handler_spin: std::time::Duration,
    pub(crate) dirty_limit: Option<u64>,
    pub(crate) fault_timing: bool,
    /// The fault mode (`None`: chosen when the userfaultfd is open), or
    /// why `UPAGER_FAULT_MODE` named none (reported by `build`; an explicit
    /// [`PagerBuilder::fault_mode`] clears it).
    pub(crate) fault_mode: Result<Option<FaultMode>, String>,
    /// Which userfaultfd, or why `UPAGER_USERFAULTFD` named none.
    pub(crate) userfaultfd: Result<Userfaultfd, String>,
    pub(crate) debug_lru_try_fail_every: u32,
    pub(crate) dirty_expire: std::time::Duration,
    pub(crate) huge_runs: bool,
    pub(crate) readahead_async: bool,
    /// Page pools for read-only file regions, or why `UPAGER_POOL` named
    /// no setting (reported by `build`; [`PagerBuilder::pool`] clears it).
    pub(crate) pool: Result<bool, String>,
    /// The disk tier's directory (None: the default under the user's
    /// cache directory).
    pub(crate) cache_dir: Option<PathBuf>,
    /// The disk tier's size (None: the default; 0: off), or why
    /// `UPAGER_CACHE_SIZE` named none (reported by `build`).
    pub(crate) cache_size: Result<Option<u64>, String>,
}

impl Default for PagerBuilder {
    fn default() -> Self {
        PagerBuilder {
            budget: 256 << 20,
            batch: None,
            batch_bytes: None,
            handler_threads: upager_sys::io::online_cpus().clamp(1, 4),
            uffd_shards: None,
            background_reclaim: true,
            lookup: Lookup::LockFree,
            batched_removal: true,
            readahead: 2 << 20,
            swap_dir: std::env::temp_dir(),
            direct_io: true,
            batched_writeback: true,
            handler_spin: std::time::Duration::ZERO,
            dirty_limit: None,
            fault_timing: false,
            fault_mode: FaultMode::from_env(),
            userfaultfd: Userfaultfd::from_env(),
            debug_lru_try_fail_every: 0,
            dirty_expire: DEFAULT_DIRTY_EXPIRE,
            readahead_async: true,
            huge_runs: false,
            pool: env_choice::<Switch>(POOL_ENV).map(|s| s.is_some_and(|s| s.0)),
            cache_dir: std::env::var_os(CACHE_DIR_ENV)
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
            cache_size: env_size(CACHE_SIZE_ENV),
        }
    }
}

impl PagerBuilder {
    /// Most bytes resident at once, over all regions. Default 256 MiB.
    pub fn budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self
    }
    /// Folios evicted per batch (one TLB shootdown per batch). Default: as
    /// many folios as cover 4 MiB (half the budget when that is
    /// less, so any budget of a few folios works), at most 1024. `1` evicts
    /// folio by folio (for comparison).
    pub fn batch(mut self, folios: usize) -> Self {
        self.batch = Some(folios);
        self
    }
    /// Bytes evicted per batch, whatever the folio size of each region
    /// (regions of 64 KiB folios evict a sixteenth as many folios per batch
    /// as regions of 4 KiB ones): 4 KiB up to the budget. [`batch`](Self::batch)
    /// wins when both are set. Default: as [`batch`](Self::batch) says.
    pub fn batch_bytes(mut self, bytes: u64) -> Self {
        self.batch_bytes = Some(bytes);
        self
    }
    /// Fault-handler threads. Default: the number of CPUs, at most 4.
    pub fn handler_threads(mut self, n: usize) -> Self {
        self.handler_threads = n;
        self
    }
    /// Userfaultfds the pager's fault queue is split over (handler mode):
    /// each handler thread waits on one of them, and each region's range is
    /// split into up to `n` contiguous shards (multiples of 2 MiB and of the
    /// folio) registered on different ones, so faulting threads working on
    /// different parts of the data queue on different wait queues and wake
    /// different handlers. 1 to the number of handler threads. Default: one
    /// per handler thread. The in-thread mode always uses one (its faults
    /// never queue).
    pub fn uffd_shards(mut self, n: usize) -> Self {
        self.uffd_shards = Some(n);
        self
    }
    /// Run a background reclaimer between the watermarks. Default on; off
    /// leaves only direct reclaim by faults.
    pub fn background_reclaim(mut self, on: bool) -> Self {
        self.background_reclaim = on;
        self
    }
    /// Region lookup on the fault path. Default [`Lookup::LockFree`].
    pub fn lookup(mut self, l: Lookup) -> Self {
        self.lookup = l;
        self
    }
    /// Take the LRU and swap-slot locks once per eviction batch (default) or
    /// once per folio (`false`, for the seed-003 ablation).
    pub fn batched_removal(mut self, on: bool) -> Self {
        self.batched_removal = on;
        self
    }
    /// Largest readahead on sequential faults, in bytes (the window doubles
    /// from two folios up to this). Default 2 MiB; 0 disables readahead; at
    /// most 64 MiB.
    pub fn readahead(mut self, bytes: u64) -> Self {
        self.readahead = bytes;
        self
    }
    /// Async readahead: once a sequential stream's readahead
    /// window has grown to its largest, the fault that fills a window asks
    /// the prefetch thread to fill the next one at the same time, so the
    /// store is read on a second CPU while the stream's own fault reads
    /// its window and while the application works on it (the kernel's
    /// async readahead, without per-stream state). Default on; `false`
    /// fills every window in the fault that needs it.
    pub fn readahead_async(mut self, on: bool) -> Self {
        self.readahead_async = on;
        self
    }
    /// Page pools (pool.rs): a read-only file region joins the host's pool
    /// of its file's pages, one copy that every process mapping the file
    /// shares under one budget (the first process's), instead of a
    /// private copy under this pager's. A page any process brought in is
    /// mapped by the kernel without a fault to user space; eviction
    /// removes a batch from every process at once. Regions that cannot
    /// join one (writable, anonymous, network stores, an offset that is
    /// not a multiple of the folio, `MapOptions::at`, a pool directory
    /// that is not private) are private as before, with the reason logged.
    /// [`MapOptions::pool`] overrides it for one region. Default: the
    /// `UPAGER_POOL` environment variable (`on`/`off`), else off.
    pub fn pool(mut self, on: bool) -> Self {
        self.pool = Ok(on);
        self
    }
    /// The disk tier's directory (cache.rs): what the read-only regions of
    /// a network store (an S3 object) fetch stays there, keyed by the
    /// data's identity, for later faults, passes and runs; shared by this
    /// user's processes. Default: `UPAGER_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/upager/tier`, else `~/.cache/upager/tier`.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }
    /// The disk tier's size in bytes: the directory's contents stay within
    /// it (the least recently used go first). `0` turns the tier off.
    /// Default: `UPAGER_CACHE_SIZE`, else 20 GiB or half the free space of
    /// its file system when that is less.
    pub fn cache_size(mut self, bytes: u64) -> Self {
        self.cache_size = Ok(Some(bytes));
        self
    }
    /// Mixed folio sizes: a writable file region of folios below
    /// 2 MiB, at least [`HUGE_RUNS_MIN_BYTES`] long, fills a 2 MiB-aligned
    /// run of its folios as one huge page (one `UFFDIO_MOVE` of a PMD) when
    /// the faults there are sequential and the readahead window has grown
    /// to 2 MiB; random faults, a partial run at the end of the file and
    /// fills that find no staged huge page use the region's folios as
    /// before. Default off, measured on this machine (quiet, 2026-11-26,
    /// docs/benchmarks.md, "Folio sizes, huge folios and huge runs"): with async readahead
    /// ([`PagerBuilder::readahead_async`]) a numpy pass over 2 GiB through
    /// 192 MiB takes about the same time with or without them (0.69-0.84x
    /// numpy.memmap's with them, 0.71-0.77x without, two runs), while each
    /// run costs 4-5 TLB shootdowns
    /// of its own (each `UFFDIO_MOVE` of a PMD flushes its source: in, and
    /// out at eviction; a run a fault touched first drops a page table;
    /// read-only regions change protection around the move): 9-11 per 1000
    /// evicted pages in `mmap-read` against 1.15 without. Where every CPU
    /// is busy paging they are often faster (`mmap-read`, two threads:
    /// 0.59-0.87x the kernel's time against 0.73-0.82x, three runs) and
    /// cost less CPU. A region with
    /// them also keeps a staged huge page charged to the budget while it
    /// lives.
    /// [`MapOptions::huge_runs`] overrides it for one region.
    pub fn huge_runs(mut self, on: bool) -> Self {
        self.huge_runs = on;
        self
    }
    /// Directory for anonymous regions' private swap files (created 0600 and
    /// unlinked at once). Default: the system temp dir.
    pub fn swap_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.swap_dir = dir.into();
        self
    }
    /// Use O_DIRECT for aligned store I/O where the file system allows it, so
    /// the kernel's page cache does not hold a second copy outside the
    /// budget. Default on.
    pub fn direct_io(mut self, on: bool) -> Self {
        self.direct_io = on;
        self
    }
    /// Hand each eviction or write-back batch's writes to its store at once
    /// ([`Store::write_batch`]: the file store and the swap file submit them
    /// together through io_uring and wait for all) instead of one
    /// [`Store::write_from`] per run of consecutive folios (`false`, for
    /// comparison). Default on. Where io_uring is unavailable (disabled by
    /// `kernel.io_uring_disabled`, a seccomp filter) the stores fall back to
    /// one `pwrite` per write and log it once.
    ///
    /// [`Store::write_batch`]: crate::Store::write_batch
    /// [`Store::write_from`]: crate::Store::write_from
    pub fn batched_writeback(mut self, on: bool) -> Self {
        self.batched_writeback = on;
        self
    }
    /// After serving faults, a handler keeps checking for the next one (yielding
    /// the CPU between checks) for this long before it blocks, which can save
    /// the cross-CPU wakeup of a blocked handler. Default: zero (block at
    /// once). Measured here (2 vCPU KVM, random 4 KiB reads, 2 threads,
    /// 5 interleaved rounds, load from other builds): 20 µs gave a median of
    /// ~135K reads/s against ~123K with zero, within the noise (61K-167K).
    pub fn handler_spin(mut self, d: std::time::Duration) -> Self {
        self.handler_spin = d;
        self
    }
    /// Most bytes of file-backed memory that may be dirty (written, not yet
    /// written back) at once, like the kernel's `dirty_ratio`. A write fault
    /// that would pass it first writes dirty folios back (the faulting
    /// thread waits, as in `balance_dirty_pages`); if the store refuses
    /// writes (full disk, I/O error), the write gets SIGBUS while reads of
    /// clean and stored data go on working. Default: half the budget.
    pub fn dirty_limit(mut self, bytes: u64) -> Self {
        self.dirty_limit = Some(bytes);
        self
    }
    /// Write back file-backed data that has been dirty for longer than
    /// this, in the background (the kernel's `dirty_expire_centisecs`,
    /// 30 s there), and keep it resident: a write older than this (plus the
    /// writer's scan period, a quarter of it) is in the file even if the
    /// process is then killed (SIGKILL, `os._exit`, a pool worker
    /// terminated) — in the page cache, not yet on disk: only `flush`
    /// makes it durable. Default 5 s; `Duration::ZERO` turns it off (only
    /// `flush`, eviction and the dirty limit write back).
    pub fn dirty_expire(mut self, age: std::time::Duration) -> Self {
        self.dirty_expire = age;
        self
    }
    /// Time the phases of every fill of a missing fault (region lookup,
    /// budget, store read, `UFFDIO_COPY`, wake, LRU) and sum them, read with
    /// [`Pager::fault_phases`](crate::Pager::fault_phases). Costs a few clock
    /// reads per fault; default off.
    pub fn fault_timing(mut self, on: bool) -> Self {
        self.fault_timing = on;
        self
    }
    /// How faults are resolved: [`FaultMode::Handlers`] (handler threads)
    /// or [`FaultMode::InThread`] (the faulting thread, in a SIGBUS handler).
    /// Default: `UPAGER_FAULT_MODE` if set, else `Handlers` where the
    /// userfaultfd serves faults in system calls and `InThread` where it is
    /// user-mode-only (see [`Userfaultfd`]).
    pub fn fault_mode(mut self, mode: FaultMode) -> Self {
        self.fault_mode = Ok(Some(mode));
        self
    }
    /// Which userfaultfd to open ([`Userfaultfd`]). Default:
    /// `UPAGER_USERFAULTFD` if set, else [`Userfaultfd::Auto`].
    pub fn userfaultfd(mut self, choice: Userfaultfd) -> Self {
        self.userfaultfd = Ok(choice);
        self
    }
    /// Test knob, not for use: every `n`-th attempt of an in-thread fill to
    /// queue its folio on the LRU (a lock that a SIGBUS handler may only
    /// try) fails as a contended one would, so tests can force the
    /// hand-off path (the lost stores it once had). Default 0: never.
    #[doc(hidden)]
    pub fn debug_lru_try_fail_every(mut self, n: u32) -> Self {
        self.debug_lru_try_fail_every = n;
        self
    }
    /// Creates the pager.
    pub fn build(self) -> Result<crate::Pager, crate::PagerError> {
        crate::Pager::from_builder(self)
    }
}

/// Options of one region.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapOptions {
    pub(crate) folio: Option<u64>,
    pub(crate) writable: bool,
    pub(crate) offset: u64,
    pub(crate) len: Option<u64>,
    pub(crate) at: Option<upager_sys::mem::FixedRange>,
    pub(crate) huge_runs: Option<bool>,
    pub(crate) pool: Option<bool>,
    /// The compressed tier of an anonymous region (ztier.rs; None: the
    /// `UPAGER_ZTIER` environment variable, else on).
    pub(crate) ztier: Option<bool>,
    pub(crate) warm: WarmStart,
    /// The data file of a file region with a warm start (set by
    /// `Pager::map_file` and `map_open_file`: [`MapOptions::beside`]).
    pub(crate) warm_file: Option<std::path::PathBuf>,
}

impl MapOptions {
    /// Defaults: upager's folio ([`DEFAULT_FOLIO`], 4 KiB, for files and
    /// stores; [`DEFAULT_ANON_FOLIO`], 64 KiB, for anonymous regions),
    /// read-only, offset 0, whole file.
    pub fn new() -> Self {
        Self::default()
    }
    /// Unit of fill, eviction and accounting: a power of two from 4 KiB to
    /// 2 MiB. Default: [`DEFAULT_FOLIO`] (4 KiB; sequential streams still
    /// fill whole readahead windows at once) for file and store regions,
    /// [`DEFAULT_ANON_FOLIO`] (64 KiB) for anonymous ones. In a file
    /// folio above 4 KiB and below 2 MiB, a write dirties the 4 KiB page it
    /// lands in first (one page written back), and the whole folio from
    /// its second written page on.
    pub fn folio(mut self, bytes: u64) -> Self {
        self.folio = Some(bytes);
        self
    }
    /// Map read-write (writes reach the store). Default read-only for files;
    /// anonymous regions are always writable.
    pub fn writable(mut self, on: bool) -> Self {
        self.writable = on;
        self
    }
    /// Start of the range in the file, a multiple of the folio size. Default 0.
    pub fn offset(mut self, bytes: u64) -> Self {
        self.offset = bytes;
        self
    }
    /// Length of the range. Default: to the end of the file.
    pub fn len(mut self, bytes: u64) -> Self {
        self.len = Some(bytes);
        self
    }
    /// Map the region at the start of `range` (as `MAP_FIXED`, UMap's
    /// `UMAP_FIXED`), replacing what the caller had there, typically its
    /// own `PROT_NONE` reservation; several regions may sit side by side
    /// in one reservation. The address must be a multiple of the folio
    /// size and the range at least the region's length rounded up to the
    /// folio size. Unmapping the region leaves its range unmapped, as
    /// `munmap` does; so does a map that fails after the range was
    /// replaced (as a failed `MAP_FIXED` may). Default: an address upager
    /// chooses.
    pub fn at(mut self, range: upager_sys::mem::FixedRange) -> Self {
        self.at = Some(range);
        self
    }
    /// Fill sequentially read 2 MiB runs of this region as huge pages
    /// ([`PagerBuilder::huge_runs`]). Default: the pager's setting (off).
    /// Only writable file regions of at least [`HUGE_RUNS_MIN_BYTES`] with
    /// folios below 2 MiB have huge runs; for others this changes nothing.
    pub fn huge_runs(mut self, on: bool) -> Self {
        self.huge_runs = Some(on);
        self
    }
    /// Join the host's page pool of this file ([`PagerBuilder::pool`]).
    /// Default: the pager's setting.
    pub fn pool(mut self, on: bool) -> Self {
        self.pool = Some(on);
        self
    }
    /// The compressed tier of an anonymous region (`Pager::map_anonymous`):
    /// evicted folios that compress to 3/4 of their size or less are kept
    /// compressed in memory, charged to the budget (at most half of it),
    /// and a refault decompresses them instead of reading the swap file;
    /// the rest go to the swap file as without it. Default: the
    /// `UPAGER_ZTIER` environment variable (`on`/`off`), else on.
    pub fn compressed_tier(mut self, on: bool) -> Self {
        self.ztier = Some(on);
        self
    }
    /// Record the order this file region's folios are first needed beside
    /// the file (`<file>.upager-trace`, written when the region is
    /// unmapped), and replay a recorded one as prefetch ([`WarmStart`]:
    /// `Auto` replays a trace that matches the file and records
    /// otherwise). Only file regions keep traces: mapped with
    /// [`Pager::map_file`], or with [`Pager::map_open_file`] on a
    /// descriptor whose path (`/proc/self/fd`) still names its file (else
    /// a warning is logged and nothing is recorded). Default
    /// [`WarmStart::Off`].
    ///
    /// [`WarmStart`]: crate::WarmStart
    /// [`WarmStart::Off`]: crate::WarmStart::Off
    /// [`Pager::map_file`]: crate::Pager::map_file
    /// [`Pager::map_open_file`]: crate::Pager::map_open_file
    pub fn warm(mut self, how: WarmStart) -> Self {
        self.warm = how;
        self
    }
    /// The folio size of a file or store region with these options: the
    /// one set ([`MapOptions::folio`]) or [`DEFAULT_FOLIO`], for stores
    /// that check it against their own unit before mapping.
    pub fn folio_bytes(&self) -> u64 {
        self.folio.unwrap_or(DEFAULT_FOLIO)
    }
    /// The folio size set with [`MapOptions::folio`], if one was (a store
    /// with a unit of its own uses that unit when none was).
    pub fn folio_set(&self) -> Option<u64> {
        self.folio
    }
    /// These options for a file region whose data file is `file()` (its
    /// warm start's trace goes beside it), asked only with a warm start.
    pub(crate) fn beside(
        &self,
        file: impl FnOnce() -> Option<std::path::PathBuf>,
    ) -> std::borrow::Cow<'_, MapOptions> {
        if self.warm == WarmStart::Off {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(MapOptions {
            warm_file: file(),
            ..self.clone()
        })
    }
    /// These options with the folio fixed: the one set, else `default`.
    pub(crate) fn with_default_folio(&self, default: u64) -> MapOptions {
        MapOptions {
            folio: Some(self.folio.unwrap_or(default)),
            ..self.clone()
        }
    }
    /// Whether a read-write mapping is asked for ([`MapOptions::writable`]).
    pub fn is_writable(&self) -> bool {
        self.writable
    }
}

/// Whether a file region records the order its folios are first needed,
/// and replays a recorded one ([`MapOptions::warm`](MapOptions::warm)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WarmStart {
    /// Neither (the default).
    #[default]
    Off,
    /// Replay the trace beside the file if it matches the file as it is
    /// now; otherwise record one (written when the region is unmapped). A
    /// replay the program leaves (other inputs) stops, and this run's own
    /// order replaces the trace at unmap.
    Auto,
    /// Record a new trace, whatever is there.
    Record,
}

/// Parses a size like `4096`, `64K`, `64KiB`, `512M`, `2G`, `1.5G`: a
/// decimal number (a fraction is rounded down to whole bytes), then at
/// most one unit, `K`, `M`, `G` or `T` (binary), each with an optional
/// `B` or `iB`, or `B` alone; case-insensitive; blanks around the number
/// and before the unit. Anything else is refused: `-0M` parsed as 0
/// (found by fuzz/fuzz_targets/env.rs), and so did `1e3`, `+5`, `4096bb`,
/// `64KiBiB` and `64iB`, as 1000, 5, 4096, 64 KiB and 64.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || {
        format!(
            "invalid size {t:?}: use a number with an optional unit, like 4096, 64K, 512M or 2G"
        )
    };
    let lower = t.to_ascii_lowercase();
    const UNITS: [(char, u64); 4] = [
        ('k', 1 << 10),
        ('m', 1 << 20),
        ('g', 1 << 30),
        ('t', 1 << 40),
    ];
    let (num, mult) = UNITS
        .iter()
        .find_map(|&(u, m)| {
            ["", "b", "ib"]
                .iter()
                .find_map(|sfx| lower.strip_suffix(&format!("{u}{sfx}")).map(|n| (n, m)))
        })
        .unwrap_or_else(|| (lower.strip_suffix('b').unwrap_or(&lower), 1));
    let num = num.trim();
    let dots = num.bytes().filter(|&b| b == b'.').count();
    if dots > 1
        || !num.bytes().any(|b| b.is_ascii_digit())
        || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    {
        return Err(bad());
    }
    if dots == 0 {
        let n: u64 = num.parse().map_err(|_| bad())?;
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    let v = f * mult as f64;
    // 2^64 and beyond do not fit (u64::MAX as f64 is 2^64).
    if !(v.is_finite() && v < u64::MAX as f64) {
        return Err(bad());
    }
    Ok(v as u64)
}

/// Formats bytes with a binary unit (`64 KiB`, `1.5 GiB`).
pub fn format_size(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(format_size(64 << 10), "64 KiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }

    #[test]
    fn a_size_is_a_number_and_at_most_one_unit() {
        // "-0M" parsed as 0 (found by fuzz/fuzz_targets/env.rs), and so
        // did these, as 0, 1000, 5, 4096, 64 KiB and 64, though no
        // documented size is written so.
        for s in ["-0M", "-0", "1e3", "+5", "4096bb", "64KiBiB", "64iB"] {
            assert!(parse_size(s).is_err(), "{s:?} parsed");
        }
        for s in ["inf", "1.2.3", ".", "", "K", "12Q"] {
            assert!(parse_size(s).is_err(), "{s:?} parsed");
        }
        assert_eq!(parse_size(" 8 MiB "), Ok(8 << 20));
        assert_eq!(parse_size("1b"), Ok(1));
        assert_eq!(parse_size("64kb"), Ok(64 << 10));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("1."), Ok(1));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_size("16777216T").is_err());
    }

    #[test]
    fn fault_mode_names() {
        for m in [FaultMode::Handlers, FaultMode::InThread] {
            assert_eq!(m.name().parse::<FaultMode>(), Ok(m));
            assert_eq!(m.to_string(), m.name());
        }
        assert_eq!(" In-Thread ".parse::<FaultMode>(), Ok(FaultMode::InThread));
        let e = "sigbus".parse::<FaultMode>().unwrap_err();
        assert!(e.contains("\"handlers\" or \"in-thread\""), "{e}");
    }
}
