//! The lost-write soak: a hunt for stores that vanish, run by the
//! `upager-soak` binary (minutes to hours) and by the CI test
//! `crates/stress/tests/soak.rs` (≈ 25 s per variant).
//!
//! One pager, one writable file region several times the budget (default:
//! 32 MiB file on /dev/shm, 8 MiB budget, 16 KiB folios, swap dir on
//! /dev/shm) and, optionally, an anonymous region beside it that takes its
//! share of the budget. Round after round:
//!
//! ```text
//!  stores   W writer threads (default 2), released together by a barrier,
//!           each store a self-describing word (below) into the file region:
//!           even stores walk a strided sweep that every writer walks in the
//!           same order (the same words, the same folios, at the same time),
//!           odd stores hit random words (in the last eighth of the round,
//!           random words of a 1 MiB window both share, so the flush has
//!           dirty folios to write back). Each writer records its last store
//!           per word in its own model, and reads back the word it stored 64
//!           stores earlier: it must hold its own value or another writer's
//!           store of this round to that word (coherence: nothing older).
//!  anon     (variant) one thread does the same over the anonymous region,
//!           with an exact model (one writer); stops when every file
//!           writer has reached the tail
//!  readers  (variant) R threads (default 2) load random words of the file
//!           region until every writer has reached the tail: each must be
//!           the value verified after the previous round or a store of
//!           this round to that very word
//!  scanners (`--scanners S`, or one with `--mixed`) S threads
//!           load one word per 4 KiB page in order, wrapping around,
//!           checked as the readers' are: their faults are a stream, so
//!           the pager reads ahead on its prefetch thread among the
//!           writers' folios, and with `--mixed` fills 2 MiB runs as huge
//!           pages (mixed folio sizes)
//!  pre      after the writers are joined, every word, without a fault:
//!           present pages (pagemap) from the region, the others from the
//!           file (an eviction writes back before it unmaps): a word wrong
//!           here was lost while the threads ran ("LOST BEFORE FLUSH")
//!  flush
//!  check    a) pread the whole file: every word must be the last store of
//!              one of the writers that stored to it this round (either
//!              writer's, for words both stored), or the previous round's
//!              value where nobody stored
//!           b) /proc/self/pagemap over the file region: every present page
//!              must carry the uffd-wp bit (57, PM_UFFD_WP), and its words
//!              must pass the same check as the file's
//!           c) every word of the anonymous region equals its model
//! ```
//!
//! Why b) must hold: `flush` writes every DIRTY folio back under a
//! write-protect and publishes it CLEAN (gather.rs, `Mode::Writeback`), and a
//! CLEAN folio is write-protected in the view by invariant (folio.rs); read
//! fills and prefetches install CLEAN folios with `UFFDIO_COPY_MODE_WP`.
//! Pinned folios (`Region::pin`) are no exception after a flush: flush
//! takes pinned dirty folios too and leaves them CLEAN and protected;
//! gather.rs `unprotect_pinned` re-opens only pinned DIRTY folios lying in
//! the gaps of a write-protect span, and after a flush with no writer
//! running there are none. (A folio whose write-back failed stays DIRTY,
//! its pages possibly still protected: no violation either.) So a present
//! page without the bit here is a folio the engine thinks clean that a
//! store can change without a fault — whose next eviction drops that store.
//! The soak pins nothing (but its self-test does, after the flush, to show
//! the check fires).
//!
//! A stored word says who stored it where and when ([`encode`]):
//! `round (24 bits) | thread (4 bits) | store number (36 bits)`, and the
//! store number with [`Plan::target`] gives the word it was meant for, so a
//! wrong word in a report reads "r35 t0 #88 (stored to this word)" or
//! "... (meant for word 1234)". The initial file holds thread 15, round 0,
//! store number = the word's index; the anonymous region starts as zeros.
//!
//! A mismatch is reported (word, folio, page, expected and found values
//! decoded, what the region holds there now, the pagemap bits of the
//! folio's pages, [`dump_trace`]); the model then takes the file's values
//! and the soak goes on, so a run gives a loss *rate*. Stalls are reported
//! too: a round more than [`Config::stall`] over the median of the last 16,
//! or 1000 accesses of one thread taking longer than [`Config::stall`].

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use upager::{FaultMode, MapOptions, Pager, Region};
use upager_testdata::{mix, Rng};

/// pagemap bit 63: page present.
pub const PM_PRESENT: u64 = 1 << 63;
/// pagemap bit 62: page swapped.
pub const PM_SWAPPED: u64 = 1 << 62;
/// pagemap bit 57: the page (or its swap/marker entry) is uffd-write-protected.
pub const PM_UFFD_WP: u64 = 1 << 57;
const PAGE: u64 = 4096;

const ROUND_SHIFT: u32 = 40;
const THREAD_SHIFT: u32 = 36;
const SEQ_MASK: u64 = (1 << THREAD_SHIFT) - 1;
/// Thread number of the initial file contents.
pub const INIT_THREAD: u64 = 15;
/// Thread number of the anonymous region's writer.
pub const ANON_THREAD: u64 = 14;
/// Most writer threads (thread numbers 0..14).
pub const MAX_WRITERS: usize = 14;
/// Words of the window the last eighth of a round's random stores share.
const TAIL_WINDOW_WORDS: u64 = (1 << 20) / 8;
/// A thread's store read back this many stores later.
const READBACK_LAG: u64 = 64;
/// Accesses timed together (a stall is a batch slower than `Config::stall`).
const TIMED_BATCH: u64 = 1000;

/// The word thread `thread` stores as its store number `seq` of `round`.
pub fn encode(round: u64, thread: u64, seq: u64) -> u64 {
    debug_assert!(round < 1 << 24 && thread < 16 && seq <= SEQ_MASK);
    (round << ROUND_SHIFT) | (thread << THREAD_SHIFT) | seq
}

/// A stored word, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Round (0: the initial contents).
    pub round: u64,
    /// Writer thread (15: initial contents, 14: the anonymous writer).
    pub thread: u64,
    /// The thread's store number in that round.
    pub seq: u64,
}

/// Decodes a stored word.
pub fn decode(v: u64) -> Stored {
    Stored {
        round: v >> ROUND_SHIFT,
        thread: (v >> THREAD_SHIFT) & 0xF,
        seq: v & SEQ_MASK,
    }
}

/// The stores of a round: which word each store number targets.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    seed: u64,
    nwords: u64,
    stride: u64,
}

impl Plan {
    /// A plan over `nwords` words with a sweep of stride `stride` words.
    pub fn new(seed: u64, nwords: u64, stride: u64) -> Plan {
        let stride = stride.clamp(2, nwords.max(2));
        Plan {
            seed,
            nwords,
            stride,
        }
    }
    /// Words of the sweep (each thread's even stores).
    pub fn sweep_len(&self) -> u64 {
        (self.nwords / self.stride).max(1)
    }
    /// Stores per thread per round.
    pub fn stores(&self) -> u64 {
        2 * self.sweep_len()
    }
    fn sweep_offset(&self, round: u64) -> u64 {
        mix(self.seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % self.stride
    }
    /// The word that store `seq` of `thread` in `round` targets (None: no
    /// such store).
    pub fn target(&self, round: u64, thread: u64, seq: u64) -> Option<u64> {
        if thread == INIT_THREAD {
            return (round == 0 && seq < self.nwords).then_some(seq);
        }
        if round == 0 || seq >= self.stores() {
            return None;
        }
        let r = mix(self.seed ^ 0x5EED ^ (round << ROUND_SHIFT) ^ (thread << THREAD_SHIFT) ^ seq);
        Some(if seq.is_multiple_of(2) {
            (self.sweep_offset(round) + (seq / 2) * self.stride) % self.nwords
        } else if seq >= self.stores() / 8 * 7 && self.nwords > TAIL_WINDOW_WORDS {
            // The last eighth's random stores share a 1 MiB window (both
            // threads, per round): the flush finds those folios dirty.
            let start = mix(self.seed ^ round) % (self.nwords - TAIL_WINDOW_WORDS);
            start + r % TAIL_WINDOW_WORDS
        } else {
            r % self.nwords
        })
    }
    /// Whether `v` is a store of `round` to word `w`.
    pub fn is_store_to(&self, v: u64, w: u64, round: u64) -> bool {
        let s = decode(v);
        s.round == round && self.target(s.round, s.thread, s.seq) == Some(w)
    }
    /// `v` in words: "r35 t0 #88 (stored to this word)".
    pub fn describe(&self, v: u64, w: u64) -> String {
        if v == 0 {
            return "0 (zero-filled)".into();
        }
        let s = decode(v);
        let who = match s.thread {
            INIT_THREAD => "init".to_string(),
            ANON_THREAD => "anon".to_string(),
            t => format!("t{t}"),
        };
        let kind = if s.thread == INIT_THREAD {
            ""
        } else if s.seq.is_multiple_of(2) {
            " sweep"
        } else {
            " random"
        };
        match self.target(s.round, s.thread, s.seq) {
            Some(t) if t == w => format!("r{} {who} #{}{kind} ({v:#x})", s.round, s.seq),
            Some(t) => format!(
                "r{} {who} #{}{kind} ({v:#x}) MEANT FOR WORD {t}",
                s.round, s.seq
            ),
            None => format!("{v:#x} (no store of the plan)"),
        }
    }
}

/// Fault mode, userfaultfd shards, anonymous region on/off, readers on/off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant {
    /// How faults are resolved.
    pub in_thread: bool,
    /// Userfaultfd shards asked for (the in-thread mode always uses one).
    pub shards: usize,
    /// An anonymous region beside the file region.
    pub anon: bool,
    /// Reader threads during the stores.
    pub readers: bool,
}

impl Variant {
    /// The fault mode.
    pub fn mode(&self) -> FaultMode {
        if self.in_thread {
            FaultMode::InThread
        } else {
            FaultMode::Handlers
        }
    }
    /// All 16 variants, handler mode first.
    pub fn all() -> Vec<Variant> {
        let mut v = Vec::new();
        for in_thread in [false, true] {
            for shards in [1, 2] {
                for anon in [true, false] {
                    for readers in [true, false] {
                        v.push(Variant {
                            in_thread,
                            shards,
                            anon,
                            readers,
                        });
                    }
                }
            }
        }
        v
    }
    /// The four CI variants.
    pub fn ci() -> Vec<Variant> {
        [
            "handlers/1/anon/readers",
            "in-thread/1/anon/readers",
            "handlers/2/noanon/noreaders",
            "in-thread/2/noanon/readers",
        ]
        .iter()
        .map(|s| s.parse().expect("CI variant names parse"))
        .collect()
    }
    /// Parses a list: `all`, `ci`, or comma-separated variant names.
    pub fn parse_list(s: &str) -> Result<Vec<Variant>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => out.extend(Variant::all()),
                "ci" => out.extend(Variant::ci()),
                p => out.push(p.parse()?),
            }
        }
        if out.is_empty() {
            return Err("no variant given".into());
        }
        Ok(out)
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.mode().name(),
            self.shards,
            if self.anon { "anon" } else { "noanon" },
            if self.readers { "readers" } else { "noreaders" }
        )
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    /// `MODE/SHARDS/anon|noanon/readers|noreaders`, e.g.
    /// `in-thread/1/anon/readers`.
    fn from_str(s: &str) -> Result<Variant, String> {
        let bad = || {
            format!(
                "bad variant {s:?}: use MODE/SHARDS/anon|noanon/readers|noreaders \
                 (MODE handlers or in-thread, SHARDS 1 or 2), e.g. in-thread/1/anon/readers, \
                 or all, or ci"
            )
        };
        let p: Vec<&str> = s.trim().split('/').collect();
        let [mode, shards, anon, readers] = p[..] else {
            return Err(bad());
        };
        let mode: FaultMode = mode.parse().map_err(|_| bad())?;
        let shards = match shards {
            "1" => 1,
            "2" => 2,
            _ => return Err(bad()),
        };
        let anon = match anon {
            "anon" => true,
            "noanon" => false,
            _ => return Err(bad()),
        };
        let readers = match readers {
            "readers" => true,
            "noreaders" => false,
            _ => return Err(bad()),
        };
        Ok(Variant {
            in_thread: mode == FaultMode::InThread,
            shards,
            anon,
            readers,
        })
    }
}

/// Sizes, threads and limits of a soak run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory for the data file and the swap file (RAM-backed is best).
    pub dir: PathBuf,
    /// The file region's size. Default 32 MiB.
    pub file_bytes: u64,
    /// The anonymous region's size (variants with one). Default 16 MiB.
    pub anon_bytes: u64,
    /// Pager budget. Default 8 MiB.
    pub budget: u64,
    /// Folio size of both regions. Default 16 KiB.
    pub folio: u64,
    /// Writer threads. Default 2.
    pub writers: usize,
    /// Reader threads (variants with readers). Default 2.
    pub readers: usize,
    /// Sequential scanner threads (all variants). Default 0; `--mixed`
    /// runs one.
    pub scanners: usize,
    /// Mixed folio sizes (`--mixed`): 2 MiB runs the scanners read in
    /// sequence are filled as huge pages. Default off, as the engine's.
    pub huge_runs: bool,
    /// Sweep stride in words. Default 509 (≈ 4 KiB, prime: every round's
    /// sweep hits every folio at other words).
    pub stride_words: u64,
    /// Handler threads (handler mode; at least the shards). Default 2.
    pub handler_threads: usize,
    /// Seed of the plan and of the readers. Default 20.
    pub seed: u64,
    /// How long to run rounds. Default 25 s.
    pub duration: Duration,
    /// Stall threshold: a round this much over the median of the last 16,
    /// or 1000 accesses of one thread taking this long. Default 1 s.
    pub stall: Duration,
    /// Print a progress line this often (None: never).
    pub progress: Option<Duration>,
    /// Stop after the first round with a failure.
    pub stop_on_failure: bool,
    /// Words described in detail per round.
    pub max_reports: usize,
    /// Check the checker: run one round; before its flush undo one store
    /// of an evicted folio in the file (pwrite of the word's previous
    /// value), after it pin one folio for writing (dirty and unprotected)
    /// and change word 8 of the anonymous region: the round must report
    /// exactly that word LOST (before and after the flush), that folio's
    /// pages WP-BIT, and (variants with one) that anonymous word.
    pub self_test: bool,
}

impl Config {
    /// The defaults, with files in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Config {
        Config {
            dir: dir.into(),
            file_bytes: 32 << 20,
            anon_bytes: 16 << 20,
            budget: 8 << 20,
            folio: 16 << 10,
            writers: 2,
            readers: 2,
            scanners: 0,
            huge_runs: false,
            stride_words: 509,
            handler_threads: 2,
            seed: 20,
            duration: Duration::from_secs(25),
            stall: Duration::from_secs(1),
            progress: None,
            stop_on_failure: false,
            max_reports: 16,
            self_test: false,
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The variant run.
    pub variant: String,
    /// Userfaultfds the pager really used.
    pub effective_shards: usize,
    /// Rounds completed.
    pub rounds: u64,
    /// Stores made (file and anonymous region).
    pub stores: u64,
    /// Reader loads checked.
    pub loads: u64,
    /// Words of the file that lost their last store (file != model after flush).
    pub words_lost: u64,
    /// Of `words_lost`: words already wrong before the flush (the stores
    /// were lost while the threads ran: eviction, fault or fill path),
    /// not by the flush.
    pub lost_before_flush: u64,
    /// Rounds with at least one lost word.
    pub rounds_with_loss: u64,
    /// Folios with at least one lost word (summed over rounds).
    pub folios_lost: u64,
    /// Present pages of the file region without the uffd-wp bit after a flush.
    pub wp_violations: u64,
    /// Words of present file-region pages that differ from the model after a flush.
    pub region_mismatches: u64,
    /// Writer read-backs that found an older value (a store undone while
    /// the writers ran).
    pub readback_errors: u64,
    /// Reader loads of a value neither verified before nor stored this round.
    pub reader_errors: u64,
    /// Words of the anonymous region that differ from its model.
    pub anon_lost: u64,
    /// Stalls (slow rounds or slow access batches).
    pub stalls: u64,
    /// Flushes that failed.
    pub flush_errors: u64,
    /// Dirty bytes the flushes found (the `dirty_bytes` gauge just before
    /// each flush, summed): the flushes had work to do.
    pub flushed_bytes: u64,
    /// Present pages of the file region checked after the flushes (summed).
    pub pages_checked: u64,
    /// Median round time.
    pub median_round: Duration,
    /// Slowest round.
    pub max_round: Duration,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// The diagnostics, in order.
    pub reports: Vec<String>,
    /// A few pager counters at the end.
    pub counters: String,
}

impl Outcome {
    /// Any mismatch, wp-bit violation, stall or failed flush.
    pub fn failed(&self) -> bool {
        self.words_lost
            + self.wp_violations
            + self.region_mismatches
            + self.readback_errors
            + self.reader_errors
            + self.anon_lost
            + self.stalls
            + self.flush_errors
            > 0
    }

    /// One line of figures.
    pub fn line(&self) -> String {
        format!(
            "{}: {} rounds in {:.1}s (median {:.0} ms, max {:.0} ms), {} stores, {} loads; \
             LOST {} words in {} rounds ({} folios; {} words lost before the flush); wp-bit violations {}, region mismatches {}, \
             read-back errors {}, reader errors {}, anon lost {}, stalls {}, flush errors {}; \
             flushed {} KiB, {} present pages checked, shards used {}",
            self.variant,
            self.rounds,
            self.elapsed.as_secs_f64(),
            self.median_round.as_secs_f64() * 1e3,
            self.max_round.as_secs_f64() * 1e3,
            self.stores,
            self.loads,
            self.words_lost,
            self.rounds_with_loss,
            self.folios_lost,
            self.lost_before_flush,
            self.wp_violations,
            self.region_mismatches,
            self.readback_errors,
            self.reader_errors,
            self.anon_lost,
            self.stalls,
            self.flush_errors,
            self.flushed_bytes >> 10,
            self.pages_checked,
            self.effective_shards,
        )
    }

    /// Adds another run's figures (same variant) to these (the median
    /// becomes the larger of the two medians).
    pub fn merge(&mut self, o: &Outcome) {
        self.variant.clone_from(&o.variant);
        self.effective_shards = o.effective_shards;
        self.rounds += o.rounds;
        self.stores += o.stores;
        self.loads += o.loads;
        self.words_lost += o.words_lost;
        self.lost_before_flush += o.lost_before_flush;
        self.rounds_with_loss += o.rounds_with_loss;
        self.folios_lost += o.folios_lost;
        self.wp_violations += o.wp_violations;
        self.region_mismatches += o.region_mismatches;
        self.readback_errors += o.readback_errors;
        self.reader_errors += o.reader_errors;
        self.anon_lost += o.anon_lost;
        self.stalls += o.stalls;
        self.flush_errors += o.flush_errors;
        self.flushed_bytes += o.flushed_bytes;
        self.pages_checked += o.pages_checked;
        self.median_round = self.median_round.max(o.median_round);
        self.max_round = self.max_round.max(o.max_round);
        self.elapsed += o.elapsed;
        self.counters.clone_from(&o.counters);
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.line())?;
        writeln!(f, "  counters: {}", self.counters)?;
        for r in &self.reports {
            writeln!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Where a run is, for a watchdog in another thread: round and phase, and
/// when either last changed.
#[derive(Debug)]
pub struct Progress {
    round: AtomicU64,
    phase: AtomicU64,
    start: Instant,
    /// Milliseconds since `start` of the last change.
    beat_ms: AtomicU64,
}

/// The phases of a round, for [`Progress`].
pub const PHASES: [&str; 5] = ["setup", "stores", "flush", "check", "teardown"];

impl Default for Progress {
    fn default() -> Self {
        Progress {
            round: AtomicU64::new(0),
            phase: AtomicU64::new(0),
            start: Instant::now(),
            beat_ms: AtomicU64::new(0),
        }
    }
}

impl Progress {
    fn set(&self, round: u64, phase: usize) {
        self.round.store(round, Relaxed);
        self.phase.store(phase as u64, Relaxed);
        self.beat_ms
            .store(self.start.elapsed().as_millis() as u64, Relaxed);
    }
    /// Time since the round or phase last changed.
    pub fn idle(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.beat_ms.load(Relaxed)))
    }
    /// "round 12, phase flush".
    pub fn describe(&self) -> String {
        let p = self.phase.load(Relaxed) as usize;
        format!(
            "round {}, phase {}",
            self.round.load(Relaxed),
            PHASES.get(p).copied().unwrap_or("?")
        )
    }
}

/// The folio's recent state changes (`Region::folio_trace`: fill, write-
/// protect fault, eviction, write-back, ... with old and new state, time and
/// thread) and of its neighbours either side, so a finding explains itself.
pub fn dump_trace(region: &Region, offset: u64) -> String {
    region.folio_trace(offset, 1)
}

/// The pagemap entries of `[addr, addr + len)` (one per 4 KiB page), read
/// with one pread of `/proc/self/pagemap`.
pub fn read_pagemap(pagemap: &File, addr: u64, len: u64) -> std::io::Result<Vec<u64>> {
    let pages = len.div_ceil(PAGE) as usize;
    let mut bytes = vec![0u8; pages * 8];
    pagemap.read_exact_at(&mut bytes, addr / PAGE * 8)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// A pagemap entry in a few letters: `P+WP`, `P`, `swap+WP`, `-`.
pub fn page_bits(e: u64) -> String {
    let mut s = String::from(if e & PM_PRESENT != 0 {
        "P"
    } else if e & PM_SWAPPED != 0 {
        "swap"
    } else {
        "-"
    });
    if e & PM_UFFD_WP != 0 {
        s.push_str("+WP");
    }
    s
}

/// Per-thread findings of one round's store phase.
#[derive(Default)]
struct ThreadReport {
    stores: u64,
    loads: u64,
    readback_errors: u64,
    reader_errors: u64,
    stalls: u64,
    notes: Vec<String>,
}

impl ThreadReport {
    fn note(&mut self, max: usize, s: impl FnOnce() -> String) {
        if self.notes.len() < max {
            self.notes.push(s());
        }
    }
}

/// Checks a batch timer: a stall if `TIMED_BATCH` accesses took longer
/// than `limit`.
fn check_batch(
    t: &mut Instant,
    limit: Duration,
    rep: &mut ThreadReport,
    what: impl Fn() -> String,
) {
    let e = t.elapsed();
    if e > limit {
        rep.stalls += 1;
        rep.note(4, || {
            format!("  STALL: {TIMED_BATCH} accesses of {} took {e:?}", what())
        });
    }
    *t = Instant::now();
}

/// The words a file word may hold after the round: each writer's last
/// store to it, or (nobody stored) the previous value.
fn allowed(w: usize, lasts: &[Vec<u64>], committed: &[u64]) -> Vec<u64> {
    let v: Vec<u64> = lasts.iter().map(|l| l[w]).filter(|&x| x != 0).collect();
    if v.is_empty() {
        vec![committed[w]]
    } else {
        v
    }
}

fn ok_word(w: usize, got: u64, lasts: &[Vec<u64>], committed: &[u64]) -> bool {
    let mut any = false;
    for l in lasts {
        if l[w] != 0 {
            if l[w] == got {
                return true;
            }
            any = true;
        }
    }
    !any && committed[w] == got
}

/// Runs `variant` for `cfg.duration` (rounds already started finish);
/// `progress` is updated for a watchdog. Err: the run could not start
/// (pager, file, mapping).
pub fn run(cfg: &Config, variant: Variant, progress: &Progress) -> Result<Outcome, String> {
    assert!(
        (1..=MAX_WRITERS).contains(&cfg.writers),
        "1 to {MAX_WRITERS} writers"
    );
    let started = Instant::now();
    progress.set(0, 0);
    let nwords = (cfg.file_bytes / 8) as usize;
    let plan = Plan::new(cfg.seed, nwords as u64, cfg.stride_words);
    let anon_words = (cfg.anon_bytes / 8) as usize;
    let anon_plan = Plan::new(cfg.seed ^ 0xA11, anon_words.max(1) as u64, cfg.stride_words);

    // The file: every word says "initial value of word w".
    let path = cfg.dir.join(format!("soak-{}.data", std::process::id()));
    let mut committed: Vec<u64> = (0..nwords as u64)
        .map(|w| encode(0, INIT_THREAD, w))
        .collect();
    {
        let mut f = File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
        let bytes: Vec<u8> = committed.iter().flat_map(|w| w.to_ne_bytes()).collect();
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    struct Unlink(PathBuf);
    impl Drop for Unlink {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _unlink = Unlink(path.clone());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(cfg.self_test)
        .open(&path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    let pagemap =
        File::open("/proc/self/pagemap").map_err(|e| format!("open /proc/self/pagemap: {e}"))?;

    let pager = Pager::builder()
        .budget(cfg.budget)
        .fault_mode(variant.mode())
        .handler_threads(cfg.handler_threads.max(variant.shards))
        .uffd_shards(variant.shards)
        .swap_dir(&cfg.dir)
        .huge_runs(cfg.huge_runs)
        .build()
        .map_err(|e| format!("pager: {}", upager::error_chain(&e)))?;
    let region = pager
        .map_file(&path, &MapOptions::new().folio(cfg.folio).writable(true))
        .map_err(|e| format!("map {}: {}", path.display(), upager::error_chain(&e)))?;
    let anon = if variant.anon {
        Some(
            pager
                .map_anonymous(cfg.anon_bytes, &MapOptions::new().folio(cfg.folio))
                .map_err(|e| format!("map anonymous: {}", upager::error_chain(&e)))?,
        )
    } else {
        None
    };

    let mut out = Outcome {
        variant: variant.to_string(),
        effective_shards: pager.uffd_shards(),
        ..Outcome::default()
    };
    let mut lasts: Vec<Vec<u64>> = vec![vec![0u64; nwords]; cfg.writers];
    let mut anon_model = vec![0u64; if variant.anon { anon_words } else { 0 }];
    let mut times: VecDeque<Duration> = VecDeque::new();
    let mut all_times: Vec<Duration> = Vec::new();
    let mut next_progress = cfg.progress.map(|p| Instant::now() + p);
    let nreaders = if variant.readers { cfg.readers } else { 0 };
    let words = region.words();
    let mut fbytes = vec![0u8; nwords * 8];

    // What a word's page and folio look like right now (for a finding
    // made while the threads run, before anything moves on).
    let word_state = |r: &Region, w: usize| -> String {
        let off = w as u64 * 8;
        let page = match read_pagemap(&pagemap, r.as_ptr() as u64 + off, 8) {
            Ok(e) => page_bits(e[0]),
            Err(e) => format!("pagemap unreadable: {e}"),
        };
        format!(
            "page now {page}, folio {}: {}",
            off / r.folio_size(),
            dump_trace(r, off)
        )
    };
    let file_diag = &|w: usize| word_state(&region, w);

    let mut round = 0u64;
    while started.elapsed() < cfg.duration && round < (1 << 24) - 1 {
        round += 1;
        let t0 = Instant::now();
        progress.set(round, 1);
        let mut reports: Vec<String> = Vec::new();

        // Stores (and loads), all threads released together.
        // Readers and the anonymous writer stop once every file writer
        // has reached the tail (the 1 MiB window), so the window's folios
        // are still dirty when the flush comes.
        let done = AtomicBool::new(false);
        let in_tail = std::sync::atomic::AtomicUsize::new(0);
        let barrier =
            Barrier::new(cfg.writers + usize::from(variant.anon) + nreaders + cfg.scanners);
        let committed_ref = &committed;
        let (wreps, areps, rreps) = std::thread::scope(|s| {
            let mut writers = Vec::new();
            for (t, last) in lasts.iter_mut().enumerate() {
                let barrier = &barrier;
                let tail = Tail {
                    arrived: &in_tail,
                    writers: cfg.writers,
                    done: &done,
                };
                writers.push(s.spawn(move || {
                    store_phase(
                        words,
                        &plan,
                        round,
                        t as u64,
                        last,
                        cfg.stall,
                        barrier,
                        Some(tail),
                        None,
                        file_diag,
                    )
                }));
            }
            let anon_h = anon.as_ref().map(|a| {
                let model = &mut anon_model;
                let (barrier, done) = (&barrier, &done);
                let diag = move |w: usize| word_state(a, w);
                // Stops with the file writers, like the readers: the
                // flush must find the file's last stores dirty, not pushed
                // out by pressure that outlasts them.
                s.spawn(move || {
                    store_phase(
                        a.words(),
                        &anon_plan,
                        round,
                        ANON_THREAD,
                        model,
                        cfg.stall,
                        barrier,
                        None,
                        Some(done),
                        &diag,
                    )
                })
            });
            // Readers first, then scanners (reported as readers too).
            let readers: Vec<_> = (0..nreaders + cfg.scanners)
                .map(|k| {
                    let (barrier, done) = (&barrier, &done);
                    let seed = cfg.seed ^ (round << 8) ^ k as u64;
                    let scan = k >= nreaders;
                    s.spawn(move || {
                        read_phase(
                            words,
                            &plan,
                            round,
                            committed_ref,
                            (seed, scan),
                            cfg.stall,
                            barrier,
                            done,
                            file_diag,
                        )
                    })
                })
                .collect();
            let w: Vec<ThreadReport> = writers
                .into_iter()
                .map(|h| h.join().expect("writer panicked"))
                .collect();
            done.store(true, Relaxed);
            let a = anon_h.map(|h| h.join().expect("anonymous writer panicked"));
            let r: Vec<ThreadReport> = readers
                .into_iter()
                .map(|h| h.join().expect("reader panicked"))
                .collect();
            (w, a, r)
        });
        for (who, rep) in wreps
            .iter()
            .enumerate()
            .map(|(t, r)| (format!("writer t{t}"), r))
            .chain(areps.iter().map(|r| ("anon writer".to_string(), r)))
            .chain(
                rreps
                    .iter()
                    .enumerate()
                    .map(|(k, r)| (format!("reader {k}"), r)),
            )
        {
            out.stores += rep.stores;
            out.loads += rep.loads;
            out.readback_errors += rep.readback_errors;
            out.reader_errors += rep.reader_errors;
            out.stalls += rep.stalls;
            for n in &rep.notes {
                reports.push(format!("  {who}: {n}"));
            }
        }
        let stores_end = t0.elapsed();

        // Before the flush, with nothing running but the reclaimer: a
        // present page's words are in memory, a non-present page's in the
        // file (an eviction writes back before it unmaps), so every word
        // can be checked without a fault. A word wrong here was lost while
        // the threads ran, not by the flush.
        let pre_entries = read_pagemap(&pagemap, region.as_ptr() as u64, region.len() as u64)
            .map_err(|e| format!("read /proc/self/pagemap: {e}"))?;
        // The self-test's first damage: a sweep store whose folio was
        // evicted (so it is in the file) undone in the file.
        let mut undone = None;
        if cfg.self_test {
            let w = (0..plan.stores())
                .step_by(2)
                .map(|i| plan.target(round, 0, i).expect("in plan") as usize)
                .find(|&w| pre_entries[w * 8 / PAGE as usize] & PM_PRESENT == 0)
                .ok_or("self-test: every page present")?;
            file.write_all_at(&committed[w].to_ne_bytes(), w as u64 * 8)
                .map_err(|e| format!("self-test pwrite: {e}"))?;
            undone = Some(w);
            println!("self-test: word {w} undone in the file");
        }
        file.read_exact_at(&mut fbytes, 0)
            .map_err(|e| format!("pread {}: {e}", path.display()))?;
        let page_words = (PAGE / 8) as usize;
        let mut pre_lost: Vec<(usize, bool, u64)> = Vec::new();
        for (p, &e) in pre_entries.iter().enumerate() {
            let present = e & PM_PRESENT != 0;
            for w in p * page_words..((p + 1) * page_words).min(nwords) {
                let v = if present {
                    words[w].load(Relaxed)
                } else {
                    u64::from_ne_bytes(fbytes[w * 8..w * 8 + 8].try_into().expect("8 bytes"))
                };
                if !ok_word(w, v, &lasts, &committed) {
                    pre_lost.push((w, present, v));
                }
            }
        }
        if !pre_lost.is_empty() {
            reports.push(format!(
                "  LOST BEFORE FLUSH: {} word(s) wrong after the writers joined (present pages: the region; others: the file)",
                pre_lost.len()
            ));
            for &(w, present, v) in pre_lost.iter().take(cfg.max_reports) {
                reports.push(format!(
                    "    word {w} (folio {}): {} {} , expected {}",
                    w / (cfg.folio / 8) as usize,
                    if present {
                        "region (present page)"
                    } else {
                        "file (page not present)"
                    },
                    plan.describe(v, w as u64),
                    allowed(w, &lasts, &committed)
                        .into_iter()
                        .map(|x| plan.describe(x, w as u64))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ));
            }
        }
        out.lost_before_flush += pre_lost.len() as u64;

        // Flush: every store above must reach the file.
        progress.set(round, 2);
        out.flushed_bytes += pager.stats().dirty_bytes;
        if let Err(e) = region.flush() {
            out.flush_errors += 1;
            reports.push(format!("  FLUSH FAILED: {}", upager::error_chain(&e)));
        }
        let flush_end = t0.elapsed();

        // The self-test's second damage: a folio left writable after the
        // flush.
        let mut pinned = None;
        if let Some(w) = undone {
            let f = (w as u64 * 8 / cfg.folio + 1) % (cfg.file_bytes / cfg.folio);
            let off = f * cfg.folio;
            region
                .pin(off, cfg.folio, true)
                .map_err(|e| format!("self-test pin: {}", upager::error_chain(&e)))?;
            pinned = Some(off);
            println!("self-test: folio {f} pinned for writing");
        }
        // a) the file against the model.
        progress.set(round, 3);
        file.read_exact_at(&mut fbytes, 0)
            .map_err(|e| format!("pread {}: {e}", path.display()))?;
        let fwords: Vec<u64> = fbytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let lost: Vec<usize> = (0..nwords)
            .filter(|&w| !ok_word(w, fwords[w], &lasts, &committed))
            .collect();
        // b) every present page of the region: write-protected, and right.
        let entries = read_pagemap(&pagemap, region.as_ptr() as u64, region.len() as u64)
            .map_err(|e| format!("read /proc/self/pagemap: {e}"))?;
        let mut not_wp: Vec<usize> = Vec::new();
        let mut region_bad: Vec<usize> = Vec::new();
        for (p, &e) in entries.iter().enumerate() {
            if e & PM_PRESENT == 0 {
                continue;
            }
            out.pages_checked += 1;
            if e & PM_UFFD_WP == 0 {
                not_wp.push(p);
            }
            let first = p * page_words;
            for (w, x) in words.iter().enumerate().skip(first).take(page_words) {
                if !ok_word(w, x.load(Relaxed), &lasts, &committed) {
                    region_bad.push(w);
                }
            }
        }
        // c) the anonymous region against its model.
        let mut anon_bad: Vec<usize> = Vec::new();
        if let Some(a) = &anon {
            if cfg.self_test {
                // The self-test's third damage: a word of the anonymous
                // region changed behind its model's back.
                a.words()[8].store(encode(0, ANON_THREAD, 8), Relaxed);
                println!("self-test: anonymous word 8 changed");
            }
            for (w, (x, &m)) in a.words().iter().zip(&anon_model).enumerate() {
                if x.load(Relaxed) != m {
                    anon_bad.push(w);
                }
            }
        }

        // Reports.
        let folio_words = (cfg.folio / 8) as usize;
        if !lost.is_empty() {
            out.words_lost += lost.len() as u64;
            out.rounds_with_loss += 1;
            let mut by_folio: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &w in &lost {
                by_folio.entry(w / folio_words).or_default().push(w);
            }
            out.folios_lost += by_folio.len() as u64;
            reports.push(format!(
                "  LOST {} words in {} folio(s): the file after flush lacks their last store",
                lost.len(),
                by_folio.len()
            ));
            let mut detailed = 0;
            for (folio, ws) in &by_folio {
                let mut writers: Vec<String> = ws
                    .iter()
                    .flat_map(|&w| allowed(w, &lasts, &committed))
                    .map(|v| match decode(v).thread {
                        INIT_THREAD => "nobody (previous value)".to_string(),
                        t => format!("t{t}"),
                    })
                    .collect();
                writers.sort_unstable();
                writers.dedup();
                reports.push(format!(
                    "  folio {folio} (bytes {:#x}..{:#x}): {} word(s) lost, expected stores of {}; pages now [{}]; trace: {}",
                    *folio as u64 * cfg.folio,
                    (*folio as u64 + 1) * cfg.folio,
                    ws.len(),
                    writers.join(", "),
                    folio_pages(&pagemap, &region, *folio, cfg.folio),
                    dump_trace(&region, *folio as u64 * cfg.folio),
                ));
                for &w in ws {
                    if detailed >= cfg.max_reports {
                        break;
                    }
                    detailed += 1;
                    reports.push(explain_word(
                        w, fwords[w], &lasts, &committed, &plan, words, &pagemap,
                    ));
                }
            }
        }
        if !not_wp.is_empty() {
            out.wp_violations += not_wp.len() as u64;
            let folio_pages_n = (cfg.folio / PAGE) as usize;
            let mut folios: Vec<usize> = not_wp.iter().map(|p| p / folio_pages_n).collect();
            folios.dedup();
            reports.push(format!(
                "  WP-BIT: {} present page(s) of the file region without uffd-wp after flush, in folio(s) {:?}",
                not_wp.len(),
                &folios[..folios.len().min(32)]
            ));
            for &f in folios.iter().take(cfg.max_reports) {
                reports.push(format!(
                    "    folio {f}: pages now [{}]; trace: {}",
                    folio_pages(&pagemap, &region, f, cfg.folio),
                    dump_trace(&region, f as u64 * cfg.folio)
                ));
            }
        }
        if !region_bad.is_empty() {
            out.region_mismatches += region_bad.len() as u64;
            reports.push(format!(
                "  REGION: {} word(s) of present pages differ from the model after flush",
                region_bad.len()
            ));
            for &w in region_bad.iter().take(cfg.max_reports) {
                reports.push(explain_word(
                    w, fwords[w], &lasts, &committed, &plan, words, &pagemap,
                ));
            }
        }
        if !anon_bad.is_empty() {
            out.anon_lost += anon_bad.len() as u64;
            let a = anon.as_ref().expect("anon");
            let aw = a.words();
            reports.push(format!(
                "  ANON: {} word(s) of the anonymous region differ from its model",
                anon_bad.len()
            ));
            for &w in anon_bad.iter().take(cfg.max_reports) {
                let off = w as u64 * 8;
                reports.push(format!(
                    "    anon word {w} (folio {}): expected {} | found {}; trace: {}",
                    off / cfg.folio,
                    anon_plan.describe(anon_model[w], w as u64),
                    anon_plan.describe(aw[w].load(Relaxed), w as u64),
                    dump_trace(a, off)
                ));
            }
        }

        if let Some(off) = pinned {
            region
                .unpin(off, cfg.folio)
                .map_err(|e| format!("self-test unpin: {}", upager::error_chain(&e)))?;
        }
        // The file is the truth from here on (a lost word stays lost, and
        // the next round checks against what is there).
        committed.copy_from_slice(&fwords);
        for l in &mut lasts {
            l.fill(0);
        }
        // The model differs from the anonymous region only where c) found
        // it (reading the rest again would fault it all in once more).
        if let Some(a) = &anon {
            let aw = a.words();
            for &w in &anon_bad {
                anon_model[w] = aw[w].load(Relaxed);
            }
        }

        // Stall: a round far slower than the recent ones.
        let dt = t0.elapsed();
        if times.len() >= 8 {
            let mut v: Vec<Duration> = times.iter().copied().collect();
            v.sort_unstable();
            let median = v[v.len() / 2];
            if dt > median + cfg.stall {
                out.stalls += 1;
                reports.push(format!(
                    "  STALL: round took {dt:?} (stores {stores_end:?}, flush {:?}, check {:?}); median of the last {} rounds {median:?}",
                    flush_end - stores_end,
                    dt - flush_end,
                    v.len()
                ));
            }
        }
        times.push_back(dt);
        if times.len() > 16 {
            times.pop_front();
        }
        all_times.push(dt);
        out.rounds = round;
        if !reports.is_empty() {
            let mut text = format!("round {round} [{variant}]:");
            for r in &reports {
                text.push('\n');
                text.push_str(r);
            }
            println!("{text}");
            out.reports.push(text);
        }
        if let Some(next) = next_progress.as_mut() {
            if Instant::now() >= *next {
                *next += cfg.progress.unwrap_or_default();
                let s = pager.stats();
                eprintln!(
                    "upager-soak: {variant}: round {round}, {:.0}s, last round {dt:.0?}, lost {} words, wp violations {}, stalls {}, evictions {}, writebacks {}",
                    started.elapsed().as_secs_f64(),
                    out.words_lost,
                    out.wp_violations,
                    out.stalls,
                    s.evictions,
                    s.writebacks
                );
            }
        }
        if (cfg.stop_on_failure && out.failed()) || cfg.self_test {
            break;
        }
    }

    progress.set(round, 4);
    let s = pager.stats();
    let mut c = String::new();
    for name in [
        "faults_missing",
        "faults_wp",
        "faults_in_thread",
        "faults_handed_off",
        "fills",
        "fills_readahead",
        "readahead_async",
        "evictions",
        "writebacks",
        "wp_unprotects",
        "thp_fills",
        "thp_fill_raced",
        "thp_evictions",
        "thp_recycled",
        "resident_peak_bytes",
    ] {
        let _ = write!(c, "{name} {} ", s.get(name).unwrap_or(0));
    }
    out.counters = c.trim_end().to_string();
    all_times.sort_unstable();
    out.median_round = all_times
        .get(all_times.len() / 2)
        .copied()
        .unwrap_or_default();
    out.max_round = all_times.last().copied().unwrap_or_default();
    drop(anon);
    drop(region);
    drop(pager);
    out.elapsed = started.elapsed();
    Ok(out)
}

/// One word of a report: where it is, what was expected, what the file
/// and the region hold.
fn explain_word(
    w: usize,
    in_file: u64,
    lasts: &[Vec<u64>],
    committed: &[u64],
    plan: &Plan,
    words: &[AtomicU64],
    pagemap: &File,
) -> String {
    let off = w as u64 * 8;
    // The page's pagemap bits before the load below (which faults a
    // non-present page in from the file).
    let page = match read_pagemap(pagemap, words.as_ptr() as u64 + off, 8) {
        Ok(e) => page_bits(e[0]),
        Err(e) => format!("pagemap unreadable: {e}"),
    };
    let expected: Vec<String> = allowed(w, lasts, committed)
        .into_iter()
        .map(|v| plan.describe(v, w as u64))
        .collect();
    format!(
        "    word {w} (byte {off:#x}, page {} +{:#x}): expected {} | file {} | region ({page}) {} | before this round {}",
        off / PAGE,
        off % PAGE,
        expected.join(" or "),
        plan.describe(in_file, w as u64),
        plan.describe(words[w].load(Relaxed), w as u64),
        plan.describe(committed[w], w as u64),
    )
}

/// The pagemap bits of a folio's pages, e.g. `P+WP P+WP - -`.
fn folio_pages(pagemap: &File, region: &Region, folio: usize, folio_bytes: u64) -> String {
    let addr = region.as_ptr() as u64 + folio as u64 * folio_bytes;
    match read_pagemap(pagemap, addr, folio_bytes) {
        Ok(e) => e
            .iter()
            .map(|&x| page_bits(x))
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("pagemap unreadable: {e}"),
    }
}

/// Where the file writers count themselves into the round's tail.
struct Tail<'a> {
    arrived: &'a std::sync::atomic::AtomicUsize,
    writers: usize,
    done: &'a AtomicBool,
}

/// One writer's stores of a round (see the module doc), with read-back
/// of the store `READBACK_LAG` earlier. `last[w]` becomes the thread's
/// last store to word `w`. A file writer (`tail`) counts itself in when
/// it reaches the last eighth, and the last one in sets `done`; the
/// anonymous writer (`stop`) ends early once `done` is set.
#[allow(clippy::too_many_arguments)]
fn store_phase(
    words: &[AtomicU64],
    plan: &Plan,
    round: u64,
    thread: u64,
    last: &mut [u64],
    stall: Duration,
    barrier: &Barrier,
    tail: Option<Tail<'_>>,
    stop: Option<&AtomicBool>,
    diag: &(dyn Fn(usize) -> String + Sync),
) -> ThreadReport {
    let mut rep = ThreadReport::default();
    let mut n = plan.stores();
    let tail_start = plan.stores() / 8 * 7;
    barrier.wait();
    let mut timer = Instant::now();
    for i in 0..plan.stores() {
        if i % 64 == 0 && stop.is_some_and(|s| s.load(Relaxed)) {
            n = i;
            break;
        }
        if i == tail_start {
            if let Some(t) = &tail {
                if t.arrived.fetch_add(1, Relaxed) + 1 == t.writers {
                    t.done.store(true, Relaxed);
                }
            }
        }
        let w = plan.target(round, thread, i).expect("in plan") as usize;
        let v = encode(round, thread, i);
        words[w].store(v, Relaxed);
        last[w] = v;
        if i >= READBACK_LAG {
            let j = i - READBACK_LAG;
            let wj = plan.target(round, thread, j).expect("in plan") as usize;
            let got = words[wj].load(Relaxed);
            let mine = last[wj];
            // Coherence: after my store, a load sees it or a later store,
            // and later stores to this word this round are other threads'.
            if got != mine
                && !(decode(got).thread != thread && plan.is_store_to(got, wj as u64, round))
            {
                rep.readback_errors += 1;
                rep.note(8, || {
                    format!(
                        "READ-BACK: word {wj} (byte {:#x}) holds {} after this thread stored {} (store #{i} now); {}",
                        wj * 8,
                        plan.describe(got, wj as u64),
                        plan.describe(mine, wj as u64),
                        diag(wj)
                    )
                });
            }
        }
        if i % TIMED_BATCH == TIMED_BATCH - 1 {
            check_batch(&mut timer, stall, &mut rep, || {
                format!("stores up to #{i} (word {w}, byte {:#x})", w * 8)
            });
        }
    }
    rep.stores = n;
    rep
}

/// One reader's loads until the writers are done: random words, or with
/// `scan` one word per 4 KiB page in order from a random page on,
/// wrapping around (a scanner).
#[allow(clippy::too_many_arguments)]
fn read_phase(
    words: &[AtomicU64],
    plan: &Plan,
    round: u64,
    committed: &[u64],
    (seed, scan): (u64, bool),
    stall: Duration,
    barrier: &Barrier,
    done: &AtomicBool,
    diag: &(dyn Fn(usize) -> String + Sync),
) -> ThreadReport {
    let mut rep = ThreadReport::default();
    let mut rng = Rng::new(seed);
    let n = words.len() as u64;
    const PAGE_WORDS: u64 = 512;
    let mut next = rng.below(n) / PAGE_WORDS * PAGE_WORDS;
    barrier.wait();
    let mut timer = Instant::now();
    while !done.load(Relaxed) {
        for _ in 0..TIMED_BATCH {
            let w = if scan {
                let w = next as usize;
                next = (next + PAGE_WORDS) % n;
                w
            } else {
                rng.below(n) as usize
            };
            let got = words[w].load(Relaxed);
            if got != committed[w] && !plan.is_store_to(got, w as u64, round) {
                rep.reader_errors += 1;
                rep.note(8, || {
                    format!(
                        "READER: word {w} (byte {:#x}) holds {}; before this round it held {}; {}",
                        w * 8,
                        plan.describe(got, w as u64),
                        plan.describe(committed[w], w as u64),
                        diag(w)
                    )
                });
            }
        }
        rep.loads += TIMED_BATCH;
        check_batch(&mut timer, stall, &mut rep, || "loads".to_string());
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_decode_to_who_stored_them_where() {
        let plan = Plan::new(7, 4 << 20, 509);
        for (r, t, i) in [
            (1, 0, 0),
            (37, 1, 1234),
            ((1 << 24) - 1, 13, plan.stores() - 1),
        ] {
            let v = encode(r, t, i);
            assert_ne!(v, 0);
            assert_eq!(
                decode(v),
                Stored {
                    round: r,
                    thread: t,
                    seq: i
                }
            );
            let w = plan.target(r, t, i).unwrap();
            assert!(w < 4 << 20);
            assert!(plan.is_store_to(v, w, r));
            assert!(!plan.is_store_to(v, w, r + 1));
            assert!(plan.describe(v, w).contains("#"));
            assert!(plan.describe(v, w ^ 1).contains("MEANT FOR WORD"));
        }
        assert_eq!(plan.target(0, INIT_THREAD, 99), Some(99));
        assert_eq!(plan.target(3, 0, plan.stores()), None);
        assert!(plan.describe(0, 5).contains("zero"));
    }

    #[test]
    fn the_sweep_is_shared_and_distinct_per_round() {
        let plan = Plan::new(1, 1 << 20, 509);
        for r in 1..20 {
            let a: Vec<u64> = (0..plan.stores())
                .step_by(2)
                .map(|i| plan.target(r, 0, i).unwrap())
                .collect();
            let b: Vec<u64> = (0..plan.stores())
                .step_by(2)
                .map(|i| plan.target(r, 1, i).unwrap())
                .collect();
            assert_eq!(a, b, "both writers sweep the same words");
            let mut s = a.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), a.len(), "a sweep stores each word once");
            // 16 KiB folios: every folio gets sweep stores.
            let folios: std::collections::HashSet<u64> = a.iter().map(|w| w / 2048).collect();
            assert_eq!(folios.len(), (1 << 20) / 2048);
        }
    }

    #[test]
    fn allowed_values_are_either_writers_last_or_the_old_value() {
        let committed = vec![10, 20, 30];
        let lasts = vec![vec![0, 1, 2], vec![0, 0, 3]];
        assert!(ok_word(0, 10, &lasts, &committed));
        assert!(!ok_word(0, 11, &lasts, &committed));
        assert!(ok_word(1, 1, &lasts, &committed));
        assert!(!ok_word(1, 20, &lasts, &committed), "a store replaced it");
        assert!(ok_word(2, 2, &lasts, &committed) && ok_word(2, 3, &lasts, &committed));
        assert!(!ok_word(2, 30, &lasts, &committed));
        assert_eq!(allowed(2, &lasts, &committed), vec![2, 3]);
    }

    #[test]
    fn variants_parse_and_print() {
        let all = Variant::all();
        assert_eq!(all.len(), 16);
        for v in &all {
            assert_eq!(v.to_string().parse::<Variant>(), Ok(*v));
        }
        assert_eq!(Variant::ci().len(), 4);
        assert_eq!(Variant::parse_list("ci,all").unwrap().len(), 20);
        assert!(Variant::parse_list("handlers/3/anon/readers").is_err());
        assert!(Variant::parse_list("").is_err());
        assert_eq!(page_bits(PM_PRESENT | PM_UFFD_WP), "P+WP");
        assert_eq!(page_bits(0), "-");
    }
}
