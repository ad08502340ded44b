//! What is not a regular file is refused at map time
//! (a directory, a FIFO, a socket, a character device, a /proc file), a
//! block device is a store, and a file truncated under its mapping fails
//! the access beyond its new end (EFAULT / SIGBUS, logged), never serves
//! zeros for data it had and never hangs. Both fault modes where a fault
//! is involved. See docs/reliability.md ("Files that are not regular
//! files", "A file truncated under its mapping").

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::*;
use upager::{errno, ErrorCode, FaultMode, FileKind, MapError, MapOptions, Pager};

const MIB: u64 = 1 << 20;

fn pager(mode: FaultMode) -> Pager {
    Pager::builder()
        .budget(16 * MIB)
        .fault_mode(mode)
        .build()
        .expect("pager (needs /dev/userfaultfd: run as root)")
}

/// Maps `path` (read-only and writable) and checks it is refused as
/// `kind`, with its errno and a message naming the path and what to do;
/// the same for the open descriptor where one can be opened without
/// blocking.
#[track_caller]
fn refused(pager: &Pager, path: &Path, kind: FileKind, by_fd: bool) {
    for writable in [false, true] {
        for len in [None, Some(4096)] {
            let mut opts = MapOptions::new().writable(writable);
            if let Some(l) = len {
                opts = opts.len(l);
            }
            let e = match pager.map_file(path, &opts) {
                Err(e) => e,
                Ok(r) => panic!("{} was mapped ({} bytes)", path.display(), r.len()),
            };
            match &e {
                MapError::NotARegularFile { kind: k, .. } => assert_eq!(*k, kind, "{e}"),
                _ => panic!("{}: wrong error: {e:?}", path.display()),
            }
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!(
                    "{} is {kind}, which upager cannot page",
                    path.display()
                )),
                "{msg}"
            );
            assert!(msg.ends_with(kind.advice()), "{msg}");
            assert_eq!(e.errno(), kind.errno());
        }
    }
    if by_fd {
        let f = std::fs::File::open(path).unwrap();
        let e = pager.map_open_file(f, &MapOptions::new()).unwrap_err();
        assert!(
            matches!(e, MapError::NotARegularFile { kind: k, .. } if k == kind),
            "{e:?}"
        );
        assert!(e.to_string().starts_with("<file descriptor> is "), "{e}");
    }
}

#[test]
fn a_directory_is_refused_with_eisdir() {
    let pager = pager(FaultMode::Handlers);
    let dir = ram_dir();
    refused(&pager, dir.path(), FileKind::Directory, true);
    refused(&pager, Path::new("/tmp"), FileKind::Directory, true);
    let e = pager.map_file(dir.path(), &MapOptions::new()).unwrap_err();
    assert_eq!(e.errno(), errno::EISDIR);
    assert_eq!(
        e.to_string(),
        format!(
            "{} is a directory, which upager cannot page (it pages regular files and block \
             devices): pass the path of a file inside it",
            dir.path().display()
        )
    );
}

#[test]
fn fifos_sockets_and_character_devices_are_refused_with_enodev() {
    let pager = pager(FaultMode::Handlers);
    let dir = ram_dir();
    // A FIFO: refused before it is opened (opening would wait for a writer:
    // a hang if the check came after). Bounded anyway: the check runs on
    // a thread the test waits for.
    let fifo = dir.path().join("fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    let e = {
        let fifo = fifo.clone();
        bounded(
            "mapping a FIFO (opened before its type was checked?)",
            20,
            move || {
                self::pager(FaultMode::Handlers)
                    .map_file(&fifo, &MapOptions::new())
                    .map(|_| ())
            },
        )
    }
    .unwrap_err();
    assert!(
        matches!(
            e,
            MapError::NotARegularFile {
                kind: FileKind::Fifo,
                ..
            }
        ),
        "{e:?}"
    );
    refused(&pager, &fifo, FileKind::Fifo, false);
    assert_eq!(FileKind::Fifo.errno(), errno::ENODEV);

    // A socket (cannot be opened at all: ENXIO, so no descriptor check).
    let sock = dir.path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    refused(&pager, &sock, FileKind::Socket, false);

    // Character devices: size 0, /dev/zero would read as endless zeros.
    for dev in ["/dev/null", "/dev/zero", "/dev/urandom"] {
        refused(&pager, Path::new(dev), FileKind::CharDevice, true);
    }
}

#[test]
fn a_proc_file_is_refused_as_a_pseudo_file() {
    let pager = pager(FaultMode::Handlers);
    for p in [
        "/proc/self/status",
        "/proc/meminfo",
        "/sys/kernel/mm/transparent_hugepage/enabled",
    ] {
        if Path::new(p).exists() {
            refused(&pager, Path::new(p), FileKind::PseudoFile, true);
        }
    }
    // An empty regular file of an ordinary file system is not a pseudo-file:
    // it is refused for its size, as before.
    let dir = ram_dir();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let e = pager.map_file(&empty, &MapOptions::new()).unwrap_err();
    assert!(matches!(e, MapError::ZeroSize), "{e:?}");
}

/// A loop device over a file, detached on drop.
struct Loop {
    dev: PathBuf,
}

impl Loop {
    fn attach(file: &Path) -> Option<Loop> {
        let out = setup_command(
            Command::new("timeout")
                .args(["30", "losetup", "-f", "--show"])
                .arg(file),
            "no loop device for the block-device test: losetup",
        )?;
        Some(Loop {
            dev: PathBuf::from(out.trim()),
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("timeout")
            .args(["30", "losetup", "-d"])
            .arg(&self.dev)
            .status();
    }
}

#[test]
fn a_block_device_is_a_store_of_its_size() {
    for mode in [FaultMode::Handlers, FaultMode::InThread] {
        let dir = ram_dir();
        let size = 8 * MIB;
        let path = pattern_file(dir.path(), "disk", size, 61);
        let Some(lo) = Loop::attach(&path) else {
            return;
        };
        {
            let pager = pager(mode);
            // Its size comes from its end (st_size of a device is 0).
            let r = pager
                .map_file(&lo.dev, &MapOptions::new().writable(true))
                .unwrap_or_else(|e| panic!("{}: {e}", lo.dev.display()));
            assert_eq!(r.len() as u64, size);
            // A second region of the device shares the first one's store.
            let r2 = pager.map_file(&lo.dev, &MapOptions::new()).unwrap();
            assert_eq!(r2.len() as u64, size);
            assert_eq!(r2.words()[1].load(Relaxed), word(8, 61));
            drop(r2);
            let w = r.words();
            for i in (0..w.len()).step_by(4099) {
                assert_eq!(
                    w[i].load(Relaxed),
                    word(i as u64 * 8, 61),
                    "{mode}: word {i}"
                );
            }
            for i in (0..w.len()).step_by(8191) {
                w[i].store(!word(i as u64 * 8, 61), Relaxed);
            }
            r.flush().unwrap();
            r.unmap().map_err(|(e, _)| e).unwrap();
            // Beyond its end is refused like a file's.
            let e = pager
                .map_file(&lo.dev, &MapOptions::new().len(size + 4096))
                .unwrap_err();
            assert!(
                matches!(e, MapError::BeyondEnd { store_len, .. } if store_len == size),
                "{e:?}"
            );
        }
        drop(lo);
        let bytes = std::fs::read(&path).unwrap();
        for (i, c) in bytes.chunks(8).enumerate() {
            let v = u64::from_le_bytes(c.try_into().unwrap());
            let want = if i % 8191 == 0 {
                !word(i as u64 * 8, 61)
            } else {
                word(i as u64 * 8, 61)
            };
            assert_eq!(v, want, "{mode}: word {i} of the file behind the device");
        }
    }
}

/// Runs `f` on a thread and waits for it at most `secs` (a hang fails the
/// test instead of stalling it).
fn bounded<T: Send + 'static>(what: &str, secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not return within {secs} s"))
}

#[test]
fn a_file_truncated_under_its_mapping_fails_beyond_its_new_end_and_says_so() {
    capture_log();
    for mode in [FaultMode::Handlers, FaultMode::InThread] {
        for writable in [false, true] {
            let dir = ram_dir();
            let path = pattern_file(dir.path(), "data", 4 * MIB, 62);
            let pager = std::sync::Arc::new(pager(mode));
            let opts = MapOptions::new().writable(writable).folio(64 << 10);
            let r = std::sync::Arc::new(pager.map_file(&path, &opts).unwrap());
            assert_eq!(r.words()[0].load(Relaxed), word(0, 62));
            LOG.0.lock().unwrap().clear();
            // Cut the file to 1 MiB + 100 bytes: the folio at 1 MiB is now
            // partly in the file, those from 1 MiB + 64 KiB not at all.
            let cut = MIB + 100;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(cut)
                .unwrap();
            // Below the cut: the data, untouched.
            let rr = std::sync::Arc::clone(&r);
            bounded("a fill below the cut", 20, move || {
                rr.fault_in(512 << 10, 64 << 10, false).unwrap()
            });
            assert_eq!(
                r.words()[(512 << 10) / 8].load(Relaxed),
                word(512 << 10, 62)
            );
            // The folio the cut goes through, and one wholly beyond it:
            // neither is served (as zeros or anything else).
            for off in [MIB, 2 * MIB] {
                let rr = std::sync::Arc::clone(&r);
                let res = bounded("a fill beyond the cut", 20, move || {
                    rr.fault_in(off, 64 << 10, false)
                });
                match res {
                    Err(upager::AdviseError::Unfilled { offset }) => assert_eq!(offset, off),
                    other => panic!("{mode} writable={writable}: fill at {off} gave {other:?}"),
                }
                let res = r.residency(off, 64 << 10).unwrap();
                assert!(
                    res.iter().all(|(_, s)| !matches!(
                        s,
                        upager::Residency::ResidentClean | upager::Residency::ResidentDirty
                    )),
                    "{mode}: folio at {off} resident: {res:?}"
                );
            }
            // In handler mode a system call on the memory gets EFAULT.
            if mode == FaultMode::Handlers {
                let sink = std::fs::File::create(dir.path().join("sink")).unwrap();
                let e = upager_sys::io::pwrite_from(&sink, r.as_ptr() as u64 + 2 * MIB, 4096, 0)
                    .unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
            }
            let logged = LOG.0.lock().unwrap().clone();
            let line = logged
                .iter()
                .find(|l| l.contains("truncated under the mapping"))
                .unwrap_or_else(|| panic!("{mode}: nothing logged: {logged:?}"));
            assert!(
                line.starts_with(&format!(
                    "{}: the file is {cut} bytes now but was {} bytes when it was mapped",
                    path.display(),
                    4 * MIB
                )),
                "{line}"
            );
            assert!(pager.stats().read_errors >= 1);
            drop(r);
        }
    }
}
