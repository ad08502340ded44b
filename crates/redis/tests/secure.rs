//! Store URLs with credentials and TLS against live local clusters (issue
//! 22, item 6): a cluster that requires a password (`requirepass`,
//! `masterauth` and an ACL user), and a TLS-only cluster whose CA and
//! certificates the test makes with openssl. Wrong credentials and a
//! wrong CA are clear errors that say what to check; the right ones map a
//! region, write, flush and read back through a second store. No password
//! appears in any error, `Debug`, `Display` or `Store::describe`.
//!
//! Each cluster is 3 masters and no replica, started here (not with
//! scripts/redis-cluster.sh, which has no TLS or password) as child
//! processes that `Drop` kills; every wait has a timeout.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use upager::{MapOptions, Pager, Store};
use upager_redis::{OpenError, RedisOptions, RedisStore, StoreUrl};

const CHUNK: u64 = 64 << 10;
const MIB: u64 = 1 << 20;
/// Longest wait for a node or the cluster to come up.
const UP: Duration = Duration::from_secs(30);

/// The requirepass of the auth cluster: characters a URL must escape.
const PASSWORD: &str = "pa:ss@w/o%rd";
const PASSWORD_IN_URL: &str = "pa%3Ass%40w%2Fo%25rd";
/// The ACL user of the auth cluster and its password.
const ACL_USER: &str = "alice";
const ACL_PASSWORD: &str = "wonder-land-7";

/// How redis-cli reaches a node of a test cluster.
#[derive(Clone, Default)]
struct CliAccess {
    password: Option<String>,
    ca: Option<PathBuf>,
}

impl CliAccess {
    fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(p) = &self.password {
            a.extend(["-a".into(), p.clone(), "--no-auth-warning".into()]);
        }
        if let Some(ca) = &self.ca {
            a.extend(["--tls".into(), "--cacert".into(), ca.display().to_string()]);
        }
        a
    }

    fn cli(&self, port: u16, cmd: &[&str]) -> Option<String> {
        let out = Command::new("timeout")
            .args(["5", "redis-cli", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(self.args())
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Three cluster masters on `base..base+3`, killed on drop.
struct TestCluster {
    base: u16,
    dir: tempfile::TempDir,
    nodes: Vec<Child>,
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = n.kill();
            let _ = n.wait();
        }
    }
}

/// Polls `ok` every 50 ms until it holds or `limit` passes.
fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl TestCluster {
    /// Starts the nodes with `conf` (extra redis.conf lines) in `dir`,
    /// creates the cluster and waits for cluster_state:ok. Err(log) if a
    /// node did not start (its log says why).
    fn start(
        base: u16,
        dir: tempfile::TempDir,
        conf: &str,
        access: &CliAccess,
    ) -> Result<TestCluster, String> {
        let mut c = TestCluster {
            base,
            dir,
            nodes: Vec::new(),
        };
        for port in c.ports() {
            let d = c.dir.path();
            let file = d.join(format!("{port}.conf"));
            std::fs::write(
                &file,
                format!(
                    "bind 127.0.0.1\nprotected-mode yes\ndaemonize no\ndir {dir}\n\
                     logfile {dir}/{port}.log\ncluster-enabled yes\n\
                     cluster-config-file {dir}/nodes-{port}.conf\ncluster-node-timeout 1000\n\
                     appendonly no\nsave \"\"\n{conf}",
                    dir = d.display(),
                    conf = conf.replace("PORT", &port.to_string()),
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&file)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            c.nodes.push(child);
        }
        for (k, port) in c.ports().enumerate() {
            let deadline = Instant::now() + UP;
            while access.cli(port, &["ping"]).as_deref().map(str::trim) != Some("PONG") {
                let exited = c.nodes[k].try_wait().ok().flatten().is_some();
                if exited || Instant::now() > deadline {
                    let log = std::fs::read_to_string(c.dir.path().join(format!("{port}.log")))
                        .unwrap_or_default();
                    return Err(format!("redis-server on port {port} did not start: {log}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let addrs: Vec<String> = c.ports().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("timeout")
            .arg("60")
            .arg("redis-cli")
            .args(access.args())
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for port in c.ports() {
            wait_until(UP, "cluster_state:ok", || {
                access
                    .cli(port, &["cluster", "info"])
                    .is_some_and(|i| i.contains("cluster_state:ok"))
            });
        }
        Ok(c)
    }

    fn ports(&self) -> std::ops::Range<u16> {
        self.base..self.base + 3
    }
}

/// Whether redis-server and openssl are there; without them a test is
/// skipped with a message (under CI=true that is a failure).
fn have_tools() -> bool {
    if !common::have_redis() {
        return false;
    }
    let ok = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "openssl is missing under CI=true: scripts/setup.sh installs it"
        );
        eprintln!("SKIPPED: openssl is missing (scripts/setup.sh installs it)");
    }
    ok
}

/// No replicas in these clusters: writes are acknowledged by the master.
fn ropts() -> RedisOptions {
    RedisOptions {
        replicas: 0,
        retry_for: Duration::from_secs(3),
        ..RedisOptions::default()
    }
}

fn url(s: &str) -> StoreUrl {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Creates dataset `u` (2 MiB), writes a pattern through a writable
/// region under a 1 MiB budget (so it evicts), flushes, unmaps; then reads
/// it back through a fresh store opened with `again`. Checks that no
/// password shows in the store's `Debug` or `describe`.
fn write_flush_read_back(u: &StoreUrl, again: &StoreUrl, secrets: &[&str]) {
    let len = 2 * MIB;
    let st = RedisStore::create(u, len, CHUNK, &ropts()).unwrap_or_else(|e| panic!("{e}"));
    for shown in [format!("{st:?}"), st.describe(), u.to_string()] {
        for s in secrets {
            assert!(!shown.contains(s), "a password in {shown}");
        }
    }
    let pager = Pager::new(MIB).unwrap();
    let r = pager
        .map_store(
            st as std::sync::Arc<dyn Store>,
            &MapOptions::new().writable(true),
        )
        .unwrap();
    let words = (len / 8) as usize;
    let value = |w: usize| (w as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for w in 0..words {
        r.words()[w].store(value(w), Relaxed);
    }
    r.flush().unwrap();
    if let Err((e, _)) = r.unmap() {
        panic!("unmap: {e}");
    }
    let r = upager_redis::map(&pager, again, &MapOptions::new(), &ropts()).unwrap();
    for w in (0..words).step_by(3) {
        assert_eq!(r.words()[w].load(Relaxed), value(w), "word {w}");
    }
    drop(r);
    let all = upager_redis::list(again, &ropts()).unwrap();
    assert!(all.iter().any(|d| Some(&d.name) == u.name.as_ref()));
    upager_redis::delete(again, &ropts(), &mut |_, _| {}).unwrap();
}

/// The message of an error opening `u`, checked free of `secrets`.
fn open_err(u: &StoreUrl, secrets: &[&str]) -> OpenError {
    let t = Instant::now();
    let e = RedisStore::open(u, false, &ropts()).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let msg = e.to_string();
    eprintln!("{u}: {msg}");
    let dbg = format!("{e:?}");
    for s in secrets {
        assert!(
            !msg.contains(s) && !dbg.contains(s),
            "a password in {msg} / {dbg}"
        );
    }
    e
}

#[test]
fn a_cluster_with_a_password_and_an_acl_user() {
    if !have_tools() {
        return;
    }
    let base = 21400;
    let conf = format!(
        "port PORT\nrequirepass \"{PASSWORD}\"\nmasterauth \"{PASSWORD}\"\n\
         user {ACL_USER} on >{ACL_PASSWORD} ~* &* +@all\n"
    );
    let access = CliAccess {
        password: Some(PASSWORD.into()),
        ca: None,
    };
    let _c = TestCluster::start(base, tempfile::tempdir().unwrap(), &conf, &access)
        .unwrap_or_else(|e| panic!("{e}"));
    let secrets = [PASSWORD, PASSWORD_IN_URL, ACL_PASSWORD, "wrong-one"];

    // No password: the server's NOAUTH, named as such.
    let e = open_err(
        &url(&format!("redis-cluster://127.0.0.1:{base}/d")),
        &secrets,
    );
    assert!(matches!(e, OpenError::NoAuth { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "the Redis Cluster at 127.0.0.1:{base} requires a password: "
        )),
        "{msg}"
    );
    assert!(msg.ends_with("(put it in the store URL: redis-cluster://:PASSWORD@HOST:PORT, or USER:PASSWORD@ for an ACL user)"), "{msg}");
    assert_eq!(upager::ErrorCode::errno(&e), libc::EACCES);

    // A wrong password, for the default user and for the ACL user.
    let e = open_err(
        &url(&format!("redis-cluster://:wrong-one@127.0.0.1:{base}/d")),
        &secrets,
    );
    assert!(matches!(e, OpenError::Auth { .. }), "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "the Redis Cluster at 127.0.0.1:{base} refused the credentials: "
        )),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("check USER:PASSWORD@ in the store URL"),
        "{e}"
    );
    let e = open_err(
        &url(&format!(
            "redis-cluster://{ACL_USER}:wrong-one@127.0.0.1:{base}/d"
        )),
        &secrets,
    );
    assert!(matches!(e, OpenError::Auth { .. }), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("refused the credentials of user '{ACL_USER}'")),
        "{e}"
    );
    // The right password in the wrong user's place is refused too.
    let e = open_err(
        &url(&format!(
            "redis-cluster://{ACL_USER}:{PASSWORD_IN_URL}@127.0.0.1:{base}/d"
        )),
        &secrets,
    );
    assert!(matches!(e, OpenError::Auth { .. }), "{e}");

    // The right ones: written as the default user (a password that needs
    // escaping), read back as the ACL user, through another seed.
    let as_default = url(&format!(
        "redis-cluster://:{PASSWORD_IN_URL}@127.0.0.1:{base}/secret-data"
    ));
    assert_eq!(
        as_default.to_string(),
        format!("redis-cluster://:***@127.0.0.1:{base}/secret-data")
    );
    let as_alice = url(&format!(
        "redis-cluster://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{}/secret-data",
        base + 2
    ));
    write_flush_read_back(&as_default, &as_alice, &secrets);
}

/// Makes a self-signed CA `ca` (`ca.crt`, `ca.key`) in `dir`; returns
/// its certificate's path.
fn make_ca(dir: &Path, ca: &str) -> PathBuf {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN=upager test {ca}"),
        "-keyout",
        &format!("{ca}.key"),
        "-out",
        &format!("{ca}.crt"),
    ]);
    dir.join(format!("{ca}.crt"))
}

/// Makes, signed by CA `ca` in `dir`, a certificate for 127.0.0.1 and
/// localhost named `name` (`name.crt`, `name.key`) whose
/// extendedKeyUsage is `usage`.
fn make_cert(dir: &Path, ca: &str, name: &str, usage: &str) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             extendedKeyUsage={usage}\n"
        ),
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        &format!("/CN={name}"),
        "-keyout",
        &format!("{name}.key"),
        "-out",
        &format!("{name}.csr"),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &format!("{name}.csr"),
        "-CA",
        &format!("{ca}.crt"),
        "-CAkey",
        &format!("{ca}.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &format!("{name}.ext"),
        "-out",
        &format!("{name}.crt"),
    ]);
}

#[test]
fn a_tls_cluster_through_rediss_cluster_urls() {
    if !have_tools() {
        return;
    }
    let base = 21410;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let ca = make_ca(&d, "ca");
    make_cert(&d, "ca", "server", "serverAuth,clientAuth");
    make_cert(&d, "ca", "client", "clientAuth");
    let other_ca = make_ca(&d, "other-ca");
    // TLS only (port 0), the cluster bus and replication over TLS too;
    // client certificates optional (verified when given).
    let conf = format!(
        "port 0\ntls-port PORT\ntls-cert-file {d}/server.crt\ntls-key-file {d}/server.key\n\
         tls-ca-cert-file {ca}\ntls-cluster yes\ntls-replication yes\n\
         tls-auth-clients optional\n",
        d = d.display(),
        ca = ca.display()
    );
    let access = CliAccess {
        password: None,
        ca: Some(ca.clone()),
    };
    let _c = match TestCluster::start(base, dir, &conf, &access) {
        Ok(c) => c,
        // A build without TLS refuses the tls-* directives.
        Err(log)
            if log.contains("not compiled with TLS")
                || log.contains("TLS support")
                || (log.contains("Bad directive") && log.contains("tls-")) =>
        {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "redis-server has no TLS under CI=true: {log}"
            );
            eprintln!("SKIPPED: this redis-server is built without TLS: {log}");
            return;
        }
        Err(log) => panic!("{log}"),
    };
    let ca_param = ca.display().to_string();

    // The right CA: write, flush, read back (the second store through a
    // client certificate and another seed).
    let u = url(&format!(
        "rediss-cluster://127.0.0.1:{base}/tls-data?ca={ca_param}"
    ));
    assert_eq!(u.addresses(), format!("127.0.0.1:{base} (TLS)"));
    let with_cert = url(&format!(
        "rediss-cluster://127.0.0.1:{}/tls-data?ca={ca_param}&cert={d}/client.crt&key={d}/client.key",
        base + 1,
        d = d.display()
    ));
    write_flush_read_back(&u, &with_cert, &[]);
    // insecure=1: no verification (the self-signed case).
    let insecure = url(&format!(
        "rediss-cluster://127.0.0.1:{}/tls-insecure?insecure=1",
        base + 2
    ));
    write_flush_read_back(&insecure, &insecure, &[]);

    // The system's CA store (no ?ca=) and another CA: the certificate is
    // not trusted, and the message says to give its CA.
    for u in [
        format!("rediss-cluster://127.0.0.1:{base}/d"),
        format!(
            "rediss-cluster://127.0.0.1:{base}/d?ca={}",
            other_ca.display()
        ),
    ] {
        let e = open_err(&url(&u), &[]);
        assert!(matches!(e, OpenError::Tls { .. }), "{u}: {e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "the TLS connection to the Redis Cluster at 127.0.0.1:{base} (TLS) failed: "
            )),
            "{msg}"
        );
        assert!(msg.contains("give its CA with ?ca=PATH"), "{msg}");
        assert_eq!(upager::ErrorCode::errno(&e), libc::EPROTO);
    }
    // A plain client on the TLS port: an error, in bounded time.
    let e = open_err(&url(&format!("redis-cluster://127.0.0.1:{base}/d")), &[]);
    assert!(matches!(e, OpenError::Reset { .. }), "{e}");
    assert!(
        e.to_string()
            .ends_with("(a TLS-only port? connect over TLS with rediss-cluster://)"),
        "{e}"
    );
    // A TLS client on a port that is not TLS (an HTTP-like listener).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        for _ in 0..4 {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 512];
            let _ = std::io::Read::read(&mut s, &mut buf);
            let _ = std::io::Write::write_all(&mut s, b"-ERR unknown command\r\n");
        }
    });
    let e = open_err(
        &url(&format!(
            "rediss-cluster://127.0.0.1:{port}/d?ca={ca_param}"
        )),
        &[],
    );
    assert!(matches!(e, OpenError::Tls { .. }), "{e}");
    assert!(e.to_string().contains("is that port a TLS port"), "{e}");
    drop(server);

    // Files of the URL that cannot be used.
    let e = open_err(
        &url(&format!(
            "rediss-cluster://127.0.0.1:{base}/d?ca=/nonexistent/ca.crt"
        )),
        &[],
    );
    assert!(
        e.to_string().starts_with(
            "cannot read the CA (?ca=) file /nonexistent/ca.crt given in the store URL: "
        ),
        "{e}"
    );
    let not_pem = d.join("server.csr.txt");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let e = open_err(
        &url(&format!(
            "rediss-cluster://127.0.0.1:{base}/d?ca={}",
            not_pem.display()
        )),
        &[],
    );
    assert!(e.to_string().contains("holds no PEM block"), "{e}");
}
