//! `upager list URL` and `upager delete URL/NAME`: what datasets a Redis
//! Cluster holds (complete, or incomplete uploads), and removing one;
//! the objects of an S3 bucket, and removing one.

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use upager::format_size;
use upager_redis::{RedisOptions, StoreUrl, UrlError};

/// Parses a store URL argument (`value_parser = StoreUrlParser` on every
/// URL argument). Not clap's `FromStr` adapter: its message "invalid value
/// '<the argument>'" would print a URL's password; this one says only
/// the URL's own error, which quotes it redacted.
#[derive(Clone, Copy, Debug)]
pub struct StoreUrlParser;

impl clap::builder::TypedValueParser for StoreUrlParser {
    type Value = StoreUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<StoreUrl, clap::Error> {
        let bad = |msg: String| {
            let name = arg.map_or_else(|| "URL".to_string(), ToString::to_string);
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '{name}': {msg}\n"),
            )
            .with_cmd(cmd)
        };
        let s = value
            .to_str()
            .ok_or_else(|| bad("a store URL must be UTF-8".to_string()))?;
        s.parse().map_err(|e: UrlError| bad(e.to_string()))
    }
}

/// A store URL of either kind: a Redis Cluster's or an S3 object's.
pub use upager_stores::AnyUrl;

/// Parses a Redis Cluster or S3 URL argument, by its scheme; messages
/// quote the URL redacted, as [`StoreUrlParser`]'s.
#[derive(Clone, Copy, Debug)]
pub struct AnyUrlParser;

impl clap::builder::TypedValueParser for AnyUrlParser {
    type Value = AnyUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<AnyUrl, clap::Error> {
        if value.to_str().is_some_and(AnyUrl::is_s3) {
            let s = value.to_str().unwrap_or_default();
            return s.parse().map(AnyUrl::S3).map_err(|e: upager_s3::UrlError| {
                let name = arg.map_or_else(|| "URL".to_string(), ToString::to_string);
                clap::Error::raw(
                    clap::error::ErrorKind::ValueValidation,
                    format!("invalid value for '{name}': {e}\n"),
                )
                .with_cmd(cmd)
            });
        }
        StoreUrlParser.parse_ref(cmd, arg, value).map(AnyUrl::Redis)
    }
}

/// Arguments of `upager list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// The cluster: redis-cluster://[[USER]:PASSWORD@]HOST[:PORT][,...]
    /// (rediss-cluster:// for TLS; a /NAME is ignored). The README's
    /// "Store URLs" has the parameters. Or a bucket: s3://BUCKET[/PREFIX]
    /// (its objects under PREFIX).
    #[arg(value_parser = AnyUrlParser)]
    pub url: AnyUrl,
}

/// Arguments of `upager delete`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// The dataset: redis-cluster://HOST:PORT[,HOST:PORT...]/NAME. An
    /// incomplete one (an interrupted or killed upload) is deleted too; a
    /// running upload of it stops at its next batch. Or an object:
    /// s3://BUCKET/KEY, or an S3 dataset: s3://BUCKET/NAME/ (complete or
    /// not).
    #[arg(value_parser = AnyUrlParser)]
    pub url: AnyUrl,
}

/// Runs `upager list`.
pub fn list(a: &ListArgs) -> Result<(), Box<dyn std::error::Error>> {
    let url = match &a.url {
        AnyUrl::Redis(u) => u,
        AnyUrl::S3(u) => {
            let opts = upager_s3::S3Options::default();
            let o = upager_s3::Objects::open(u, &opts)?;
            let all = o.list(&u.key)?;
            if all.is_empty() {
                println!("no objects under {u}");
            }
            // Datasets first, one line each; then the other objects.
            let sets = upager_s3::dataset::list(u, &opts, &upager_s3::config::ProcessEnv)?;
            for d in &sets {
                let (size, state) = match d.len {
                    Some(n) => (format_size(n), "dataset".to_string()),
                    None => (
                        "-".to_string(),
                        "incomplete dataset (an upload running, interrupted or killed: upager delete removes it)".to_string(),
                    ),
                };
                println!("{size:>10}  s3://{}/{}  {state}", u.bucket, d.name);
            }
            for (key, len) in all {
                if !sets.iter().any(|d| key.starts_with(&d.name)) {
                    println!("{:>10}  s3://{}/{key}", format_size(len), u.bucket);
                }
            }
            return Ok(());
        }
    };
    let all = upager_redis::list(url, &RedisOptions::default())?;
    if all.is_empty() {
        println!("no datasets on {}", url.addresses());
        return Ok(());
    }
    let width = all.iter().map(|d| d.name.len()).max().unwrap_or(4).max(4);
    println!("{:<width$}  {:>10}  {:>8}  STATE", "NAME", "SIZE", "CHUNK");
    for d in &all {
        let state = if d.complete {
            "complete".to_string()
        } else {
            let idle = d
                .idle_secs
                .map_or(String::new(), |s| format!(", no progress for {s} s"));
            format!("incomplete (an upload running, interrupted or killed{idle}: upager delete removes it)")
        };
        println!(
            "{:<width$}  {:>10}  {:>8}  {state}",
            d.name,
            format_size(d.len),
            format_size(d.chunk)
        );
    }
    Ok(())
}

/// Runs `upager delete`.
pub fn delete(a: &DeleteArgs) -> Result<(), Box<dyn std::error::Error>> {
    let url = match &a.url {
        AnyUrl::Redis(u) => u,
        AnyUrl::S3(u) => {
            if upager_s3::dataset::is_dataset(u) {
                let n = upager_s3::dataset::delete(
                    u,
                    &upager_s3::S3Options::default(),
                    &upager_s3::config::ProcessEnv,
                )?;
                println!("deleted the dataset {u} ({n} group objects)");
                return Ok(());
            }
            if u.key.is_empty() {
                return Err(format!("{u} names no object: add /KEY").into());
            }
            let o = upager_s3::Objects::open(u, &upager_s3::S3Options::default())?;
            o.delete(&u.key)?;
            println!("deleted {u}");
            return Ok(());
        }
    };
    if url.name.is_none() {
        return Err(format!(
            "the URL names no dataset: add /NAME, e.g. {}/mydata (upager list shows the names)",
            url
        )
        .into());
    }
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("delete [{bar:40}] {pos}/{len} chunks eta {eta}")
            .expect("template")
            .progress_chars("=> "),
    );
    let d = upager_redis::delete(url, &RedisOptions::default(), &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    });
    pb.finish_and_clear();
    let d = d?;
    println!(
        "deleted {} ({}, {}, chunks of {})",
        url,
        format_size(d.len),
        if d.complete { "complete" } else { "incomplete" },
        format_size(d.chunk)
    );
    Ok(())
}
