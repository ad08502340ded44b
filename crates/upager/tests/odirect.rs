//! The file systems users have. A file is mapped on tmpfs,
//! on overlayfs (over tmpfs and over the root file system, as in every
//! container), and on a FUSE passthrough file system, in both fault modes,
//! read-only and writable: every byte read through the region equals the
//! pattern, a few words written and flushed are in the file for plain I/O
//! afterwards. The FUSE file system also runs in a mode that accepts
//! `O_DIRECT` at open and fails the reads and writes with EINVAL (what
//! LazyFS does): there the accesses must all succeed, the store must fall
//! back to its buffered descriptor, and the log must say so once per store,
//! naming the file. An anonymous region whose swap file is on that file
//! system meets the refusal on its write-back (io_uring batches and
//! `pwrite`) first. See docs/reliability.md ("O_DIRECT refused after
//! open").
//!
//! The FUSE daemon is `tests/fuse/passthrough.c` (libfuse 3), built here
//! with `cc`; `scripts/setup.sh` installs libfuse3-dev and fuse3. Without
//! /dev/fuse, the library or the mount privilege the FUSE tests skip with
//! a reason, and fail under `CI=true`. Every wait is bounded; the mounts
//! are undone by guards, also when a test fails.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use upager::{FaultMode, FileStore, MapOptions, Pager, Stats, Store};

const MIB: u64 = 1 << 20;
/// Size of each test file: four times the budget, so folios are evicted
/// (and dirty ones written back in batches) while the region is read.
const FILE: u64 = 8 * MIB;
const BUDGET: u64 = 2 * MIB;
const FOLIO: u64 = 64 << 10;
/// Every this many words one is written (and flushed).
const STRIDE: usize = 509;
/// What the log says on a fallback (the message of `Fds::report`).
const FALLBACK: &str = "accepted O_DIRECT at open but refused an O_DIRECT";

/// The fallback messages logged so far that name `what`.
fn fallbacks_naming(what: &str) -> Vec<String> {
    LOG.0
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(FALLBACK) && l.contains(what))
        .cloned()
        .collect()
}

/// Runs `f` on a thread and waits for it at most `secs` (a hang fails the
/// test instead of stalling it; the mounts' guards still run).
fn bounded<T: Send + 'static>(what: &str, secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not finish within {secs} s"))
}

/// One mapping of the exercise: fault mode, writable, its file's name and
/// pattern seed.
fn cases() -> Vec<(FaultMode, bool, String, u64)> {
    let mut out = Vec::new();
    for (m, mode) in [FaultMode::Handlers, FaultMode::InThread]
        .into_iter()
        .enumerate()
    {
        for (w, writable) in [false, true].into_iter().enumerate() {
            let name = format!("{mode}-{}", if writable { "rw" } else { "ro" });
            out.push((mode, writable, name, 280 + 2 * m as u64 + w as u64));
        }
    }
    out
}

/// Makes the files of [`cases`] (and `probe`) in `dir`.
fn make_files(dir: &Path) {
    for (_, _, name, seed) in cases() {
        pattern_file(dir, &name, FILE, seed);
    }
    pattern_file(dir, "probe", MIB, 279);
}

/// What the file system did with O_DIRECT: accepted at open, and whether
/// an aligned read through the store kept the direct descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirectIo {
    at_open: bool,
    after_read: bool,
}

/// Opens `path` as a store with direct I/O asked for and reads 64 KiB.
fn probe(path: &Path) -> DirectIo {
    let st = FileStore::open(path, false, true).unwrap();
    let at_open = st.direct_io();
    let mut buf = upager_sys::mem::AlignedBuf::zeroed(FOLIO as usize);
    assert_eq!(st.read_at(&mut buf, 0).unwrap(), FOLIO as usize);
    for (i, c) in buf.chunks(8).enumerate() {
        let v = u64::from_le_bytes(c.try_into().unwrap());
        assert_eq!(v, word(i as u64 * 8, 279), "{}: word {i}", path.display());
    }
    DirectIo {
        at_open,
        after_read: st.direct_io(),
    }
}

/// Maps every file of [`cases`] in `dir` (made by [`make_files`], perhaps
/// through another path to the same files) with direct I/O on: reads every
/// word and compares it with the pattern; if writable writes every
/// [`STRIDE`]th word, flushes, and reads all again through the region;
/// then reads the file with plain I/O. Each case runs bounded. Returns
/// each case's file and the pager's counters.
fn exercise(fs: &str, dir: &Path) -> Vec<(PathBuf, FaultMode, Stats)> {
    let mut out = Vec::new();
    for (mode, writable, name, seed) in cases() {
        let path = dir.join(&name);
        let what = format!("{fs}: {name}");
        let p = path.clone();
        let stats = bounded(&what.clone(), 120, move || {
            let pager = Pager::builder()
                .budget(BUDGET)
                .fault_mode(mode)
                .direct_io(true)
                .build()
                .expect("pager (needs /dev/userfaultfd: run as root)");
            let opts = MapOptions::new().writable(writable).folio(FOLIO);
            let r = pager
                .map_file(&p, &opts)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let words = r.words();
            assert_eq!(words.len() as u64, FILE / 8);
            for (i, w) in words.iter().enumerate() {
                let v = w.load(Relaxed);
                if v != word(i as u64 * 8, seed) {
                    panic!(
                        "{what}: word {i} is {v:#x}, the file has {:#x}",
                        word(i as u64 * 8, seed)
                    );
                }
            }
            if writable {
                for i in (0..words.len()).step_by(STRIDE) {
                    words[i].store(!word(i as u64 * 8, seed), Relaxed);
                }
                r.flush().unwrap_or_else(|e| panic!("{what}: flush: {e}"));
                for (i, w) in words.iter().enumerate() {
                    let want = if i % STRIDE == 0 {
                        !word(i as u64 * 8, seed)
                    } else {
                        word(i as u64 * 8, seed)
                    };
                    assert_eq!(w.load(Relaxed), want, "{what}: word {i} after the flush");
                }
            }
            drop(r);
            let stats = pager.stats();
            drop(pager);
            stats
        });
        assert_eq!(stats.read_errors, 0, "{fs}: {name}: {stats:?}");
        assert_eq!(stats.writeback_errors, 0, "{fs}: {name}: {stats:?}");
        assert!(stats.evictions > 0, "{fs}: {name}: the budget made room");
        if mode == FaultMode::InThread {
            assert!(stats.faults_in_thread > 0, "{fs}: {name}: {stats:?}");
        }
        // Plain I/O: the file as a program sees it now.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, FILE);
        for (i, c) in bytes.chunks(8).enumerate() {
            let v = u64::from_le_bytes(c.try_into().unwrap());
            let want = if writable && i % STRIDE == 0 {
                !word(i as u64 * 8, seed)
            } else {
                word(i as u64 * 8, seed)
            };
            assert_eq!(v, want, "{fs}: {name}: word {i} of the file read back");
        }
        out.push((path, mode, stats));
    }
    out
}

/// Checks that nothing was logged about a fallback for `files`.
#[track_caller]
fn no_fallback(fs: &str, files: &[(PathBuf, FaultMode, Stats)]) {
    for (path, _, _) in files {
        let l = fallbacks_naming(&path.display().to_string());
        assert!(l.is_empty(), "{fs}: {l:?}");
    }
}

#[test]
fn tmpfs_maps_read_only_and_writable() {
    capture_log();
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    make_files(dir.path());
    let d = probe(&dir.path().join("probe"));
    eprintln!("tmpfs: {d:?}");
    assert_eq!(d.at_open, d.after_read, "tmpfs: {d:?}");
    let files = exercise("tmpfs", dir.path());
    no_fallback("tmpfs", &files);
}

/// An overlayfs mount (root), undone on drop.
struct Overlay {
    mnt: tempfile::TempDir,
    base: tempfile::TempDir,
}

impl Overlay {
    /// Mounts an overlay whose lower, upper and work directories are in
    /// `under`; `fill` makes the lower layer's files first (a lower layer
    /// must not change under a mount). None (skip; a failure under CI) if
    /// mounting is not allowed.
    #[track_caller]
    fn mount(under: &Path, fill: impl FnOnce(&Path)) -> Option<Overlay> {
        let base = tempfile::Builder::new()
            .prefix("upager-overlay")
            .tempdir_in(under)
            .unwrap();
        for d in ["lower", "upper", "work"] {
            std::fs::create_dir(base.path().join(d)).unwrap();
        }
        fill(&base.path().join("lower"));
        let mnt = tempfile::Builder::new()
            .prefix("upager-overlay-mnt")
            .tempdir_in("/tmp")
            .unwrap();
        let b = base.path().display();
        setup_command(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o"])
                .arg(format!(
                    "lowerdir={b}/lower,upperdir={b}/upper,workdir={b}/work"
                ))
                .arg(mnt.path()),
            "no overlayfs here (mounting needs root): mount -t overlay",
        )?;
        Some(Overlay { mnt, base })
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.mnt.path())
            .status();
    }
}

/// The file system type of `path` (df), for the report.
fn fs_type(path: &Path) -> String {
    let out = Command::new("df")
        .args(["--output=fstype"])
        .arg(path)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines().nth(1).unwrap_or("?").trim().to_string()
}

#[test]
fn overlayfs_maps_read_only_and_writable() {
    capture_log();
    // Layers on tmpfs, and on the root file system (what a container's
    // overlay sits on).
    for under in ["/dev/shm", "/var/tmp"] {
        let Some(ov) = Overlay::mount(Path::new(under), make_files) else {
            return;
        };
        let fs = format!("overlayfs over {} ({under})", fs_type(Path::new(under)));
        let d = probe(&ov.mnt.path().join("probe"));
        eprintln!("{fs}: {d:?}");
        assert_eq!(d.at_open, d.after_read, "{fs}: {d:?}");
        let files = exercise(&fs, ov.mnt.path());
        no_fallback(&fs, &files);
        // The writable files were copied up; the read-only ones were not.
        for (path, _, _) in &files {
            let name = path.file_name().unwrap();
            let up = ov.base.path().join("upper").join(name).exists();
            assert_eq!(
                up,
                name.to_string_lossy().ends_with("-rw"),
                "{fs}: {name:?}"
            );
        }
    }
}

/// The FUSE passthrough daemon, built once per run (None: why it cannot
/// be built here).
fn fuse_daemon() -> Result<PathBuf, String> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuse/passthrough.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("upager-fuse-passthrough");
        let flags = Command::new("pkg-config")
            .args(["--cflags", "--libs", "fuse3"])
            .output()
            .map_err(|e| format!("cannot run pkg-config ({e})"))?;
        if !flags.status.success() {
            return Err(
                "pkg-config finds no fuse3 (Debian: libfuse3-dev; scripts/setup.sh)".into(),
            );
        }
        let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
        let cc = Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(src)
            .args(flags.split_whitespace())
            .output()
            .map_err(|e| format!("cannot run cc ({e})"))?;
        if !cc.status.success() {
            return Err(format!(
                "building {src} failed: {}",
                String::from_utf8_lossy(&cc.stderr)
            ));
        }
        Ok(out)
    })
    .clone()
}

/// A mounted FUSE passthrough file system over a directory of its own;
/// unmounted and its daemon ended on drop (also when the test fails).
struct Fuse {
    /// The daemon (foreground, `-f`).
    child: Child,
    /// Its standard error, line by line ("refused read" per refusal).
    err: Arc<Mutex<Vec<String>>>,
    mnt: tempfile::TempDir,
    /// The directory behind the mount.
    source: tempfile::TempDir,
}

impl Fuse {
    /// Mounts the passthrough in `mode` ("plain", "einval-direct") over a
    /// new directory on tmpfs that `fill` fills first. None (skip; a
    /// failure under CI) without /dev/fuse, libfuse 3 or the privilege.
    #[track_caller]
    fn mount(mode: &str, fill: impl FnOnce(&Path)) -> Option<Fuse> {
        if !Path::new("/dev/fuse").exists() {
            skip_or_fail("no /dev/fuse here (a FUSE file system cannot be mounted)");
            return None;
        }
        let bin = match fuse_daemon() {
            Ok(b) => b,
            Err(e) => {
                skip_or_fail(&format!("no FUSE passthrough daemon: {e}"));
                return None;
            }
        };
        let source = ram_dir();
        fill(source.path());
        let mnt = tempfile::Builder::new()
            .prefix("upager-fuse")
            .tempdir_in("/tmp")
            .unwrap();
        let mut child = Command::new(&bin)
            .arg(mode)
            .arg(source.path())
            .arg(mnt.path())
            .args(["-f", "-o", "fsname=upager-test"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = Arc::new(Mutex::new(Vec::new()));
        let pipe = child.stderr.take().unwrap();
        let e = Arc::clone(&err);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                e.lock().unwrap().push(line);
            }
        });
        let mut fuse = Fuse {
            child,
            err,
            mnt,
            source,
        };
        // Wait (bounded) until the mount is in place.
        let want = format!(" {} ", fuse.mnt.path().display());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            if info
                .lines()
                .any(|l| l.contains(&want) && l.contains("fuse"))
            {
                return Some(fuse);
            }
            if let Ok(Some(st)) = fuse.child.try_wait() {
                let why = fuse.err.lock().unwrap().join("; ");
                skip_or_fail(&format!(
                    "the FUSE daemon exited ({st}) before mounting: {why}"
                ));
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "the FUSE file system was not mounted within 10 s: {:?}",
                fuse.err.lock().unwrap()
            );
            // The poll interval of this bounded wait.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn path(&self) -> &Path {
        self.mnt.path()
    }

    /// Waits (at most 10 s) until the daemon reported more than `n`
    /// refused `call`s: its lines reach the test through a pipe and a
    /// reader thread, after the refusal itself.
    #[track_caller]
    fn refused_more_than(&self, call: &str, n: usize) {
        let what = format!("the daemon to report more than {n} refused {call}s");
        wait_until(&what, 10, || self.refused(call) > n);
    }

    /// Calls the daemon reported refused so far ("read" or "write").
    fn refused(&self, call: &str) -> usize {
        let want = format!("refused {call}");
        self.err
            .lock()
            .unwrap()
            .iter()
            .filter(|l| **l == want)
            .count()
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        // Unmount (lazily: a test that failed may still have files open),
        // which ends the daemon; end it anyway if it does not go.
        let unmounted = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(self.mnt.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.mnt.path())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            // The poll interval of this bounded wait.
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn fuse_passthrough_maps_read_only_and_writable() {
    capture_log();
    let Some(fuse) = Fuse::mount("plain", make_files) else {
        return;
    };
    let d = probe(&fuse.path().join("probe"));
    eprintln!("FUSE passthrough: {d:?}");
    assert_eq!(
        d,
        DirectIo {
            at_open: true,
            after_read: true
        },
        "FUSE accepts O_DIRECT at open and the passthrough serves it"
    );
    let files = exercise("FUSE passthrough", fuse.path());
    no_fallback("FUSE passthrough", &files);
    assert_eq!(fuse.refused("read") + fuse.refused("write"), 0);
    // The writes reached the directory behind the mount too.
    let (path, _, _) = files
        .iter()
        .find(|(p, _, _)| p.ends_with("handlers-rw"))
        .unwrap();
    let back = std::fs::read(fuse.source.path().join("handlers-rw")).unwrap();
    assert_eq!(back, std::fs::read(path).unwrap());
}

#[test]
fn fuse_refusing_o_direct_io_falls_back_to_buffered_and_says_so_once() {
    capture_log();
    let Some(fuse) = Fuse::mount("einval-direct", make_files) else {
        return;
    };
    // The store alone: open accepts O_DIRECT, the read is refused and done
    // again buffered (the data checked by `probe`), and the store drops
    // its direct descriptor.
    let probe_path = fuse.path().join("probe");
    let d = probe(&probe_path);
    eprintln!("FUSE refusing O_DIRECT I/O: {d:?}");
    assert_eq!(
        d,
        DirectIo {
            at_open: true,
            after_read: false
        }
    );
    fuse.refused_more_than("read", 0);
    let l = fallbacks_naming(&probe_path.display().to_string());
    assert_eq!(l.len(), 1, "one message: {l:?}");
    assert!(
        l[0].starts_with(&format!("file {}: ", probe_path.display()))
            && l[0].contains("refused an O_DIRECT read (Invalid argument")
            && l[0].contains("direct_io(false)"),
        "{}",
        l[0]
    );

    // Regions: every access succeeds, one message per store (file), also
    // when the first refusal met a read in the SIGBUS handler (in-thread
    // mode), whose message waits for a call outside it.
    let files = exercise("FUSE refusing O_DIRECT I/O", fuse.path());
    for (path, mode, _) in &files {
        let l = fallbacks_naming(&path.display().to_string());
        assert_eq!(l.len(), 1, "{mode} {}: {l:?}", path.display());
        assert!(l[0].contains("O_DIRECT read (Invalid argument"), "{}", l[0]);
    }
    // The probe's store and each mapped file's met at least one refusal.
    fuse.refused_more_than("read", files.len());

    // An anonymous region swapping to this file system: its first direct
    // I/O is a write-back (a batch through io_uring, or one `pwrite` per
    // folio without batched write-back), refused; the swap file falls
    // back, nothing is lost.
    for (mode, batched) in [
        (FaultMode::Handlers, true),
        (FaultMode::InThread, true),
        (FaultMode::Handlers, false),
    ] {
        let before = fuse.refused("write");
        let swap_dir = fuse.path().join(format!("swap-{mode}-{batched}"));
        std::fs::create_dir(&swap_dir).unwrap();
        let sd = swap_dir.clone();
        let stats = bounded("the swap exercise", 120, move || {
            let pager = Pager::builder()
                .budget(BUDGET)
                .fault_mode(mode)
                .swap_dir(&sd)
                .batched_writeback(batched)
                .direct_io(true)
                .build()
                .expect("pager");
            // The swap file's writes are the subject: without the
            // compressed tier, which would keep this data in memory.
            let r = pager
                .map_anonymous(FILE, &MapOptions::new().folio(FOLIO).compressed_tier(false))
                .unwrap();
            let words = r.words();
            for (i, w) in words.iter().enumerate() {
                w.store(word(i as u64 * 8, 290), Relaxed);
            }
            for (i, w) in words.iter().enumerate() {
                assert_eq!(w.load(Relaxed), word(i as u64 * 8, 290), "{mode}: word {i}");
            }
            drop(r);
            let s = pager.stats();
            drop(pager);
            s
        });
        assert!(stats.writebacks > 0 && stats.evictions > 0, "{stats:?}");
        assert_eq!(stats.writeback_errors, 0, "{stats:?}");
        assert_eq!(stats.read_errors, 0, "{stats:?}");
        // The daemon refused the swap file's direct write.
        fuse.refused_more_than("write", before);
        let l = fallbacks_naming(&format!("swap file {}", swap_dir.display()));
        assert_eq!(l.len(), 1, "{mode}: {l:?}");
        // Where io_uring is refused (seccomp) or masked,
        // batches are written with pwrite.
        let call = if batched && upager_sys::uring::WriteRing::new(8).is_ok() {
            "write (io_uring)"
        } else {
            "write ("
        };
        assert!(
            l[0].contains(&format!("refused an O_DIRECT {call}")),
            "{}",
            l[0]
        );
    }
}
