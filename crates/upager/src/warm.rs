//! Warm starts: the order a file region's folios are first needed, recorded
//! beside the file, and replayed as prefetch the next time it is mapped
//! (REAP, ASPLOS '21, for function snapshots; here for any file region).
//! This module ties a region to its trace ([`Warm`]); the mechanisms live
//! in `warm_format` (the trace file), `warm_record` (the recorder) and
//! `warm_replay` (the replayer).
//!
//! Record ([`WarmStart::Record`], or [`WarmStart::Auto`] without a usable
//! trace): each folio's first fill appends its index to the region's trace
//! ([`Warm::filled`], async-signal-safe). When the region is unmapped,
//! after its flush, the trace is written beside the file ([`Warm::save`]);
//! a failure is logged, never an error of the unmap.
//!
//! Replay ([`WarmStart::Auto`] with a trace whose header matches the file
//! now; a stale one is ignored with a log line and a new one recorded):
//! the prefetch thread reads the folios in recorded order, a window at a
//! time, paced by the program's faults ([`Warm::wants_next`]). A replaying
//! region records the program's own fills aside (not replay's:
//! `Ctx::replaying`), and when replay stopped that record replaces the
//! trace at unmap: the next map replays this run's order. One replay
//! thread reading everything had left the program waiting on it with a
//! CPU idle: 0.81-0.83x of on demand for a model's layers; 1.06-1.08x with
//! the runs left to readahead (docs/benchmarks.md).
//!
//! Counters: `replay_reads`, `replay_hits`, `replay_wasted` (`warm_replay`).
//!
//! Lock order: none (atomics; the prefetch thread alone steps a replay).
//!
//! Uses: `config`, `warm_format`, `warm_record`, `warm_replay` (the fill,
//! the prefetch thread and the region's teardown call it).

use std::io;

use crate::config::WarmStart;
use crate::warm_format::{decode, encode, Home, Identity};
use crate::warm_record::{Recorder, RECORD_CHUNK};
use crate::warm_replay::Replayer;

/// A region's warm start: where its trace lives and what it does with it.
pub(crate) struct Warm {
    home: Home,
    folio: u64,
    offset: u64,
    len: u64,
    job: Job,
    /// A replaying region's record of the program's own fills (not
    /// replay's): saved instead of the replayed trace if the program left
    /// it (replay stopped), so the next map replays what this run needed.
    standby: Option<Recorder>,
}

/// Recording a trace, or replaying one.
pub(crate) enum Job {
    Record(Recorder),
    Replay(Replayer),
}

impl Warm {
    /// The warm start of a region `(folio, offset, len)` of the data in
    /// `home`, as `how` asks: a replay of the trace kept there if it is
    /// usable, else a recording.
    pub(crate) fn open(
        how: WarmStart,
        home: Home,
        folio: u64,
        offset: u64,
        len: u64,
        nfolios: usize,
        window_bytes: u64,
    ) -> io::Result<Warm> {
        let trace = home.describe();
        let mut job = None;
        if how == WarmStart::Auto {
            let now = Identity::of(&home, folio, offset, len)?;
            match home.load().map(|b| b.map(|b| decode(&b))) {
                Ok(Some(Some((id, t)))) if id == now => {
                    log::debug!(
                        "{trace}: replaying {} folios in recorded order",
                        t.order.len()
                    );
                    let max = (window_bytes / folio).max(4) as usize;
                    job = Some(Job::Replay(Replayer::new(t.order, nfolios, max / 4, max)?));
                }
                Ok(Some(Some(_))) => log::info!(
                    "{trace}: the trace is stale (the data or the region changed since it was \
                     recorded): not replayed; recording a new one"
                ),
                Ok(Some(None)) => {
                    log::info!("{trace}: not a trace (damaged?): recording a new one")
                }
                Ok(None) => {}
                Err(e) => log::info!("{trace}: cannot read the trace ({e}): recording a new one"),
            }
        }
        let (job, standby) = match job {
            Some(j) => (j, Some(Recorder::new(nfolios)?)),
            None => (Job::Record(Recorder::new(nfolios)?), None),
        };
        Ok(Warm {
            home,
            folio,
            offset,
            len,
            job,
            standby,
        })
    }

    /// Folios `idx .. idx + n` were filled (a fault, its readahead, a
    /// prefetch; `by_replay`: a replay's batch). A recording region records
    /// them; a replaying one records the program's own fills aside
    /// (`standby`). Async-signal-safe.
    pub(crate) fn filled(&self, idx: usize, n: usize, by_replay: bool) {
        let rec = match (&self.job, &self.standby) {
            (Job::Record(rec), _) => rec,
            (Job::Replay(_), Some(rec)) if !by_replay => rec,
            _ => return,
        };
        let mut k = idx;
        while k < idx + n {
            let m = (idx + n - k).min(RECORD_CHUNK);
            rec.record_run(k, m);
            k += m;
        }
    }

    /// A replay leaves the trace's sequential runs of at least `min`
    /// folios to readahead ([`Replayer::leave_runs_to_readahead`]).
    pub(crate) fn leave_runs_to_readahead(mut self, min: usize) -> Warm {
        if let Job::Replay(rp) = &mut self.job {
            rp.leave_runs_to_readahead(min);
        }
        self
    }

    /// The replay, if this region replays a trace.
    pub(crate) fn replay(&self) -> Option<&Replayer> {
        match &self.job {
            Job::Replay(rp) => Some(rp),
            Job::Record(_) => None,
        }
    }

    /// Folio `idx` is being evicted: whether it counts as replay wasted.
    pub(crate) fn evicted(&self, idx: usize) -> bool {
        self.replay().is_some_and(|rp| rp.on_evict(idx))
    }

    /// A fault (not a prefetch) filled folio `idx`: whether a replay asks
    /// the prefetch thread for its next window. Async-signal-safe.
    pub(crate) fn wants_next(&self, idx: usize) -> bool {
        self.replay().is_some_and(|rp| rp.on_fault(idx))
    }

    /// Writes the recorded trace beside the file. A replaying region keeps
    /// the trace it replayed, unless the program left it (replay stopped):
    /// then the program's own fills of this run (`standby`) replace it, so
    /// a program now on other inputs does not replay and stop at every
    /// map. (Folios replay read that the program then used before it left
    /// are not in that record: at most replay's first windows.) Logs a
    /// failure.
    pub(crate) fn save(&self) {
        let rec = match (&self.job, &self.standby) {
            (Job::Record(rec), _) => rec,
            (Job::Replay(rp), Some(rec)) if rp.left() => rec,
            _ => return,
        };
        let t = rec.trace();
        if t.order.is_empty() {
            return;
        }
        if matches!(self.job, Job::Replay(_)) {
            log::info!(
                "{}: the program left the replayed trace: recorded anew from this run's faults \
                 ({} folios)",
                self.home.describe(),
                t.order.len()
            );
        }
        let r = Identity::of(&self.home, self.folio, self.offset, self.len)
            .and_then(|id| self.home.save(&encode(&id, &t)));
        let trace = self.home.describe();
        match r {
            Ok(()) => log::debug!("{trace}: {} folios recorded", t.order.len()),
            Err(e) => log::warn!(
                "{trace}: the warm-start trace could not be written ({e}); the next map starts cold"
            ),
        }
    }
}
