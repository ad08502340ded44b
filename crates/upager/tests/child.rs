//! Behaviour that ends a process or needs another identity, checked in child
//! processes: SIGBUS for a failed store read, SIGSEGV for a write to a
//! read-only region, the error without userfaultfd access, exit with
//! regions mapped.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use upager::{MapOptions, Pager};

const MIB: u64 = 1 << 20;

/// Entry point of the child processes (does nothing in a normal run).
#[test]
fn child_main() {
    let Ok(scenario) = std::env::var("UPAGER_CHILD") else {
        return;
    };
    let dir = ram_dir();
    match scenario.as_str() {
        "sigbus" => {
            upager::log_to_stderr();
            let path = pattern_file(dir.path(), "data", 4 * MIB, 1);
            let pager = Pager::new(16 * MIB).unwrap();
            let store = Arc::new(TestStore::new(&path, false));
            store.fail_read_at.store(2 * (64 << 10), SeqCst);
            let r = pager.map_store(store, &MapOptions::new()).unwrap();
            assert_eq!(r.words()[0].load(Relaxed), word(0, 1));
            assert_eq!(r.words()[3 * 8192].load(Relaxed), word(3 * 65536, 1));
            println!("served other folios");
            let v = r.words()[2 * 8192].load(Relaxed);
            println!("not reached: {v}");
        }
        "foreign_sigbus" => {
            // The program's own SIGBUS handler, installed before upager's
            // (or, with "replaced", after the pager: upager installs its
            // own again on top when it maps the region).
            let replaced = std::env::var_os("UPAGER_CHILD_REPLACED").is_some();
            if !replaced {
                install_own_sigbus();
            }
            let path = pattern_file(dir.path(), "data", 4 * MIB, 3);
            let pager = Pager::builder()
                .budget(MIB)
                .fault_mode(upager::FaultMode::InThread)
                .build()
                .unwrap();
            if replaced {
                install_own_sigbus();
            }
            let r = pager.map_file(&path, &MapOptions::new()).unwrap();
            for w in (0..r.len() / 8).step_by(509) {
                assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 3));
            }
            println!(
                "in-thread faults served: {}",
                pager.stats().faults_in_thread
            );
            foreign_sigbus(dir.path());
        }
        "fault_mode_env" => {
            // SAFETY: this child runs one thread that reads the environment.
            unsafe { std::env::set_var("UPAGER_FAULT_MODE", "fast") };
            match Pager::builder().build() {
                Ok(_) => println!("BUILT"),
                Err(e) => println!("ERROR {} errno {}", e, upager::ErrorCode::errno(&e)),
            }
            // SAFETY: as above.
            unsafe { std::env::set_var("UPAGER_FAULT_MODE", "in-thread") };
            println!("MODE {}", Pager::builder().build().unwrap().fault_mode());
        }
        "readonly_write" => {
            let path = pattern_file(dir.path(), "data", MIB, 2);
            let pager = Pager::new(16 * MIB).unwrap();
            let r = pager.map_file(&path, &MapOptions::new()).unwrap();
            assert_eq!(r.words()[0].load(Relaxed), word(0, 2));
            println!("read ok");
            r.words()[0].store(1, Relaxed);
            println!("not reached");
        }
        "unprivileged" => {
            // An ordinary user gets a pager with no setup.
            upager::log_to_stderr();
            let pager = Pager::new(16 * MIB).unwrap();
            let info = pager.info();
            println!(
                "PAGER {} user_mode_only={} syscalls_fault_in={}",
                info.fault_mode,
                info.user_mode_only,
                info.syscalls_fault_in()
            );
            let path = pattern_file(dir.path(), "data", 8 * MIB, 4);
            let r = pager
                .map_file(&path, &MapOptions::new().writable(true))
                .unwrap();
            for w in (0..r.len() / 8).step_by(61) {
                assert_eq!(r.words()[w].load(Relaxed), word(w as u64 * 8, 4));
            }
            for w in (0..r.len() / 8).step_by(1021) {
                r.words()[w].store(!word(w as u64 * 8, 4), Relaxed);
            }
            r.flush().unwrap();
            let file = std::fs::read(&path).unwrap();
            for w in (0..r.len() / 8).step_by(61) {
                let want = if w % 1021 == 0 {
                    !word(w as u64 * 8, 4)
                } else {
                    word(w as u64 * 8, 4)
                };
                let got = u64::from_ne_bytes(file[w * 8..w * 8 + 8].try_into().unwrap());
                assert_eq!(got, want, "word {w}");
            }
            println!("verified");
            // A system call from a page not resident: EFAULT (the
            // documented contract of a user-mode-only userfaultfd).
            r.pageout(0, r.len() as u64).unwrap();
            let sink = std::fs::File::create(dir.path().join("sink")).unwrap();
            // SAFETY: write(2) only reads the 4096 bytes of region memory
            // (a live mapping of the region `r`, which outlives the call).
            let n = unsafe {
                libc::write(
                    std::os::fd::AsRawFd::as_raw_fd(&sink),
                    r.as_ptr().cast(),
                    4096,
                )
            };
            println!("WRITE {n} {}", std::io::Error::last_os_error());
            // SAFETY: this child runs one thread that reads the environment.
            unsafe { std::env::set_var("UPAGER_USERFAULTFD", "kernel-faults") };
            match Pager::new(16 * MIB) {
                Ok(_) => println!("KERNEL-FAULTS PAGER OK"),
                Err(e) => println!("ERROR: {e}"),
            }
        }
        "exit_with_regions" => {
            let pager = Pager::new(8 * MIB).unwrap();
            let r = pager.map_anonymous(64 * MIB, &MapOptions::new()).unwrap();
            for w in (0..r.len() / 8).step_by(512) {
                r.words()[w].store(1, Relaxed);
            }
            println!("exiting with {} resident", pager.stats().resident_bytes);
            std::process::exit(0);
        }
        "footprint" => {
            let rss = || -> u64 {
                let s = std::fs::read_to_string("/proc/self/status").unwrap();
                let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
                l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
            };
            let before = rss();
            let pager = Pager::new(64 * MIB).unwrap();
            let path = pattern_file(dir.path(), "small", 64 << 10, 3);
            let r = pager.map_file(&path, &MapOptions::new()).unwrap();
            assert_eq!(r.words()[1].load(Relaxed), word(8, 3));
            println!("FOOTPRINT {}", rss() - before);
        }
        "aged_writes" => {
            // Writes older than the dirty expiry are in
            // the file when the process is killed without a flush.
            let path = std::env::var("UPAGER_CHILD_FILE").unwrap();
            let pager = Pager::builder()
                .budget(16 * MIB)
                .dirty_expire(Duration::from_millis(300))
                .build()
                .unwrap();
            let r = pager
                .map_file(&path, &MapOptions::new().writable(true).folio(16 << 10))
                .unwrap();
            for w in (0..r.len() / 8).step_by(97) {
                r.words()[w].store(0xA6ED_0000_0000_0000 | w as u64, Relaxed);
            }
            // Past the expiry and one scan period (a quarter of it).
            std::thread::sleep(Duration::from_millis(1200));
            let s = pager.stats();
            println!("AGED {} DIRTY {}", s.writebacks_aged, s.dirty_bytes);
            // Killed with no flush and no destructor.
            let me = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &me])
                .status();
            std::thread::sleep(Duration::from_secs(10));
            println!("not reached");
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn a_failed_store_read_raises_sigbus_in_the_faulting_access_only() {
    let out = run_child("sigbus", &[], Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("served other folios"),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("not reached"));
    // Without UFFDIO_POISON (masked) the handlers mode makes the
    // folio inaccessible instead: SIGSEGV.
    let masked = std::env::var("UPAGER_MASK_FEATURES")
        .is_ok_and(|v| v.contains("uffd_poison") || v.contains("all"));
    let want = if masked && !in_thread() {
        libc::SIGSEGV
    } else {
        libc::SIGBUS
    };
    assert_eq!(out.status.signal(), Some(want), "{:?}", out.status);
    // The process leaves a reason behind, naming the store.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gets SIGBUS")
            && stderr.contains("reading it from the store failed")
            && stderr.contains("region offset 131072"),
        "no reason logged before the SIGBUS: {stderr}"
    );
}

/// Raises another mapping's SIGBUS: a shared file mapping read beyond the
/// end of its (truncated) file. Prints the address first.
fn foreign_sigbus(dir: &std::path::Path) {
    // Another mapping's SIGBUS: a shared file mapping read beyond
    // the end of its (truncated) file.
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("short"))
        .unwrap();
    f.set_len(8192).unwrap();
    // SAFETY: a new shared mapping of an open file; nothing else
    // refers to the address range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    f.set_len(0).unwrap();
    println!("FOREIGN {:#x}", p as u64 + 4096);
    // SAFETY: inside the 8 KiB mapping above (beyond the file's end
    // now: the read raises SIGBUS, which the test is about).
    let v = unsafe { std::ptr::read_volatile((p as *const u8).add(4096)) };
    println!("not reached {v}");
}

/// Installs `own_sigbus` as the process's SIGBUS handler.
fn install_own_sigbus() {
    // SAFETY: a zeroed sigaction is valid (no handler, empty mask).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = own_sigbus as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    assert_eq!(
        // SAFETY: a valid action with an SA_SIGINFO handler.
        unsafe { libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) },
        0
    );
}

/// The program's SIGBUS handler in the child `foreign_sigbus`: reports the
/// address and exits 7 (async-signal-safe: write and _exit).
extern "C" fn own_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo.
    let addr = unsafe { (*info).si_addr() } as u64;
    let mut msg = *b"OWN HANDLER 0x0000000000000000\n";
    for i in 0..16 {
        let d = ((addr >> (60 - 4 * i)) & 0xf) as u8;
        msg[14 + i] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
    }
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `msg` is live.
    unsafe {
        libc::write(1, msg.as_ptr().cast(), msg.len());
        libc::_exit(7);
    }
}

#[test]
fn a_foreign_sigbus_reaches_the_programs_own_handler() {
    let out = run_child("foreign_sigbus", &[], Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("in-thread faults served"), "{stdout}");
    let want = stdout
        .lines()
        .find_map(|l| l.strip_prefix("FOREIGN 0x"))
        .map(|a| u64::from_str_radix(a.trim(), 16).unwrap())
        .expect("the child printed the foreign address");
    let got = stdout
        .lines()
        .find_map(|l| l.strip_prefix("OWN HANDLER 0x"))
        .map(|a| u64::from_str_radix(a.trim(), 16).unwrap());
    assert_eq!(got, Some(want), "{stdout}");
    assert_eq!(out.status.code(), Some(7), "{:?} {stdout}", out.status);
}

/// The program replaces upager's SIGBUS handler after the pager exists
/// (as Python's `faulthandler.enable()` does): mapping a region installs
/// upager's again, on top, and foreign signals still reach the program's.
#[test]
fn upager_reinstalls_its_handler_over_one_installed_after_it() {
    let out = run_child(
        "foreign_sigbus",
        &["/usr/bin/env", "UPAGER_CHILD_REPLACED=1"],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("in-thread faults served"),
        "{stdout} {:?}",
        out.status
    );
    assert!(stdout.contains("OWN HANDLER"), "{stdout}");
    assert_eq!(out.status.code(), Some(7), "{:?} {stdout}", out.status);
}

#[test]
fn a_bad_fault_mode_in_the_environment_is_a_clear_error() {
    let out = run_child("fault_mode_env", &[], Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "ERROR UPAGER_FAULT_MODE=\"fast\": unknown fault mode \"fast\": use \"handlers\" or \"in-thread\" errno {}",
            libc::EINVAL
        )),
        "{stdout}"
    );
    assert!(stdout.contains("MODE in-thread"), "{stdout}");
}

#[test]
fn writing_a_read_only_region_raises_sigsegv() {
    let out = run_child("readonly_write", &[], Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("read ok") && !stdout.contains("not reached"),
        "{stdout}"
    );
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{:?}", out.status);
}

/// An ordinary user (no access to /dev/userfaultfd, no
/// privilege) gets a pager with a user-mode-only userfaultfd, in-thread by
/// default, that maps, reads, writes and flushes; a system call from a
/// non-resident page fails with EFAULT; asking for one that serves system
/// calls is a clear error that says how to get it.
#[test]
fn an_ordinary_user_gets_a_user_mode_only_pager() {
    let unpriv =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if unpriv.trim() == "1" {
        skip_or_fail(
            "no user without access to userfaultfd: vm.unprivileged_userfaultfd \
             is 1 (every user may create one)",
        );
        return;
    }
    if !std::path::Path::new("/usr/bin/setpriv").exists() {
        skip_or_fail("no /usr/bin/setpriv (util-linux) to run the child as another user");
        return;
    }
    // As an unprivileged user (nobody), with no access to /dev/userfaultfd.
    let out = run_child_env(
        "unprivileged",
        &[
            "/usr/bin/setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
        &[("UPAGER_FAULT_MODE", "")],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stdout.contains("KERNEL-FAULTS PAGER OK") {
        skip_or_fail(
            "no user without access to userfaultfd: nobody (uid 65534) can open \
             one that serves system calls here",
        );
        return;
    }
    assert!(
        stdout.contains("PAGER in-thread user_mode_only=true syscalls_fault_in=false"),
        "{stdout} {stderr}"
    );
    assert!(stdout.contains("verified"), "{stdout} {stderr}");
    assert!(
        stdout.contains("WRITE -1 Bad address"),
        "a system call from a non-resident page fails with EFAULT: {stdout}"
    );
    assert!(
        stderr.contains("userfaultfd is user-mode-only here"),
        "said once in the log: {stderr}"
    );
    assert!(
        stdout.contains(
            "ERROR: no usable userfaultfd: opening /dev/userfaultfd failed (Permission denied"
        ) && stdout.contains("setfacl -m u:$USER:rw /dev/userfaultfd"),
        "{stdout} {stderr}"
    );
}

/// Without UFFDIO_POISON (Linux 6.6; masked here), a failed store read
/// still ends the access, never a hang: SIGBUS in the in-thread mode,
/// SIGSEGV in the handlers mode (the folio is made inaccessible).
#[test]
fn a_failed_store_read_ends_the_access_without_uffdio_poison() {
    let out = run_child_env(
        "sigbus",
        &[],
        &[("UPAGER_MASK_FEATURES", "uffd_poison")],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("served other folios"), "{stdout} {stderr}");
    assert!(!stdout.contains("not reached"), "{stdout}");
    let want = if in_thread() {
        libc::SIGBUS
    } else {
        libc::SIGSEGV
    };
    assert_eq!(out.status.signal(), Some(want), "{:?} {stderr}", out.status);
    assert!(stderr.contains("no UFFDIO_POISON"), "{stderr}");
}

#[test]
fn a_process_exits_promptly_with_regions_mapped() {
    let out = run_child("exit_with_regions", &[], Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("exiting with"));
}

/// Starting the engine (a pager, its threads, the first region of a 64 KiB
/// file and its first fault) adds little resident memory: the handlers'
/// fill buffers (4 MiB each) are mappings whose pages arrive as fills use
/// them. They were zeroed heap blocks: +12.5 MiB before the first fault.
#[test]
fn starting_the_engine_adds_under_4_mib_of_resident_memory() {
    let out = run_child("footprint", &[], Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let bytes: u64 = stdout
        .lines()
        .find_map(|l| l.split("FOOTPRINT ").nth(1)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{stdout} {}", String::from_utf8_lossy(&out.stderr)));
    eprintln!("engine start: +{} KiB resident", bytes >> 10);
    assert!(bytes < 4 * MIB, "{bytes} bytes");
}

/// A process killed (SIGKILL, no flush) keeps every write
/// older than the dirty expiry (plus a scan period), as the kernel's flusher
/// keeps a killed numpy.memmap writer's data after `dirty_expire_centisecs`.
#[test]
fn writes_older_than_the_dirty_expiry_survive_sigkill() {
    let dir = ram_dir();
    let path = pattern_file(dir.path(), "data", 4 * MIB, 5);
    let out = run_child_env(
        "aged_writes",
        &[],
        &[("UPAGER_CHILD_FILE", path.to_str().unwrap())],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.signal(),
        Some(9),
        "the child killed itself; stdout: {stdout}; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let aged: u64 = stdout
        .lines()
        .find_map(|l| l.split("AGED ").nth(1))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no AGED line: {stdout}"));
    assert!(
        aged > 0,
        "the background writer wrote aged folios: {stdout}"
    );
    assert!(stdout.contains("DIRTY 0"), "nothing left dirty: {stdout}");
    let file = std::fs::read(&path).unwrap();
    let words = file.len() / 8;
    for w in 0..words {
        let got = u64::from_ne_bytes(file[w * 8..w * 8 + 8].try_into().unwrap());
        let want = if w % 97 == 0 {
            0xA6ED_0000_0000_0000 | w as u64
        } else {
            word(w as u64 * 8, 5)
        };
        assert_eq!(got, want, "word {w} after SIGKILL ({aged} folios aged)");
    }
}
