//! `upager cache`: the disk tier's directory (what remote stores' regions
//! keep on local disk): its size and use (`stat`), its entries (`list`),
//! and emptying it (`clear`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use upager::{format_size, CacheConfig};

/// What to do with the cache.
#[derive(Args, Debug)]
pub struct CacheArgs {
    /// What to do (default: stat).
    #[command(subcommand)]
    what: Option<What>,
    /// The cache directory. Default: UPAGER_CACHE_DIR, else
    /// $XDG_CACHE_HOME/upager/tier, else ~/.cache/upager/tier.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum What {
    /// The directory, its size limit and the bytes it holds.
    Stat,
    /// Each entry: bytes held of its data's length, last use, and what it
    /// holds (an S3 object by URL, size and ETag).
    List,
    /// Remove every entry (processes reading one go on with their open
    /// files).
    Clear,
}

fn dir_of(a: &CacheArgs) -> PathBuf {
    a.dir.clone().unwrap_or_else(CacheConfig::env_dir)
}

/// Runs `upager cache`.
pub fn run(a: &CacheArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dir = dir_of(a);
    match a.what.as_ref().unwrap_or(&What::Stat) {
        What::Stat => {
            let size = match std::env::var(upager::CACHE_SIZE_ENV) {
                Ok(v) if !v.trim().is_empty() => Some(upager::parse_size(&v)?),
                _ => None,
            };
            let cfg = CacheConfig::new(Some(dir.clone()), size);
            let info = upager::cache_scan(&dir)?;
            println!("directory  {}", dir.display());
            if cfg.enabled() {
                let from = if size.is_some() {
                    "UPAGER_CACHE_SIZE"
                } else {
                    "default"
                };
                println!("size       {} ({from})", format_size(cfg.size_bytes()));
            } else {
                println!("size       0: off (UPAGER_CACHE_SIZE=0)");
            }
            println!(
                "holds      {} in {} entries",
                format_size(info.bytes),
                info.entries.len()
            );
        }
        What::List => {
            let info = upager::cache_scan(&dir)?;
            if info.entries.is_empty() {
                println!("no entries in {}", dir.display());
            }
            for e in info.entries.iter().rev() {
                let age = e.used.elapsed().map_or(0, |d| d.as_secs());
                println!(
                    "{:>10} of {:>10}  used {:>6} ago  {}",
                    format_size(e.bytes),
                    format_size(e.len),
                    ago(age),
                    e.key
                );
            }
        }
        What::Clear => {
            let freed = upager::cache_clear(&dir)?;
            println!("freed {} in {}", format_size(freed), dir.display());
        }
    }
    Ok(())
}

fn ago(s: u64) -> String {
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}
