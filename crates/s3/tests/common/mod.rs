//! SeaweedFS for the S3 store's tests, through scripts/seaweedfs.sh: the
//! weed binary (built once and cached; the build waited for), a server
//! per port base, and the test credentials as a settings source.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use upager_s3::config::Env;
use upager_s3::{S3Options, S3Url};

pub const MIB: u64 = 1 << 20;
pub const KEY: &str = "upager-test-key";
pub const SECRET: &str = "upager-test-secret";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/seaweedfs.sh")
}

fn script_cmd(base: u16) -> Command {
    let mut c = Command::new("bash");
    c.arg(script())
        .env("UPAGER_WEED_PORT", base.to_string())
        .env("UPAGER_WEED_TIMEOUT", "90");
    c
}

/// Whether weed is there: built already, or built now (waiting for a
/// background build scripts/setup.sh started, at most an hour). Without
/// it a test is skipped with a message, except under CI=true, where that
/// is a failure.
pub fn have_weed() -> bool {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    let r = OK.get_or_init(|| {
        let out = script_cmd(0)
            .args(["wait-build", "3600"])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            return Ok(());
        }
        // No build running: build now (minutes with a warm module cache).
        let out = script_cmd(0)
            .arg("build")
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    match r {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the weed binary (SeaweedFS) cannot be built under CI=true: {e}"
            );
            eprintln!("SKIPPED: the weed binary (SeaweedFS) cannot be built: {e}");
            false
        }
    }
}

/// A running SeaweedFS; stopped on drop (a shared one when the test
/// process exits: the script's owner reaper).
pub struct Server {
    pub base: u16,
    pub endpoint: String,
    owned: bool,
}

impl Server {
    /// Starts a server on ports `base..base+5` (and +10000), or None
    /// without weed.
    pub fn start(base: u16) -> Option<Server> {
        Self::start_as(base, true)
    }

    fn start_as(base: u16, owned: bool) -> Option<Server> {
        if !have_weed() {
            return None;
        }
        let mut c = script_cmd(base);
        c.arg("start");
        if !owned {
            c.env("UPAGER_WEED_OWNER", std::process::id().to_string());
        }
        let out = c.output().expect("run scripts/seaweedfs.sh");
        assert!(
            out.status.success(),
            "seaweedfs start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoint = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(endpoint, format!("http://127.0.0.1:{}", base + 5));
        Some(Server {
            base,
            endpoint,
            owned,
        })
    }

    /// One server for all the tests of this process that share it.
    pub fn shared(base: u16) -> Option<&'static Server> {
        static S: OnceLock<Option<Server>> = OnceLock::new();
        S.get_or_init(|| Self::start_as(base, false)).as_ref()
    }

    /// The test binary's shared server on `base` with `bucket` made, or
    /// None without weed.
    pub fn shared_bucket(base: u16, bucket: &str) -> Option<&'static Server> {
        let s = Self::shared(base)?;
        s.bucket(bucket);
        Some(s)
    }

    pub fn run(&self, args: &[&str]) -> std::process::Output {
        script_cmd(self.base)
            .args(args)
            .output()
            .expect("run scripts/seaweedfs.sh")
    }

    /// Creates `bucket`.
    pub fn bucket(&self, bucket: &str) {
        let out = self.run(&["mb", bucket]);
        assert!(
            out.status.success(),
            "mb {bucket}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The URL of `bucket/key` on this server.
    pub fn url(&self, bucket: &str, key: &str) -> S3Url {
        format!("s3://{bucket}/{key}?endpoint={}", self.endpoint)
            .parse()
            .unwrap()
    }

    /// The environment a client of this server gets.
    pub fn env(&self) -> TestEnv {
        TestEnv::new(&[
            ("AWS_ACCESS_KEY_ID", KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ])
    }

    /// The same as process environment variables (for a child process).
    pub fn env_vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("HOME", "/nonexistent".into()),
        ]
    }

    pub fn objects(&self, bucket: &str) -> upager_s3::Objects {
        upager_s3::Objects::open_with(&self.url(bucket, ""), &S3Options::default(), &self.env())
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.run(&["stop"]);
        }
    }
}

/// Settings from a map, with no profile files (HOME has no .aws).
pub struct TestEnv(HashMap<String, String>);

impl TestEnv {
    pub fn new(vars: &[(&str, &str)]) -> TestEnv {
        TestEnv(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
}

impl Env for TestEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
    fn home(&self) -> Option<PathBuf> {
        Some(PathBuf::from("/nonexistent"))
    }
}

/// The test pattern: word `i` of an object.
pub fn word(i: u64, seed: u64) -> u64 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed) | 1
}

/// An object of `len` bytes of the pattern.
pub fn pattern(len: u64, seed: u64) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|i| word(i, seed).to_le_bytes())
        .collect()
}
