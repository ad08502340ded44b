//! A Redis Cluster per test, started and stopped through
//! scripts/redis-cluster.sh on the test's own port base (so test binaries
//! and tests run in parallel), and independent access to its keys.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use upager_redis::StoreUrl;

pub const MIB: u64 = 1 << 20;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh")
}

/// A running cluster; stopped (and its directory removed) on drop.
pub struct Cluster {
    pub base: u16,
    pub url: StoreUrl,
}

/// Whether redis-server is there; without it a test is skipped with a
/// message, except under CI=true, where that is a failure.
pub fn have_redis() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "redis-server is missing under CI=true: scripts/setup.sh installs it"
        );
        eprintln!("SKIPPED: redis-server is missing (scripts/setup.sh installs it)");
    }
    ok
}

impl Cluster {
    /// Starts a cluster on ports `base..base+5`, or None without redis-server.
    pub fn start(base: u16) -> Option<Cluster> {
        if !have_redis() {
            return None;
        }
        let c = Cluster {
            base,
            url: format!("redis-cluster://127.0.0.1:{base}").parse().unwrap(),
        };
        let out = c.run(&["start"]);
        assert!(
            out.status.success(),
            "cluster start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("127.0.0.1:{base}")
        );
        Some(c)
    }

    pub fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(script())
            .args(args)
            .env("UPAGER_REDIS_PORT", self.base.to_string())
            .env("UPAGER_REDIS_TIMEOUT", "60")
            .output()
            .expect("run scripts/redis-cluster.sh")
    }

    pub fn named(&self, name: &str) -> StoreUrl {
        self.url.with_name(name)
    }

    /// A plain client of the cluster (not upager's), for independent reads.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let nodes: Vec<String> = (0..6)
            .map(|k| format!("redis://127.0.0.1:{}", self.base + k))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match redis::cluster::ClusterClient::new(nodes.clone()).and_then(|c| c.get_connection())
            {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => panic!("cannot connect: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The port of a master, from `status`.
    pub fn masters(&self) -> Vec<u16> {
        let out = self.run(&["status"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(" master"))
            .filter_map(|l| {
                l.split_whitespace()
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run(&["stop"]);
    }
}

/// The chunk value of chunk `i` of dataset `name`, read straight from
/// Redis (None: no key).
pub fn raw_chunk(
    conn: &mut redis::cluster::ClusterConnection,
    name: &str,
    i: u64,
) -> Option<Vec<u8>> {
    let key = format!("upager:{{{name}/{}}}:{i}", i / 64);
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

/// Word `w` of a dataset read straight from Redis chunks.
pub fn raw_words(
    conn: &mut redis::cluster::ClusterConnection,
    name: &str,
    len: u64,
    chunk: u64,
) -> Vec<u64> {
    let mut out = Vec::with_capacity((len / 8) as usize);
    for i in 0..len.div_ceil(chunk) {
        let n = chunk.min(len - i * chunk) as usize;
        let v = raw_chunk(conn, name, i).unwrap_or_else(|| vec![0; n]);
        assert_eq!(v.len(), n, "chunk {i} has the size of its chunk");
        out.extend(
            v.chunks(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap())),
        );
    }
    out
}

/// A new writable dataset of `len` bytes in `chunk`-byte keys named `name`
/// on `c`, mapped read-write through a pager of `budget` bytes: the store
/// (for its counters and independent reads), the pager and the region.
pub fn writable_dataset(
    c: &Cluster,
    name: &str,
    len: u64,
    chunk: u64,
    budget: u64,
    ropts: &upager_redis::RedisOptions,
) -> (
    std::sync::Arc<upager_redis::RedisStore>,
    upager::Pager,
    std::sync::Arc<upager::Region>,
) {
    let st = upager_redis::RedisStore::create(&c.named(name), len, chunk, ropts).unwrap();
    let pager = upager::Pager::new(budget).unwrap();
    let r = pager
        .map_store(
            st.clone() as std::sync::Arc<dyn upager::Store>,
            &upager::MapOptions::new().writable(true),
        )
        .unwrap();
    (st, pager, std::sync::Arc::new(r))
}
