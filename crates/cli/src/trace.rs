//! `upager trace FILE`: what the warm-start trace beside a file holds
//! (`MapOptions::warm`, docs/design.md "Warm starts"), and whether a map of
//! the file would replay it now.

use std::path::PathBuf;

use clap::Args;
use upager::format_size;

/// Arguments of `upager trace`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The data file (its trace is FILE.upager-trace).
    pub file: PathBuf,
}

/// Prints the trace's summary; an error if it is not a trace.
pub fn run(a: &TraceArgs) -> Result<(), Box<dyn std::error::Error>> {
    let path = upager::trace_path(&a.file);
    let Some(t) = upager::trace_info(&a.file)? else {
        println!(
            "{}: no trace (map the file with a warm start to record one: \
             MapOptions::warm, UPAGER_MAP_WARM, warm=\"auto\")",
            path.display()
        );
        return Ok(());
    };
    println!("{}: {} bytes", path.display(), t.bytes);
    println!(
        "  {} folios of {} ({}) in the order first needed, over {:.1} s",
        t.folios,
        format_size(t.folio),
        format_size(t.folios as u64 * t.folio),
        t.span_ms as f64 / 1000.0
    );
    println!(
        "  region: offset {}, length {}",
        format_size(t.offset),
        format_size(t.len)
    );
    match &t.matches {
        Ok(()) => println!("  matches the file: a map of this region with a warm start replays it"),
        Err(why) => println!("  stale: {why}; the next map with a warm start records a new one"),
    }
    Ok(())
}
