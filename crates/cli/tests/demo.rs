//! `upager demo` leaves nothing behind, through the
//! built binary: SIGINT or SIGTERM mid-run removes the dataset and exits
//! with 130 / 143; a `--size` larger than the free space is refused before
//! anything is written; a missing `--dir` is refused and not created; a
//! directory left by a demo that crashed is removed by the next one. Every
//! wait is bounded (a run that does not end is killed and fails the test).
#![allow(clippy::tests_outside_test_module)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// A running demo: its output lines arrive on `lines` (stdout and stderr).
struct Demo {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Demo {
    fn start(args: &[&str]) -> Demo {
        let mut child = Command::new(env!("CARGO_BIN_EXE_upager"))
            .arg("demo")
            .args(args)
            .env_remove("UPAGER_FAULT_MODE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the upager binary");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            // indicatif redraws with \r: split on those too.
            for l in BufReader::new(err).split(b'\n').map_while(Result::ok) {
                for part in String::from_utf8_lossy(&l).split('\r') {
                    let _ = tx2.send(part.to_string());
                }
            }
        });
        Demo {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (at most `secs`) for a line containing `text`.
    fn wait_line(&mut self, text: &str, secs: u64) {
        let end = Instant::now() + Duration::from_secs(secs);
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(text);
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        panic!(
            "no line with {text:?} within {secs} s; output so far:\n{}",
            self.seen.join("\n")
        );
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill -{sig} failed");
    }

    /// Waits (at most `secs`) for the exit; returns the status and all
    /// output.
    fn finish(mut self, secs: u64) -> (ExitStatus, String) {
        let end = Instant::now() + Duration::from_secs(secs);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the demo did not exit within {secs} s; output:\n{}",
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The readers end at EOF; bounded anyway.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        (status, self.seen.join("\n"))
    }
}

/// A private directory for one test's datasets.
struct Private(PathBuf);

impl Private {
    fn new(name: &str) -> Private {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let p = base.join(format!("upager-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        Private(p)
    }
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Interrupts a demo in its random-read phase (SIGINT) and in the making
/// of its dataset (SIGTERM): each time the dataset is gone afterwards and
/// the exit status is 128 + the signal.
#[test]
fn sigint_and_sigterm_remove_the_dataset() {
    for (sig, code, phase) in [
        ("INT", 130, "sequential scan"),
        ("TERM", 143, "upager demo:"),
    ] {
        let dir = Private::new(&format!("sig{sig}"));
        let mut d = Demo::start(&[
            "--size",
            "64M",
            "--budget",
            "8M",
            "--threads",
            "1",
            "--reads",
            "1000000000",
            "--writes",
            "10",
            "--dir",
            dir.arg(),
        ]);
        d.wait_line(phase, 120);
        assert_eq!(
            dir.entries().len(),
            1,
            "the demo's directory should exist while it runs"
        );
        d.signal(sig);
        let (status, out) = d.finish(60);
        assert_eq!(
            status.code(),
            Some(code),
            "SIG{sig}: {status}; output:\n{out}"
        );
        assert!(out.contains(&format!("SIG{sig}: cleaning up")), "{out}");
        assert!(out.contains("removed"), "{out}");
        assert!(
            dir.entries().is_empty(),
            "SIG{sig} left {:?} in {}",
            dir.entries(),
            dir.arg()
        );
    }
}

/// `--size` beyond the free space: refused with the need and the free
/// space named, before the dataset is made. A directory left by a demo
/// that crashed (its process gone) is removed first.
#[test]
fn a_dataset_larger_than_the_free_space_is_refused_before_writing() {
    let dir = Private::new("nospace");
    // A crashed demo's leftovers: pid 4294967295 never exists.
    let stale = dir.0.join("upager-demo-4294967295");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("dataset.bin"), vec![7u8; 4096]).unwrap();
    let d = Demo::start(&["--size", "100T", "--budget", "8M", "--dir", dir.arg()]);
    let (status, out) = d.finish(60);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("free, but the dataset needs 100 TiB"), "{out}");
    assert!(
        out.contains("--dir DIR on a file system with room"),
        "{out}"
    );
    assert!(
        out.contains("left by an earlier demo (pid 4294967295)"),
        "{out}"
    );
    assert!(dir.entries().is_empty(), "left {:?}", dir.entries());

    // A small private tmpfs: 16 MiB, a 32 MiB dataset.
    let mnt = Private::new("tmpfs");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16M", "tmpfs", mnt.arg()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no private tmpfs (mount needs root)"
        );
        eprintln!("skipped the tmpfs half: mount -t tmpfs failed (needs root)");
        return;
    }
    struct Umount<'a>(&'a str);
    impl Drop for Umount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").args(["-l", self.0]).status();
        }
    }
    let _umount = Umount(mnt.arg());
    let d = Demo::start(&["--size", "32M", "--budget", "8M", "--dir", mnt.arg()]);
    let (status, out) = d.finish(60);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "{} has 16 MiB free, but the dataset needs 32 MiB",
            mnt.arg()
        )),
        "{out}"
    );
    assert!(mnt.entries().is_empty(), "left {:?}", mnt.entries());
}

#[test]
fn a_missing_dir_is_refused_and_not_created() {
    let missing = std::env::temp_dir().join(format!("upager-cli-missing-{}", std::process::id()));
    let d = Demo::start(&["--size", "1M", "--dir", missing.to_str().unwrap()]);
    let (status, out) = d.finish(60);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!("--dir {}: no such directory", missing.display())),
        "{out}"
    );
    assert!(!missing.exists(), "{} was created", missing.display());
    let d = Demo::start(&["--size", "1M", "--dir", "/nonexistent"]);
    let (status, out) = d.finish(60);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains("--dir /nonexistent: no such directory"),
        "{out}"
    );
    assert!(!Path::new("/nonexistent").exists());
}
