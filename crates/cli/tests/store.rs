//! The CLI's Redis Cluster commands end to end, through the
//! built `upager` binary against a local cluster of this test's own (ports
//! 21200-21205): `upager load` uploads a file (and refuses an existing
//! name, or an unreachable cluster, with a clear message), `upager demo
//! --store` pages its dataset through the cluster, verifies every byte read
//! back from it and deletes it.
#![allow(clippy::tests_outside_test_module)]

#[path = "../../redis/tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};

use common::Cluster;

fn upager(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_upager"))
        .args(args)
        .env_remove("UPAGER_FAULT_MODE")
        .output()
        .expect("run the upager binary")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn load_and_demo_run_through_a_cluster() {
    let Some(c) = Cluster::start(21200) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("upager-cli-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("data.bin");
    let data: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let file = file.to_str().unwrap();
    let url = c.named("cli-load").to_string();

    let o = upager(&["load", file, &url, "--chunk", "16K"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("uploaded"), "{}", text(&o));
    // The dataset reads back as the file, through the store.
    {
        use upager::Store;
        let st = upager_redis::RedisStore::open(
            &c.named("cli-load"),
            false,
            &upager_redis::RedisOptions::default(),
        )
        .unwrap();
        assert_eq!(st.chunk(), 16 << 10);
        let mut buf = vec![0u8; data.len()];
        assert_eq!(st.read_at(&mut buf, 0).unwrap(), data.len());
        assert!(buf == data, "the uploaded dataset differs from the file");
    }
    let o = upager(&["load", file, &url]);
    assert!(!o.status.success());
    assert!(text(&o).contains("exists"), "{}", text(&o));
    let o = upager(&["load", file, "redis-cluster://127.0.0.1:1/x"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("127.0.0.1:1"), "{}", text(&o));
    let o = upager(&["load", file, "redis://127.0.0.1:7000/x"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("redis-cluster://"), "{}", text(&o));
    // `upager stat` on the dataset: read, never written; its pictures and
    // the store's counters. Its region is the dataset's size (no --size).
    let o = upager(&["stat", "--store", &url, "--budget", "512K"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("read-only region of") && out.contains("1 MiB, 16 KiB folios"),
        "{out}"
    );
    assert!(
        out.contains("read the first half") && out.contains("store_round_trips"),
        "{out}"
    );
    assert!(
        !out.lines().any(|l| l.starts_with("  |") && l.contains('#')),
        "nothing dirty: {out}"
    );
    let o = upager(&["stat", "--store", &url, "--size", "1M"]);
    assert!(
        !o.status.success() && text(&o).contains("--size"),
        "{}",
        text(&o)
    );

    let seed = c.url.to_string();
    let o = upager(&[
        "demo",
        "--size",
        "16M",
        "--budget",
        "4M",
        "--reads",
        "2000",
        "--writes",
        "2000",
        "--dir",
        dir.to_str().unwrap(),
        "--store",
        &seed,
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("verified every byte"), "{out}");
    assert!(out.contains("deleted"), "{out}");
    // The region's store counters, by their stable names.
    assert!(out.contains("store_round_trips"), "{out}");
    assert!(out.contains("store_writes_degraded        0"), "{out}");

    // SIGINT while the demo uploads its dataset: the upload stops at its
    // next batch and removes what it wrote, then the demo exits with 130
    // (before, it exited at once and left an incomplete dataset).
    let (status, out) = interrupt_in_upload(
        &[
            "--size",
            "256M",
            "--dir",
            dir.to_str().unwrap(),
            "--store",
            &seed,
        ],
        |pid| {
            upager_redis::list(&c.url, &upager_redis::RedisOptions::default())
                .unwrap()
                .iter()
                .any(|d| d.name == format!("upager-demo-{pid}") && !d.complete)
        },
    );
    assert_eq!(status.code(), Some(130), "{out}");
    assert!(out.contains("stopping the upload"), "{out}");
    let o = upager(&["list", &seed]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("upager-demo-"), "{}", text(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `upager demo ARGS`, sends it SIGINT once it has made its dataset
/// and `uploading(pid)` says its upload is running (a fixed 200 ms after
/// the dataset was made is most of a 256 MiB upload to a local cluster on
/// a fast run) and waits (60 s at most) for its exit: the status and all
/// it printed.
fn interrupt_in_upload(
    args: &[&str],
    uploading: impl Fn(u32) -> bool,
) -> (std::process::ExitStatus, String) {
    use std::io::{BufRead, BufReader, Read};
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_upager"))
        .arg("demo")
        .args(args)
        .env_remove("UPAGER_FAULT_MODE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the upager binary");
    let mut err = child.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut out = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for l in lines.by_ref().map_while(Result::ok) {
        out.push_str(&l);
        out.push('\n');
        if l.contains("made dataset") {
            break;
        }
    }
    let end = Instant::now() + Duration::from_secs(60);
    while !uploading(child.id()) {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("the demo ended ({s}) before its upload was seen:\n{out}");
        }
        assert!(Instant::now() < end, "the demo's upload never seen:\n{out}");
        std::thread::sleep(Duration::from_millis(2));
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("the demo did not end within 60 s of SIGINT:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for l in lines.map_while(Result::ok) {
        out.push_str(&l);
        out.push('\n');
    }
    out.push_str(&errs.join().unwrap());
    (status, out)
}

/// No command prints a URL's password, whether the URL
/// does not parse (clap would quote the argument), the cluster cannot be
/// reached, or the URL names no dataset; the messages quote it as `***`.
#[test]
fn no_command_prints_a_password() {
    let secret = "hunter2";
    let file = "/etc/hostname";
    for args in [
        vec![
            "list".to_string(),
            format!("redis://alice:{secret}@127.0.0.1:1"),
        ],
        vec![
            "list".into(),
            format!("redis-cluster://alice:{secret}@127.0.0.1:x"),
        ],
        vec![
            "list".into(),
            format!("redis-cluster://alice:{secret}@127.0.0.1:1"),
        ],
        vec![
            "delete".into(),
            format!("rediss-cluster://:{secret}@127.0.0.1:1"),
        ],
        vec![
            "delete".into(),
            format!("redis-cluster://:{secret}@127.0.0.1:1/d"),
        ],
        vec![
            "load".into(),
            file.into(),
            format!("redis-cluster://:{secret}@127.0.0.1:1"),
        ],
        vec![
            "load".into(),
            file.into(),
            format!("redis-cluster://:{secret}@127.0.0.1:1/d"),
        ],
        vec![
            "demo".into(),
            "--store".into(),
            format!("redis-cluster://alice:{secret}@127.0.0.1:1?ca=/x"),
        ],
        vec![
            "stat".into(),
            "--store".into(),
            format!("redis-cluster://alice:{secret}@127.0.0.1:1/d"),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = upager(&args);
        let out = text(&o);
        assert!(!o.status.success(), "{args:?}: {out}");
        assert!(
            !out.contains(secret),
            "{args:?} printed the password: {out}"
        );
        assert!(!out.trim().is_empty(), "{args:?}: no message");
        eprintln!("{args:?}: {}", out.trim());
    }
    let o = upager(&["list", &format!("redis://alice:{secret}@127.0.0.1:1")]);
    assert!(
        text(&o).contains("'redis://alice:***@127.0.0.1:1' is not a Redis Cluster store URL"),
        "{}",
        text(&o)
    );
    let o = upager(&["delete", &format!("rediss-cluster://:{secret}@127.0.0.1:1")]);
    assert!(
        text(&o).contains("rediss-cluster://:***@127.0.0.1:1/mydata"),
        "{}",
        text(&o)
    );
}
