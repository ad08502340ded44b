//! `upager load FILE redis-cluster://HOST:PORT/NAME`: uploads a file once
//! as a dataset on a Redis Cluster, with a progress bar; any
//! machine then maps it by name (`upager_redis::map`, C's
//! `upager_map_options.store`, Python's `open_array(None, ..., store=URL)`).
//!
//! The dataset becomes visible only once the whole file is uploaded (issue
//! 20, item 8). SIGINT, SIGTERM or SIGHUP stop the upload at the next batch
//! and remove what it wrote; a load killed outright (SIGKILL) leaves an
//! incomplete dataset no one can open, which `upager list` shows,
//! `upager delete` removes and a new `load` of the name replaces (once it
//! made no progress for a minute). A directory, FIFO or device is refused
//! before anything is written. The same for S3 (`s3://BUCKET/KEY`, an
//! object: one multipart upload, aborted on a signal; `s3://BUCKET/NAME/`,
//! a dataset).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use upager::format_size;
use upager_redis::RedisOptions;

use crate::datasets::AnyUrl;

use crate::size_arg;

/// Arguments of `upager load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// The file to upload.
    pub file: PathBuf,
    /// Where: redis-cluster://HOST:PORT[,HOST:PORT...]/NAME (NAME must not
    /// exist yet; an incomplete upload of it is replaced once it made no
    /// progress for a minute), or s3://BUCKET/KEY (an object, replaced if
    /// it exists; credentials from the environment or ~/.aws), or
    /// s3://BUCKET/NAME/ (a read-write dataset: group objects and a
    /// manifest written last; NAME/ must not hold one yet).
    #[arg(value_parser = crate::datasets::AnyUrlParser)]
    pub url: AnyUrl,
    /// Chunk size (one key each): regions that map the dataset use a folio
    /// of this size or a multiple of it. 4K to 2M, a power of two.
    #[arg(long, default_value = "64K", value_parser = size_arg)]
    pub chunk: u64,
    /// Replicas that must acknowledge every batch (Redis WAIT).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Group size of an S3 dataset (s3://BUCKET/NAME/): one object each;
    /// a write-back rewrites the groups it touches. 64K to 64M, a power
    /// of two.
    #[arg(long, default_value = "256K", value_parser = size_arg)]
    pub group: u64,
}

/// SIGINT, SIGTERM, SIGHUP set the flag: an upload stops at its next
/// batch, removes what it wrote, then fails.
fn cancel_on_signals() -> Result<Arc<AtomicBool>, Box<dyn std::error::Error>> {
    let cancel = Arc::new(AtomicBool::new(false));
    let c = Arc::clone(&cancel);
    ctrlc::set_handler(move || c.store(true, Ordering::SeqCst))
        .map_err(|e| format!("cannot handle SIGINT/SIGTERM during the upload: {e}"))?;
    Ok(cancel)
}

/// The upload's progress bar.
fn upload_bar() -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(
            "upload [{bar:40}] {percent:>3}% {binary_bytes_per_sec:>12} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb
}

/// Runs `upager load`.
pub fn run(a: &LoadArgs) -> Result<(), Box<dyn std::error::Error>> {
    let url = match &a.url {
        AnyUrl::Redis(u) => u,
        AnyUrl::S3(u) => return load_s3(a, u),
    };
    if url.name.is_none() {
        return Err(format!("the URL names no dataset: add /NAME, e.g. {url}/mydata").into());
    }
    let opts = RedisOptions {
        replicas: a.replicas,
        ..RedisOptions::default()
    };
    let cancel = cancel_on_signals()?;
    let pb = upload_bar();
    let t0 = Instant::now();
    let n = upager_redis::upload_cancellable(
        &a.file,
        url,
        a.chunk,
        &opts,
        &mut |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        },
        &cancel,
    );
    pb.finish_and_clear();
    let n = n?;
    let el = t0.elapsed().as_secs_f64();
    println!(
        "uploaded {} ({} bytes) to {} in {:.2} s ({}), chunks of {}, {} replica(s) acknowledged each batch",
        a.file.display(),
        n,
        url,
        el,
        rate(n, el),
        format_size(a.chunk),
        a.replicas
    );
    println!(
        "map it by name with a folio of {} or a multiple: Rust upager_redis::map, C upager_map_options.store = \"{}\", Python upager.open_array(None, dtype, store=\"{}\")",
        format_size(a.chunk),
        url,
        a.url
    );
    Ok(())
}

/// An upload's rate, `n` bytes in `el` seconds: MB/s, with two decimals
/// under 10 MB/s, KB/s under 0.1 MB/s, B/s under 1 KB/s (a file of a few
/// KB printed "0 MB/s").
fn rate(n: u64, el: f64) -> String {
    let r = n as f64 / el.max(1e-9);
    if r >= 1e7 {
        format!("{:.0} MB/s", r / 1e6)
    } else if r >= 1e5 {
        format!("{:.2} MB/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} KB/s", r / 1e3)
    } else {
        format!("{r:.0} B/s")
    }
}

/// `upager load FILE s3://BUCKET/KEY`: a multipart upload (S3 publishes
/// the object only once it is complete: an interrupted load leaves none;
/// SIGINT, SIGTERM or SIGHUP abort it at the next batch of parts), with a
/// progress bar.
fn load_s3(a: &LoadArgs, url: &upager_s3::S3Url) -> Result<(), Box<dyn std::error::Error>> {
    if upager_s3::dataset::is_dataset(url) {
        return load_s3_dataset(a, url);
    }
    if url.key.is_empty() || url.key.ends_with('/') {
        return Err(format!("{url} names no object: add the key, s3://BUCKET/KEY").into());
    }
    let o = upager_s3::Objects::open(url, &upager_s3::S3Options::default())?;
    let cancel = cancel_on_signals()?;
    let pb = upload_bar();
    let t0 = Instant::now();
    let mut n = 0;
    let etag = o.upload_with(&a.file, &url.key, &cancel, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
        n = total;
    });
    pb.finish_and_clear();
    let etag = etag?;
    let el = t0.elapsed().as_secs_f64();
    println!(
        "uploaded {} ({n} bytes) to {url} in {el:.2} s ({}), ETag {etag}",
        a.file.display(),
        rate(n, el),
    );
    println!("map it read-only: Rust upager_s3::map, upager demo --store {url}");
    Ok(())
}

/// `upager load FILE s3://BUCKET/NAME/`: a read-write dataset, its groups
/// many PUTs in flight, its manifest last (an interrupted load leaves no
/// dataset; what it wrote is removed, or `upager delete` removes it).
fn load_s3_dataset(a: &LoadArgs, url: &upager_s3::S3Url) -> Result<(), Box<dyn std::error::Error>> {
    let cancel = cancel_on_signals()?;
    let pb = upload_bar();
    let t0 = Instant::now();
    let m = upager_s3::dataset::load(
        url,
        &a.file,
        a.group,
        &upager_s3::S3Options::default(),
        &upager_s3::config::ProcessEnv,
        &cancel,
        &mut |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        },
    );
    pb.finish_and_clear();
    let m = m?;
    let el = t0.elapsed().as_secs_f64();
    println!(
        "uploaded {} ({} bytes) to the dataset {url} in {el:.2} s ({}), groups of {}",
        a.file.display(),
        m.len,
        rate(m.len, el),
        format_size(m.group)
    );
    println!(
        "map it read-write: Rust upager_s3::map with MapOptions::writable, C upager_map_options.store = \"{url}\", Python upager.memmap(\"{url}\", dtype, mode=\"r+\")"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rate;

    #[test]
    fn an_upload_s_rate_reads_well_at_every_size() {
        assert_eq!(rate(2_000_000_000, 10.0), "200 MB/s");
        assert_eq!(rate(5_000_000, 1.0), "5.00 MB/s");
        assert_eq!(rate(4_096, 0.5), "8.2 KB/s");
        assert_eq!(rate(6, 0.2), "30 B/s");
        assert_eq!(rate(0, 0.0), "0 B/s");
    }
}
