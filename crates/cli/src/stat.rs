//! `upager stat`: a region's residency as a picture, after each step of a
//! short workload (scan, writes, pageout, prefetch, discard), with the
//! markers counted. One character per group of folios; the character is
//! the group's most urgent state: `#` dirty, `+` clean, `~` busy,
//! `.` evicted (contents in the store: the marker), space never touched.
//! With 2 MiB folios it also says how much of the region the view maps
//! with huge pages (`Region::huge_bytes`). With `--store URL` the region
//! is a dataset's or an object's (Redis Cluster, S3), mapped read-only
//! with its store's defaults: the workload reads instead of writing, and
//! the store's counters (GETs, bytes) follow the pictures.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use upager::{format_size, FaultMode, MapOptions, Pager, Region, Residency};

use crate::datasets::{AnyUrl, AnyUrlParser};
use crate::{fault_mode_arg, size_arg};

/// Size of the anonymous region shown by default.
const SIZE: u64 = 256 << 20;

/// Folio of the anonymous region by default.
const FOLIO: u64 = 64 << 10;

/// Options of `upager stat`.
#[derive(clap::Args, Debug, Clone)]
pub struct StatArgs {
    /// Size of the anonymous region shown [default: 256M].
    #[arg(long, value_parser = size_arg, conflicts_with = "store")]
    pub size: Option<u64>,
    /// Memory budget.
    #[arg(long, default_value = "64M", value_parser = size_arg)]
    pub budget: u64,
    /// Folio size [default: 64K; with --store, the store's: a Redis
    /// dataset's chunk, 64K for an S3 object].
    #[arg(long, value_parser = size_arg)]
    pub folio: Option<u64>,
    /// Show the region of a dataset or object instead of an anonymous one,
    /// mapped read-only (nothing is written): redis-cluster://HOST:PORT/NAME
    /// (uploaded with `upager load`), s3://BUCKET/KEY (an object) or
    /// s3://BUCKET/NAME/ (a dataset); credentials from the environment or
    /// ~/.aws, as `upager load` reads them.
    #[arg(long, value_name = "URL", value_parser = AnyUrlParser)]
    pub store: Option<AnyUrl>,
    /// Characters per picture line.
    #[arg(long, default_value_t = 64)]
    pub width: usize,
    /// Picture lines.
    #[arg(long, default_value_t = 4)]
    pub lines: usize,
    /// List this user's page pools instead (the one copy of a file's
    /// pages that processes share, UPAGER_POOL=on): each one's file, budget,
    /// bytes resident, processes and counters.
    #[arg(long, conflicts_with_all = ["store", "size"])]
    pub pools: bool,
    /// How the pager resolves faults [default: $UPAGER_FAULT_MODE, else
    /// handlers where the process may open /dev/userfaultfd, in-thread
    /// where not (an ordinary user)].
    #[arg(long, value_name = "MODE", value_parser = fault_mode_arg())]
    pub fault_mode: Option<FaultMode>,
}

/// Renders residency runs as `cells` characters.
pub fn picture(r: &Region, cells: usize) -> Result<String, upager::RangeError> {
    let len = r.len() as u64;
    let runs = r.residency(0, len)?;
    let per = len.div_ceil(cells as u64).max(1);
    let rank = |s: Residency| match s {
        Residency::ResidentDirty => 4,
        Residency::ResidentClean => 3,
        Residency::Busy => 2,
        Residency::Evicted => 1,
        _ => 0,
    };
    let mut best = vec![Residency::NeverTouched; cells];
    for (range, s) in runs {
        let (a, b) = (
            (range.start / per) as usize,
            ((range.end - 1) / per) as usize,
        );
        for cell in best.iter_mut().take(b.min(cells - 1) + 1).skip(a) {
            if rank(s) > rank(*cell) {
                *cell = s;
            }
        }
    }
    Ok(best.into_iter().map(Residency::symbol).collect())
}

fn show(
    step: &str,
    pager: &Pager,
    r: &Region,
    a: &StatArgs,
) -> Result<(), Box<dyn std::error::Error>> {
    let pic = picture(r, a.width * a.lines)?;
    let s = pager.stats();
    let huge = match r.huge_bytes()? {
        0 => String::new(),
        h => format!(", {} of it huge pages in the view", format_size(h)),
    };
    println!(
        "{step}: resident {}{huge} of {}, markers {} folios",
        format_size(s.resident_bytes),
        format_size(s.budget_bytes),
        s.evicted_markers
    );
    for line in pic.as_bytes().chunks(a.width) {
        println!("  |{}|", String::from_utf8_lossy(line));
    }
    Ok(())
}

/// Runs `upager stat`.
pub fn run(a: &StatArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.pools {
        return show_pools();
    }
    if a.width == 0 || a.lines == 0 {
        return Err("--width and --lines must be at least 1".into());
    }
    let mut b = Pager::builder().budget(a.budget);
    if let Some(m) = a.fault_mode {
        b = b.fault_mode(m);
    }
    let pager = b.build()?;
    let mut opts = MapOptions::new();
    if let Some(f) = a.folio {
        opts = opts.folio(f);
    }
    let (r, what) = match &a.store {
        None => (
            pager.map_anonymous(
                a.size.unwrap_or(SIZE),
                &opts.folio(a.folio.unwrap_or(FOLIO)),
            )?,
            "anonymous region".to_string(),
        ),
        Some(url) => (
            upager_stores::map(&pager, url, &opts)?,
            format!("read-only region of {url}"),
        ),
    };
    let len = r.len() as u64;
    let f = r.folio_size();
    println!(
        "{what}: {}, {} folios, fault mode {}; each character = {} ('#' dirty, '+' clean, '~' busy, '.' evicted, ' ' never touched)",
        format_size(len),
        format_size(f),
        pager.fault_mode(),
        format_size(len.div_ceil((a.width * a.lines) as u64))
    );
    show("start", &pager, &r, a)?;
    let words = r.words();
    if a.store.is_none() {
        for w in (0..words.len() / 2).step_by(512) {
            words[w].store(w as u64, Relaxed);
        }
        show("wrote the first half", &pager, &r, a)?;
    } else {
        for w in (0..words.len() / 2).step_by(512) {
            words[w].load(Relaxed);
        }
        show("read the first half", &pager, &r, a)?;
    }
    for w in (words.len() / 2..words.len() * 3 / 4).step_by(512) {
        words[w].load(Relaxed);
    }
    show("read the third quarter", &pager, &r, a)?;
    // Quarters of whole folios (none in a region of under four folios).
    let q = (len / 4) / f * f;
    if q == 0 {
        println!("(under four folios: no quarter to page out, prefetch or discard)");
    } else {
        r.pageout(2 * q, q)?;
        show("pageout of the third quarter", &pager, &r, a)?;
        r.prefetch(0, q.min(a.budget / 2 / f * f).max(f))?;
        r.wait_prefetch(Duration::from_secs(30));
        show("prefetch of the start", &pager, &r, a)?;
        r.discard(q, q)?;
        show("discard of the second quarter", &pager, &r, a)?;
    }
    let counters = r.store_counters();
    if !counters.is_empty() {
        println!("store counters:");
        for (name, v) in counters {
            println!("  {name:<28} {v}");
        }
    }
    Ok(())
}

/// `upager stat --pools`: this user's page pools, one block each.
fn show_pools() -> Result<(), Box<dyn std::error::Error>> {
    let pools = upager::pools()?;
    if pools.is_empty() {
        println!("no page pools (a process maps a file into one with UPAGER_POOL=on)");
    }
    for p in pools {
        println!("{}", p.data_path.display());
        println!("  holds      {}", p.key);
        println!(
            "  resident   {} of a {} budget",
            format_size(p.resident),
            format_size(p.budget)
        );
        let pids: Vec<String> = p.pids.iter().map(u32::to_string).collect();
        println!("  processes  {} ({})", p.procs, pids.join(", "));
        for (name, v) in p.counters {
            println!("  {name:<28} {v}");
        }
    }
    Ok(())
}
