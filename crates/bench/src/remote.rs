//! Data on a remote store for the examples that measure one (warm-start,
//! umap-bfs): a Redis Cluster dataset or an S3 object, uploaded from a
//! file, deleted, and reached through proxies that add a network's latency.
//!
//! [`Remote::add_latency`]: the client talks to the server through a TCP
//! proxy in this process that passes every chunk of a request on N ms
//! after it arrived — what a network between program and store adds to
//! each round trip, however many requests are in flight (a cloud object store's first byte comes after tens of ms).
//! For S3 the endpoint becomes the proxy. For a Redis Cluster each node
//! gets a proxy and announces the proxy's port (`CONFIG SET
//! cluster-announce-port`, with `redis-cli`), so the client reaches every
//! node through one as it learns the cluster's layout; the nodes announce
//! their own ports again when the returned guard is dropped. (No `tc
//! netem` on these machines: its module is not built.)

use std::error::Error;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use upager_redis::{RedisOptions, RedisStore, StoreUrl};
use upager_s3::{S3Options, S3Store, S3Url};

/// A dataset on a Redis Cluster (`redis-cluster://HOST:PORT/NAME`) or an
/// object of an S3-compatible store (`s3://BUCKET/KEY`; credentials and
/// endpoint from the `AWS_*` variables).
#[derive(Debug, Clone)]
pub enum Remote {
    /// A Redis Cluster dataset.
    Redis(StoreUrl),
    /// An S3 object.
    S3(S3Url),
}

/// Boxed errors of the examples.
pub type AnyError = Box<dyn Error>;

impl Remote {
    /// The store a URL names, by its scheme.
    pub fn parse(url: &str) -> Result<Remote, AnyError> {
        Ok(if url.starts_with("s3://") {
            Remote::S3(url.parse()?)
        } else {
            Remote::Redis(url.parse()?)
        })
    }

    /// The URL (redacted), as the store's own messages print it.
    pub fn url(&self) -> String {
        match self {
            Remote::Redis(u) => u.to_string(),
            Remote::S3(u) => u.to_string(),
        }
    }

    /// Puts `file`'s bytes there, replacing what was (a Redis dataset in
    /// chunks of `chunk` bytes; an object whole).
    pub fn upload(&self, file: &Path, chunk: u64) -> Result<(), AnyError> {
        match self {
            Remote::Redis(url) => {
                let _ = upager_redis::delete(url, &RedisOptions::default(), &mut |_, _| {});
                upager_redis::upload(file, url, chunk, &RedisOptions::default(), &mut |_, _| {})?;
            }
            Remote::S3(url) => {
                upager_s3::Objects::open(url, &S3Options::default())?.upload(file, &url.key)?;
            }
        }
        Ok(())
    }

    /// Removes the data (and the trace the store keeps beside it).
    pub fn delete(&self) {
        match self {
            Remote::Redis(url) => {
                let _ = upager_redis::delete(url, &RedisOptions::default(), &mut |_, _| {});
            }
            Remote::S3(url) => {
                if let Ok(o) = upager_s3::Objects::open(url, &S3Options::default()) {
                    let _ = o.delete(&url.key);
                }
            }
        }
    }

    /// The store, opened read-only.
    pub fn store(&self) -> Result<Arc<dyn upager::Store>, AnyError> {
        Ok(match self {
            Remote::Redis(url) => RedisStore::open(url, false, &RedisOptions::default())?,
            Remote::S3(url) => S3Store::open(url, &S3Options::default())?,
        })
    }

    /// Routes this URL's requests through proxies that hold each request
    /// `delay` (see the module doc); the guard undoes what the cluster's
    /// nodes were told. `delay` 0: nothing changes.
    pub fn add_latency(&mut self, delay: Duration) -> Result<Option<Announced>, AnyError> {
        if delay.is_zero() {
            return Ok(None);
        }
        match self {
            Remote::Redis(url) => Ok(Some(redis_through_proxies(url, delay)?)),
            Remote::S3(url) => {
                let server = match &url.endpoint {
                    Some(e) => e.clone(),
                    None => std::env::var("AWS_ENDPOINT_URL")
                        .map_err(|_| "added latency needs the S3 endpoint (AWS_ENDPOINT_URL)")?,
                };
                let host = server
                    .strip_prefix("http://")
                    .ok_or("added latency: an http:// S3 endpoint only")?;
                let proxy = delay_proxy(host.to_string(), delay)?;
                url.endpoint = Some(format!("http://{proxy}"));
                Ok(None)
            }
        }
    }
}

/// Starts a TCP proxy on a loopback port to `server` (host:port) that
/// passes each chunk of a request on `delay` after it arrived (answers
/// pass at once); returns its address. Threads: three per connection, for
/// the life of the process.
pub fn delay_proxy(server: String, delay: Duration) -> std::io::Result<String> {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(upstream) = TcpStream::connect(&server) else {
                continue;
            };
            let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
            let (Ok(mut c_in), Ok(mut u_out)) = (client.try_clone(), upstream.try_clone()) else {
                continue;
            };
            let (mut u_in, mut c_out) = (upstream, client);
            // A line of latency, not of throughput: each chunk is passed on
            // `delay` after it arrived, whatever came before it (a client
            // that writes 100 pipelined commands one by one waits one delay,
            // not 100).
            let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n @ 1..) = c_in.read(&mut buf) {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            });
            std::thread::spawn(move || {
                for (at, chunk) in rx {
                    std::thread::sleep((at + delay).saturating_duration_since(Instant::now()));
                    if u_out.write_all(&chunk).is_err() {
                        break;
                    }
                }
                let _ = u_out.shutdown(Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut u_in, &mut c_out);
                let _ = c_out.shutdown(Shutdown::Write);
            });
        }
    });
    Ok(addr)
}

/// A Redis Cluster whose nodes announce the ports of delaying proxies
/// ([`Remote::add_latency`]); dropped, they announce their own again.
#[derive(Debug)]
pub struct Announced {
    host: String,
    ports: Vec<u16>,
}

impl Drop for Announced {
    fn drop(&mut self) {
        for p in &self.ports {
            let _ = redis_cli(
                &self.host,
                *p,
                &["config", "set", "cluster-announce-port", "0"],
            );
        }
    }
}

/// `redis-cli -h HOST -p PORT ARGS...`: its output, or why it failed.
fn redis_cli(host: &str, port: u16, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-h", host, "-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|e| format!("redis-cli: {e} (install redis-tools)"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || text.starts_with("ERR") {
        return Err(format!("redis-cli -p {port} {}: {text}", args.join(" ")));
    }
    Ok(text)
}

/// Puts a delaying proxy ([`delay_proxy`]) before every node of the
/// cluster `url` names, has each node announce its proxy's port, waits
/// until every node's `CLUSTER SLOTS` names only proxies, and points
/// `url` at the first node's proxy.
fn redis_through_proxies(url: &mut StoreUrl, delay: Duration) -> Result<Announced, AnyError> {
    let (host, seed) = url.nodes[0].clone();
    let nodes = redis_cli(&host, seed, &["cluster", "nodes"])?;
    let ports: Vec<u16> = nodes
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|a| a.split('@').next()?.rsplit(':').next()?.parse().ok())
        .collect();
    let mut announced = Announced {
        host: host.clone(),
        ports: Vec::new(),
    };
    let mut proxies = Vec::new();
    for &p in &ports {
        let proxy = delay_proxy(format!("{host}:{p}"), delay)?;
        let pp: u16 = proxy.rsplit(':').next().unwrap_or("").parse()?;
        redis_cli(
            &host,
            p,
            &["config", "set", "cluster-announce-port", &pp.to_string()],
        )?;
        announced.ports.push(p);
        proxies.push(pp);
    }
    let through_proxies = |p: u16| {
        redis_cli(&host, p, &["cluster", "slots"]).is_ok_and(|slots| {
            let named: Vec<u16> = slots
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            !named.is_empty()
                && named
                    .iter()
                    .all(|n| proxies.contains(n) || !ports.contains(n))
        })
    };
    let t = Instant::now();
    while !ports.iter().all(|&p| through_proxies(p)) {
        if t.elapsed() > Duration::from_secs(30) {
            return Err(
                "the cluster's nodes did not all announce their proxies within 30 s".into(),
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let k = ports
        .iter()
        .position(|&p| p == seed)
        .ok_or("the seed node is not in CLUSTER NODES")?;
    url.nodes = vec![(host, proxies[k])];
    Ok(announced)
}
