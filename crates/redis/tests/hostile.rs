//! A hostile network between upager and a Redis Cluster (issue 50, part
//! 2): a master cut off from upager (`CLIENT PAUSE ALL`: it takes no
//! command for a while, though the cluster bus still sees it alive, so no
//! failover comes to the rescue), and a master cut off from its replica
//! (the replica paused the same way: it is still connected and alive, but
//! acknowledges nothing, so a write's WAIT gets 0), many times, during
//! reads and during write-back, and healed.
//!
//! Each case checks: every word read is right or the read fails with an
//! error naming Redis; a flush during the cut fails or succeeds, a flush
//! after healing succeeds, and then every word in Redis equals the model
//! (0 lost words); no call waits past the documented bound (`retry_for`
//! plus a command's timeouts: store.rs's module doc). A `HOSTILE` line
//! per case: the figures of docs/reliability.md, "A hostile network".
//!
//! Ports: 21500-21505 (and +10000), this binary's own cluster.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use upager::Store;
use upager_redis::{RedisOptions, RedisStore};

const BASE: u16 = 21500;
const CHUNK: u64 = 64 << 10;
const LEN: u64 = 8 * MIB;

/// Short timeouts, so that a cut costs little: 300 ms per command, 2 s of
/// retries.
fn ropts() -> RedisOptions {
    RedisOptions {
        timeout: Duration::from_millis(300),
        retry_for: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

/// The documented bound on one call: retries start until `retry_for`, and
/// the last one may take a connect, a reply and a WAIT (2 timeouts for the
/// reply: store.rs sets the response timeout to 2 × timeout), plus the
/// backoff (at most 500 ms).
fn bound(o: &RedisOptions) -> Duration {
    o.retry_for + o.timeout * 4 + Duration::from_millis(500)
}

/// A small deterministic random generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A direct connection to one node.
fn node(port: u16) -> redis::Connection {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    c.get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

/// Cuts the master on `port` off from every client for `ms` (it answers
/// again by itself afterwards).
fn pause(port: u16, ms: u64) {
    let mut c = node(port);
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query::<()>(&mut c)
        .unwrap();
}

/// The port of the replica of the master on `port` (`CLUSTER NODES`).
fn replica_of(port: u16) -> u16 {
    let mut c = node(port);
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).unwrap();
    let fields: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let port_of = |f: &Vec<&str>| -> u16 {
        f[1].split('@')
            .next()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let id = fields.iter().find(|f| port_of(f) == port).unwrap()[0];
    let replica = fields
        .iter()
        .find(|f| f[2].contains("slave") && f[3] == id)
        .unwrap_or_else(|| panic!("no replica of {port}: {nodes}"));
    port_of(replica)
}

/// The masters of `ports` that hold chunks of dataset `name` (of
/// `chunks` chunks): each is asked for the first chunk of each hash tag;
/// another master answers MOVED.
fn owners(ports: &[u16], name: &str, chunks: u64) -> Vec<u16> {
    ports
        .iter()
        .copied()
        .filter(|&p| {
            let mut c = node(p);
            (0..chunks.div_ceil(64)).any(|g| {
                redis::cmd("EXISTS")
                    .arg(format!("upager:{{{name}/{g}}}:{}", g * 64))
                    .query::<u64>(&mut c)
                    .is_ok_and(|n| n == 1)
            })
        })
        .collect()
}

/// The word `i` of the dataset as first written.
fn word(i: u64) -> u64 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x4057) | 1
}

/// One row of the table.
#[derive(Debug, Default)]
struct Row {
    kind: &'static str,
    op: &'static str,
    injections: u64,
    calls: u64,
    errors: u64,
    lost: u64,
    max_stall: Duration,
    note: String,
}

impl Row {
    fn print(&self) {
        eprintln!(
            "HOSTILE | {} | {} | {} | {} calls, {} errors reported | {} | {} ms | {}",
            self.kind,
            self.op,
            self.injections,
            self.calls,
            self.errors,
            self.lost,
            self.max_stall.as_millis(),
            self.note
        );
    }
}

/// A chaos thread: until `stop`, every `every` ms cuts a master (chosen
/// at random) by `cut(port, i)`; counts the cuts.
fn chaos(
    masters: Vec<u16>,
    every: u64,
    stop: Arc<AtomicBool>,
    cut: impl Fn(u16, u64) + Send + 'static,
) -> (std::thread::JoinHandle<()>, Arc<AtomicU64>) {
    let n = Arc::new(AtomicU64::new(0));
    let cuts = Arc::clone(&n);
    let h = std::thread::spawn(move || {
        let mut rng = Rng(0xc4a05);
        let mut i = 0;
        while !stop.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(every));
            let port = masters[rng.below(masters.len() as u64) as usize];
            cut(port, i);
            cuts.fetch_add(1, Relaxed);
            i += 1;
        }
    });
    (h, n)
}

/// One cluster for the binary's cases, run one after another (each cut
/// hits the whole cluster's traffic).
#[test]
fn a_node_cut_off_during_reads_and_write_back_loses_nothing() {
    let Some(c) = Cluster::start(BASE) else {
        return;
    };
    let o = ropts();
    let (st, _pager, r) = writable_dataset(&c, "h", LEN, CHUNK, 32 * MIB, &o);
    let w = r.words();
    let mut model: Vec<u64> = (0..w.len() as u64).map(word).collect();
    for (i, x) in w.iter().enumerate() {
        x.store(model[i], Relaxed);
    }
    r.flush().unwrap();
    assert_eq!(c.masters().len(), 3);
    // Only the masters that hold the dataset are cut: a cut elsewhere
    // would not be an injection.
    let masters = owners(&c.masters(), "h", LEN / CHUNK);
    assert!(!masters.is_empty());
    let mut rows = Vec::new();

    // Reads: read_at of 4 chunks at random places (two nodes at most)
    // while masters are paused: 50-250 ms (within the retries), and one
    // pause in five of 2.5 s (past them).
    for kind in ["master paused"] {
        let reader = RedisStore::open(&c.named("h"), false, &o).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (h, cuts) = chaos(masters.clone(), 150, Arc::clone(&stop), move |port, i| {
            if kind == "master paused" {
                let ms = if i % 5 == 4 {
                    2500
                } else {
                    50 + (i * 37) % 200
                };
                pause(port, ms);
                std::thread::sleep(Duration::from_millis(ms));
            } else {
                pause(replica_of(port), 100);
            }
        });
        let mut row = Row {
            kind,
            op: "read_at",
            ..Row::default()
        };
        let mut rng = Rng(7);
        let mut buf = vec![0u8; 4 * CHUNK as usize];
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(8) {
            let off = rng.below((LEN - buf.len() as u64) / 8) * 8;
            let t = Instant::now();
            let res = reader.read_at(&mut buf, off);
            row.max_stall = row.max_stall.max(t.elapsed());
            row.calls += 1;
            match res {
                Ok(n) => {
                    assert_eq!(n, buf.len());
                    row.lost += buf
                        .chunks_exact(8)
                        .enumerate()
                        .filter(|(k, b)| {
                            u64::from_le_bytes((*b).try_into().unwrap())
                                != model[(off / 8) as usize + k]
                        })
                        .count() as u64;
                }
                Err(e) => {
                    row.errors += 1;
                    let msg = e.to_string();
                    assert!(
                        msg.contains("redis") || msg.contains("master 127.0.0.1:"),
                        "the error names the store: {msg}"
                    );
                    if row.note.is_empty() {
                        row.note = msg;
                    }
                }
            }
        }
        stop.store(true, Relaxed);
        h.join().unwrap();
        row.injections = cuts.load(Relaxed);
        row.print();
        rows.push(row);
    }
    // Let the last pause run out.
    std::thread::sleep(Duration::from_millis(2600));

    // Write-back: rounds of scattered writes and a flush while masters are
    // cut off; then healed, a flush that must succeed.
    for kind in ["master paused", "replica cut"] {
        let mut row = Row {
            kind,
            op: "write-back + flush",
            ..Row::default()
        };
        let mut rng = Rng(0x3141);
        let mut heal_errors = Vec::new();
        for round in 0..12u64 {
            for _ in 0..64 {
                let i = rng.below(w.len() as u64) as usize;
                let v = rng.next() | 1;
                w[i].store(v, Relaxed);
                model[i] = v;
            }
            let port = masters[round as usize % masters.len()];
            let ms = if round % 4 == 3 {
                2500
            } else {
                100 + rng.below(200)
            };
            let t = Instant::now();
            let cutter = std::thread::spawn(move || {
                if kind == "master paused" {
                    pause(port, ms);
                } else {
                    pause(replica_of(port), ms);
                }
            });
            // The cut is in place before the flush starts (a pause takes
            // effect with its reply).
            std::thread::sleep(Duration::from_millis(10));
            let res = r.flush();
            row.max_stall = row.max_stall.max(t.elapsed());
            row.calls += 1;
            row.injections += 1;
            cutter.join().unwrap();
            if let Err(e) = res {
                row.errors += 1;
                let msg = e.to_string();
                if row.note.is_empty() {
                    row.note = msg;
                }
            }
            // Healed: wait out the cut, and flush.
            std::thread::sleep(Duration::from_millis(
                ms.saturating_sub(t.elapsed().as_millis() as u64),
            ));
            let t = Instant::now();
            if let Err(e) = r.flush() {
                heal_errors.push(format!("round {round}: {e}"));
            }
            row.max_stall = row.max_stall.max(t.elapsed());
        }
        // Straight from Redis: every word the model has.
        let mut raw = c.client();
        row.lost = raw_words(&mut raw, "h", LEN, CHUNK)
            .into_iter()
            .zip(&model)
            .filter(|(a, b)| a != *b)
            .count() as u64;
        row.print();
        assert!(heal_errors.is_empty(), "{kind}: {heal_errors:#?}");
        rows.push(row);
    }
    eprintln!("{:?}", st.counters());
    for row in &rows {
        assert_eq!(row.lost, 0, "{row:?}");
        assert!(row.injections >= 10, "{row:?}");
        assert!(
            row.max_stall <= bound(&o) + Duration::from_millis(2600),
            "{row:?}: past the bound {:?}",
            bound(&o)
        );
    }
}
