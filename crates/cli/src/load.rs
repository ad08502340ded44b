//! `upager load FILE redis-cluster://HOST:PORT/NAME`: uploads a file once
//! as a dataset on a Redis Cluster (issue 14), with a progress bar; any
//! machine then maps it by name (`upager_redis::map`, C's
//! `upager_map_options.store`, Python's `open_array(None, ..., store=URL)`).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use upager::format_size;
use upager_redis::{RedisOptions, StoreUrl};

use crate::size_arg;

/// Arguments of `upager load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// The file to upload.
    pub file: PathBuf,
    /// Where: redis-cluster://HOST:PORT[,HOST:PORT...]/NAME (NAME must not
    /// exist yet).
    pub url: StoreUrl,
    /// Chunk size (one key each): regions that map the dataset use a folio
    /// of this size or a multiple of it. 4K to 2M, a power of two.
    #[arg(long, default_value = "64K", value_parser = size_arg)]
    pub chunk: u64,
    /// Replicas that must acknowledge every batch (Redis WAIT).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
}

/// Runs `upager load`.
pub fn run(a: &LoadArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.url.name.is_none() {
        return Err(format!("the URL names no dataset: add /NAME, e.g. {}/mydata", a.url).into());
    }
    let opts = RedisOptions {
        replicas: a.replicas,
        ..RedisOptions::default()
    };
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(
            "upload [{bar:40}] {percent:>3}% {binary_bytes_per_sec:>12} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    let t0 = Instant::now();
    let n = upager_redis::upload(&a.file, &a.url, a.chunk, &opts, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    })?;
    pb.finish_and_clear();
    let el = t0.elapsed().as_secs_f64();
    println!(
        "uploaded {} ({} bytes) to {} in {:.2} s ({:.0} MB/s), chunks of {}, {} replica(s) acknowledged each batch",
        a.file.display(),
        n,
        a.url,
        el,
        n as f64 / el.max(1e-9) / 1e6,
        format_size(a.chunk),
        a.replicas
    );
    println!(
        "map it by name with a folio of {} or a multiple: Rust upager_redis::map, C upager_map_options.store = \"{}\", Python upager.open_array(None, dtype, store=\"{}\")",
        format_size(a.chunk),
        a.url,
        a.url
    );
    Ok(())
}
