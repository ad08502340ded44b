//! Datasets as a whole (upload, list, delete), through the built `upager`
//! binary against a cluster of this test's own (ports 21310-21315): an upload stopped by SIGTERM leaves
//! nothing; one killed by SIGKILL leaves an incomplete dataset that does
//! not open, is listed as incomplete, refuses a new load while fresh and
//! is removed by `upager delete`, or replaced by a new load once stale
//! (none of its chunks showing through); `load` of a directory or a FIFO writes
//! nothing; `list` and `delete` round trip.
#![allow(clippy::tests_outside_test_module)]

#[path = "../../redis/tests/common/mod.rs"]
mod common;

use std::io::Write as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::Cluster;
use upager_redis::RedisOptions;

fn upager(args: &[&str]) -> Output {
    let child = spawn(args);
    finish(child, Duration::from_secs(120), &args.join(" "))
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_upager"))
        .args(args)
        .env_remove("UPAGER_FAULT_MODE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the upager binary")
}

/// Waits for `child` at most `limit` (killed and a failure past it).
fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("`upager {what}` did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Keys of dataset `name` (metadata, upload hash, chunks) on any master
/// (replicas copy them, a little later), sorted.
fn keys_of(c: &Cluster, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in c.base..c.base + 6 {
        let Ok(mut conn) = redis::Client::open(format!("redis://127.0.0.1:{p}"))
            .and_then(|cl| cl.get_connection_with_timeout(Duration::from_secs(5)))
        else {
            continue;
        };
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn).unwrap();
        if !matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            continue;
        }
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("upager:{{{name}*"))
            .query(&mut conn)
            .unwrap();
        out.extend(keys);
    }
    out.sort();
    out
}

/// Waits until `list` shows `name` (incomplete): the upload has begun.
fn wait_listed(c: &Cluster, name: &str, child: &mut Child) {
    let t = Instant::now();
    loop {
        let all = upager_redis::list(&c.url, &RedisOptions::default()).unwrap();
        if all.iter().any(|d| d.name == name && !d.complete) {
            return;
        }
        if let Some(s) = child.try_wait().unwrap() {
            panic!(
                "the load of {name} ended ({s}) before it was seen running: make the file bigger"
            );
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{name} never listed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the running load of `name` has written some of its chunks
/// (more than two keys), so that a signal sent next lands mid-upload: a
/// fixed sleep after the listing let a fast machine finish the 256 MiB
/// upload first (seen: SIGKILL 300 ms after the listing came too late).
fn wait_chunks(c: &Cluster, name: &str, child: &mut Child) {
    let t = Instant::now();
    while keys_of(c, name).len() <= 2 {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("the load of {name} ended ({s}) before it wrote chunks: make the file bigger");
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{name} wrote no chunks"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the load of {name} ended before the signal: make the file bigger"
    );
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn interrupted_uploads_leave_nothing_visible_and_list_delete_round_trip() {
    let Some(c) = Cluster::start(21310) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("upager-cli-datasets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 256 MiB of non-zero chunks: the upload takes seconds here.
    let big = dir.join("big.bin");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8 | 1).collect();
        for k in 0..256u32 {
            let mut b = block.clone();
            b[..4].copy_from_slice(&k.to_le_bytes());
            f.write_all(&b).unwrap();
        }
    }
    let big = big.to_str().unwrap();
    let url = |name: &str| c.named(name).to_string();

    // SIGTERM mid-upload: nothing is left, the name does not open.
    let mut child = spawn(&["load", big, &url("sig")]);
    wait_listed(&c, "sig", &mut child);
    wait_chunks(&c, "sig", &mut child);
    signal(&child, "-TERM");
    let t = Instant::now();
    let o = finish(child, Duration::from_secs(60), "load (SIGTERM)");
    let out = text(&o);
    eprintln!("SIGTERM: load ended after {:?}: {out}", t.elapsed());
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("interrupted"), "{out}");
    assert!(out.contains("nothing of it is left"), "{out}");
    let e = upager_redis::RedisStore::open(&c.named("sig"), false, &RedisOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no dataset 'sig'"), "{e}");
    assert_eq!(keys_of(&c, "sig"), Vec::<String>::new());

    // SIGKILL mid-upload: an incomplete dataset, invisible, listed,
    // refused to a new load while fresh, removed by delete.
    let mut child = spawn(&["load", big, &url("killed")]);
    wait_listed(&c, "killed", &mut child);
    wait_chunks(&c, "killed", &mut child);
    signal(&child, "-KILL");
    finish(child, Duration::from_secs(30), "load (SIGKILL)");
    let e = upager_redis::RedisStore::open(&c.named("killed"), false, &RedisOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("incomplete upload"), "{e}");
    let o = upager(&["list", &c.url.to_string()]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let line = out.lines().find(|l| l.starts_with("killed")).unwrap_or("");
    assert!(
        line.contains("256 MiB") && line.contains("incomplete"),
        "{out}"
    );
    let o = upager(&["load", big, &url("killed")]);
    assert!(!o.status.success());
    assert!(text(&o).contains("being uploaded"), "{}", text(&o));
    let o = upager(&["delete", &url("killed")]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("incomplete"), "{}", text(&o));
    assert_eq!(keys_of(&c, "killed"), Vec::<String>::new());

    // A killed upload whose heartbeat is old (made so here, instead of
    // waiting a minute) is replaced by a new load, and none of its chunks
    // shows through the new dataset's zero chunks.
    let mut child = spawn(&["load", big, &url("stale")]);
    wait_listed(&c, "stale", &mut child);
    wait_chunks(&c, "stale", &mut child);
    signal(&child, "-KILL");
    finish(child, Duration::from_secs(30), "load (SIGKILL)");
    let left = keys_of(&c, "stale").len();
    assert!(left > 2, "the killed upload wrote chunks: {left} keys");
    let _: i64 = redis::cmd("HSET")
        .arg("upager:{stale}:upload")
        .arg("beat")
        .arg(0)
        .query(&mut c.client())
        .unwrap();
    let sparse = dir.join("sparse.bin");
    let mut data = vec![0u8; 1 << 20];
    data[..1 << 16].fill(9); // chunk 0 only; chunks 1-15 are zeros
    std::fs::write(&sparse, &data).unwrap();
    let o = upager(&["load", sparse.to_str().unwrap(), &url("stale")]);
    assert!(o.status.success(), "{}", text(&o));
    {
        use upager::Store;
        let st = upager_redis::RedisStore::open(&c.named("stale"), false, &RedisOptions::default())
            .unwrap();
        assert_eq!(st.len(), 1 << 20);
        let mut buf = vec![1u8; 1 << 20];
        assert_eq!(st.read_at(&mut buf, 0).unwrap(), 1 << 20);
        assert!(buf == data, "a chunk of the replaced upload shows through");
    }
    assert_eq!(
        keys_of(&c, "stale"),
        ["upager:{stale/0}:0", "upager:{stale}:meta"]
    );
    let o = upager(&["delete", &url("stale")]);
    assert!(o.status.success(), "{}", text(&o));

    // A directory and a FIFO: refused before anything is written.
    let o = upager(&["load", dir.to_str().unwrap(), &url("dir")]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("is a directory, not a regular file"),
        "{}",
        text(&o)
    );
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let o = upager(&["load", fifo.to_str().unwrap(), &url("fifo")]);
    assert!(!o.status.success());
    assert!(text(&o).contains("FIFO"), "{}", text(&o));
    assert_eq!(keys_of(&c, "dir"), Vec::<String>::new());
    assert_eq!(keys_of(&c, "fifo"), Vec::<String>::new());

    // list / delete round trip.
    let small = dir.join("small.bin");
    std::fs::write(&small, vec![7u8; 1 << 20]).unwrap();
    let small = small.to_str().unwrap();
    for name in ["one", "two"] {
        let o = upager(&["load", small, &url(name), "--chunk", "16K"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = upager(&["list", &c.url.to_string()]);
    let out = text(&o);
    let names: Vec<&str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["one", "two"], "{out}");
    for l in out.lines().skip(1) {
        assert!(
            l.contains("1 MiB") && l.contains("16 KiB") && l.contains("complete"),
            "{out}"
        );
    }
    let o = upager(&["delete", &url("one")]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("deleted"), "{}", text(&o));
    let all = upager_redis::list(&c.url, &RedisOptions::default()).unwrap();
    assert_eq!(
        all.iter()
            .map(|d| (d.name.as_str(), d.len, d.complete))
            .collect::<Vec<_>>(),
        [("two", 1 << 20, true)]
    );
    assert_eq!(keys_of(&c, "one"), Vec::<String>::new());
    let o = upager(&["delete", &url("one")]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no dataset 'one'"), "{}", text(&o));
    let o = upager(&["delete", &c.url.to_string()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("names no dataset"), "{}", text(&o));
    // The remaining one still reads back whole.
    {
        use upager::Store;
        let st = upager_redis::RedisStore::open(&c.named("two"), false, &RedisOptions::default())
            .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        assert_eq!(st.read_at(&mut buf, 0).unwrap(), 1 << 20);
        assert!(buf.iter().all(|&b| b == 7));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
