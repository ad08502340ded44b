//! The process's S3 clients: one per bucket and settings, shared by every
//! store, dataset and uploader opened with them.
//!
//! Contract:
//! - [`connect`] gives the object_store client of a bucket (with its pool
//!   of connections) and the tokio runtime its connections run on, made on
//!   first use and kept for the next open of the same bucket with the same
//!   settings (endpoint, region, credentials, addressing, CA file,
//!   timeouts, retries, pool size, runtime threads): an object opened after
//!   another reuses its warm connections (no TCP or TLS handshake, one
//!   round trip for its HEAD) and threads. The last [`CLIENTS_KEPT`]
//!   settings are kept after their last user went (a model's shards
//!   opened one after another); an older one goes with its last user.
//! - Never across a fork: an entry another process made (a fork parent's)
//!   is forgotten, never dropped (its runtime's threads do not exist here)
//!   nor used; a child that finds the lock held by a parent's thread (gone,
//!   so held for ever) makes its clients without keeping them.
//! - Not kept: a client on the AWS credential chain (no static
//!   credentials, not unsigned), whose credentials may change between
//!   opens; it is asked for a credential when made, so that none found
//!   is one clear error ([`OpenError::NoCredentials`]).
//! - A runtime is shut down without waiting for its workers ([`Rt`]).
//! - Every PUT carries `x-amz-checksum-sha256`, the SHA-256 of its body
//!   (S3's additional checksums): the server refuses a body that arrives
//!   otherwise (BadDigest), so bytes damaged on the way are never stored
//!   and acknowledged. The digest is the one SigV4 signs already
//!   (`x-amz-content-sha256`, computed once), but SeaweedFS, for one, does
//!   not check that one against the body; it does check this header.
//!
//! Lock: `CLIENTS`, held to look up, make or insert a client; never
//! across a request.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, Checksum};
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use crate::config::Resolved;
use crate::options::{OpenError, S3Options};
use crate::url::S3Url;

/// Settings whose clients are kept after their last user went.
pub(crate) const CLIENTS_KEPT: usize = 4;

/// A client's tokio runtime, shut down without waiting when the last user
/// goes (`Runtime::drop` waits for the workers, and panics when the last
/// region is dropped inside another runtime's task).
pub(crate) struct Rt(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Rt {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("a runtime lives until drop")
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// What makes two opens' clients the same.
#[derive(PartialEq, Eq)]
struct Key {
    bucket: String,
    res: Resolved,
    connect_timeout: Duration,
    timeout: Duration,
    retries: usize,
    retry_for: Duration,
    pool: usize,
    threads: usize,
}

/// One kept client: its key, the process that made it, when it was last
/// handed out (a count of `connect` calls).
struct Entry {
    key: Key,
    pid: u32,
    used: u64,
    client: Arc<dyn ObjectStore>,
    rt: Arc<Rt>,
}

struct Clients {
    entries: Vec<Entry>,
    calls: u64,
}

static CLIENTS: Mutex<Clients> = Mutex::new(Clients {
    entries: Vec::new(),
    calls: 0,
});

/// The process whose thread last took `CLIENTS`: in a fork child that
/// finds it held, a thread of the parent (gone) held it at the fork.
static LOCKER: AtomicU32 = AtomicU32::new(0);

/// The client of the bucket of `url` with settings `res` and `opts`, and
/// the runtime of `threads` workers its connections run on: the kept one
/// for the same settings in this process, else a new one (kept).
pub(crate) fn connect(
    url: &S3Url,
    res: &Resolved,
    opts: &S3Options,
    threads: usize,
) -> Result<(Arc<dyn ObjectStore>, Arc<Rt>), OpenError> {
    let uncached = || -> Result<_, OpenError> {
        let client = build_client(url, res, opts)?;
        let rt = Arc::new(Rt(Some(runtime(url, threads)?)));
        if res.uses_chain() {
            chain_credential(&client, &rt, url, res, opts)?;
        }
        Ok((Arc::new(client) as Arc<dyn ObjectStore>, rt))
    };
    if res.uses_chain() {
        return uncached(); // the AWS credential chain
    }
    let key = Key {
        bucket: url.bucket.clone(),
        res: res.clone(),
        connect_timeout: opts.connect_timeout,
        timeout: opts.timeout,
        retries: opts.retries,
        retry_for: opts.retry_for,
        pool: pool_size(opts),
        threads,
    };
    let pid = std::process::id();
    let mut c = match CLIENTS.try_lock() {
        Ok(c) => c,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        // Held by a thread of the process that forked this one (it does
        // not exist here: the lock stays held): no kept clients here.
        Err(TryLockError::WouldBlock) if LOCKER.load(Relaxed) != pid => return uncached(),
        Err(TryLockError::WouldBlock) => CLIENTS.lock().unwrap_or_else(|e| e.into_inner()),
    };
    LOCKER.store(pid, Relaxed);
    c.calls += 1;
    let now = c.calls;
    // A fork parent's: forgotten (its runtime's threads are not here).
    for e in c.entries.extract_if(.., |e| e.pid != pid) {
        std::mem::forget(e);
    }
    if let Some(e) = c.entries.iter_mut().find(|e| e.key == key) {
        e.used = now;
        return Ok((Arc::clone(&e.client), Arc::clone(&e.rt)));
    }
    let client: Arc<dyn ObjectStore> = Arc::new(build_client(url, res, opts)?);
    let rt = Arc::new(Rt(Some(runtime(url, threads)?)));
    c.entries.push(Entry {
        key,
        pid,
        used: now,
        client: Arc::clone(&client),
        rt: Arc::clone(&rt),
    });
    if c.entries.len() > CLIENTS_KEPT {
        // The least recently handed out goes (its users keep theirs).
        let oldest = (0..c.entries.len())
            .min_by_key(|&i| c.entries[i].used)
            .expect("more than CLIENTS_KEPT entries");
        c.entries.swap_remove(oldest);
    }
    Ok((client, rt))
}

/// Idle connections a client keeps per host: at least a batch's GETs.
fn pool_size(opts: &S3Options) -> usize {
    opts.in_flight.max(8)
}

/// Asks the AWS credential chain of `client` (no static credentials:
/// container, web identity, instance metadata) for a credential once, so
/// that finding none is one clear error at open ([`OpenError::NoCredentials`])
/// rather than the metadata service's refusal at each request. The
/// provider keeps what it got for the requests.
fn chain_credential(
    client: &AmazonS3,
    rt: &Rt,
    url: &S3Url,
    res: &Resolved,
    opts: &S3Options,
) -> Result<(), OpenError> {
    let detail = if res.no_chain {
        "AWS_EC2_METADATA_DISABLED is set, and no container or web identity variables".to_string()
    } else {
        match crate::options::run(rt, opts.guard(), client.credentials().get_credential()) {
            Some(Ok(_)) => return Ok(()),
            Some(Err(e)) => crate::options::error_chain(&e),
            None => format!("no answer within {} s", opts.guard().as_secs()),
        }
    };
    Err(OpenError::NoCredentials {
        url: url.to_string(),
        profile: res.profile.clone(),
        detail,
    })
}

/// Builds the object_store client for `res` and the bucket of `url`.
fn build_client(url: &S3Url, res: &Resolved, opts: &S3Options) -> Result<AmazonS3, OpenError> {
    // The rustls provider of the process (reqwest is built without one):
    // ring, unless the program installed another.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut copts = ClientOptions::new()
        .with_connect_timeout(opts.connect_timeout)
        .with_timeout(opts.timeout)
        .with_pool_max_idle_per_host(pool_size(opts));
    if let Some(ca) = &res.ca {
        let pem = std::fs::read(ca).map_err(|e| OpenError::CaFile {
            path: ca.clone(),
            detail: e.to_string(),
        })?;
        let certs =
            object_store::Certificate::from_pem_bundle(&pem).map_err(|e| OpenError::CaFile {
                path: ca.clone(),
                detail: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(OpenError::CaFile {
                path: ca.clone(),
                detail: "no PEM certificate in it".into(),
            });
        }
        for c in certs {
            copts = copts.with_root_certificate(c);
        }
    }
    let mut b = if res.uses_chain() {
        // AWS without static credentials: the client's own chain
        // (container credentials, web identity, instance metadata).
        let b = AmazonS3Builder::from_env();
        match &res.metadata_endpoint {
            Some(e) => b.with_metadata_endpoint(e),
            None => b,
        }
    } else {
        AmazonS3Builder::new()
    };
    b = b
        .with_bucket_name(&url.bucket)
        .with_region(&res.region)
        .with_virtual_hosted_style_request(false)
        .with_checksum_algorithm(Checksum::SHA256)
        .with_client_options(copts)
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: opts.retries,
            retry_timeout: opts.retry_for,
        });
    if let Some(e) = &res.endpoint {
        b = b.with_allow_http(e.starts_with("http://"));
        if res.path_style {
            b = b.with_endpoint(e);
        } else {
            // Virtual-hosted at a custom endpoint: the bucket in the host.
            let (scheme, host) = e.split_once("://").unwrap_or(("https", e));
            b = b
                .with_endpoint(format!("{scheme}://{}.{host}", url.bucket))
                .with_virtual_hosted_style_request(true);
        }
    } else if !res.path_style {
        b = b.with_virtual_hosted_style_request(true);
    }
    if res.unsigned {
        b = b.with_skip_signature(true);
    }
    if let Some(c) = &res.credentials {
        b = b
            .with_access_key_id(&c.key_id)
            .with_secret_access_key(c.secret.expose());
        if let Some(t) = &c.token {
            b = b.with_token(t.expose());
        }
    }
    b.build().map_err(|source| OpenError::Client {
        url: url.to_string(),
        source,
    })
}

/// A runtime of `threads` workers for a client's connections.
fn runtime(url: &S3Url, threads: usize) -> Result<tokio::runtime::Runtime, OpenError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("upager-s3")
        .enable_all()
        .build()
        .map_err(|source| OpenError::Runtime {
            url: url.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::{self, Env};

    /// Settings from a list, no profile files.
    struct Vars(Vec<(&'static str, &'static str)>);
    impl Env for Vars {
        fn var(&self, name: &str) -> Option<String> {
            let v = self.0.iter().find(|(k, _)| *k == name)?;
            Some(v.1.to_string())
        }
        fn home(&self) -> Option<PathBuf> {
            None
        }
    }

    /// No static credentials at AWS: the credential chain is asked when
    /// the client is made, and finding none is one error that says where
    /// to put them (EACCES), within its bound: an instance metadata
    /// service that refuses (a closed port), or one disabled with nothing
    /// else in the chain (no request made).
    #[test]
    fn no_credentials_in_the_chain_is_one_clear_error_at_open() {
        // The client's chain reads the process's own AWS_* variables too:
        // with credentials or another source there, this is not the case.
        let own = [
            "AWS_ACCESS_KEY_ID",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ];
        if own.iter().any(|v| std::env::var_os(v).is_some()) {
            eprintln!("skipped: the process has AWS credentials of its own");
            return;
        }
        let opts = S3Options::default()
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(2))
            .retry(1, Duration::from_secs(1));
        let cases = [
            (
                Vars(vec![(
                    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
                    "http://127.0.0.1:1/",
                )]),
                "127.0.0.1:1",
            ),
            (
                Vars(vec![("AWS_EC2_METADATA_DISABLED", "true")]),
                "AWS_EC2_METADATA_DISABLED is set",
            ),
        ];
        for (env, says) in cases {
            let url: S3Url = "s3://chain-test/x".parse().unwrap();
            let res = config::resolve(&url, &env).unwrap();
            assert!(res.credentials.is_none() && res.endpoint.is_none());
            let t = std::time::Instant::now();
            let e = connect(&url, &res, &opts, 1).map(|_| ()).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, OpenError::NoCredentials { .. }), "{msg}");
            for part in [
                "AWS_ACCESS_KEY_ID",
                "profile 'default'",
                "?unsigned=1",
                says,
            ] {
                assert!(msg.contains(part), "{part}: {msg}");
            }
            assert_eq!(upager::ErrorCode::errno(&e), libc::EACCES);
            assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
        }
        // A metadata URL without its scheme is refused when read.
        let env = Vars(vec![(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            "169.254.169.254",
        )]);
        let e = config::resolve(&"s3://chain-test/x".parse().unwrap(), &env).unwrap_err();
        assert!(
            e.to_string().contains("AWS_EC2_METADATA_SERVICE_ENDPOINT"),
            "{e}"
        );
    }

    /// Another object of the bucket with the same settings gets the same
    /// client and runtime, kept after their users went; other settings or
    /// another bucket another; the least recently used goes beyond
    /// `CLIENTS_KEPT`. (No request is made: a client connects on use.)
    #[test]
    fn opens_of_a_bucket_with_the_same_settings_share_one_client() {
        let env = Vars(vec![
            ("AWS_ACCESS_KEY_ID", "id"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ]);
        let open = |url: &str, opts: &S3Options| {
            let url: S3Url = url.parse().unwrap();
            let res = config::resolve(&url, &env).unwrap();
            connect(&url, &res, opts, 1).unwrap()
        };
        let opts = S3Options::default();
        let (c1, r1) = open("s3://client-test-a/x", &opts);
        let (c2, r2) = open("s3://client-test-a/y", &opts);
        assert!(Arc::ptr_eq(&c1, &c2) && Arc::ptr_eq(&r1, &r2), "shared");
        let (c3, r3) = open(
            "s3://client-test-a/x",
            &opts.clone().timeout(Duration::from_secs(3)),
        );
        assert!(
            !Arc::ptr_eq(&c1, &c3) && !Arc::ptr_eq(&r1, &r3),
            "other settings"
        );
        let (c4, _) = open("s3://client-test-b/x", &opts);
        assert!(!Arc::ptr_eq(&c1, &c4), "another bucket");
        // Kept after its users went.
        let kept = Arc::downgrade(&r1);
        drop((c1, r1, c2, r2, c3, r3, c4));
        let (_, again) = open("s3://client-test-a/z", &opts);
        assert!(
            Arc::ptr_eq(&again, &kept.upgrade().expect("kept")),
            "reused"
        );
        drop(again);
        // Four more settings in use: the least recently used goes.
        let others: Vec<_> = ["c", "d", "e", "f"]
            .iter()
            .map(|b| open(&format!("s3://client-test-{b}/x"), &opts))
            .collect();
        assert!(kept.upgrade().is_none(), "dropped beyond CLIENTS_KEPT");
        drop(others);
    }
}
