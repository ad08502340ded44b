//! The launcher end to end: a command run under `upager-confine` sees the
//! refused syscalls fail with the chosen errno, the others work, and the
//! filter stays through exec and fork.
//!
//! The probe is `python3` with ctypes (`syscall(nr, args...)`, printing
//! the return value and errno), with syscall and ioctl numbers asked of the
//! launcher (`--number`), so no number is typed here. Each probe passes
//! arguments the kernel rejects on its own (a bad fd, bad flags) when the
//! call is allowed, so an allowed call never does anything and its errno
//! (EBADF, EINVAL) tells it apart from the filter's.
// Crate tests in tests/ (STYLE.md section 8), as the other crates' are.
#![allow(clippy::tests_outside_test_module)]

use std::process::{Command, Output};

const CONFINE: &str = env!("CARGO_BIN_EXE_upager-confine");

/// Calls `syscall(argv[1], argv[2:]...)` and prints `ret errno`.
const PROBE: &str = "\
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
args = [ctypes.c_long(int(a, 0)) for a in sys.argv[1:]]
ctypes.set_errno(0)
r = libc.syscall(*args)
print(r, ctypes.get_errno())
";

fn output(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The number of a syscall (or `ioctl=REQUEST`'s request) from the launcher.
fn number(name: &str) -> String {
    let out = output(Command::new(CONFINE).args(["--number", name]));
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

/// `(ret, errno)` of syscall `name` with `args`, run under `confine`
/// options (none: unconfined).
fn probe(confine: &[&str], name: &str, args: &[&str]) -> (i64, i32) {
    let mut cmd = Command::new(CONFINE);
    cmd.args(confine);
    let nr = number(name);
    let mut python = vec!["--", "python3", "-c", PROBE, &nr];
    python.extend(args);
    let out = output(cmd.args(&python));
    parse(&out.stdout)
}

fn parse(stdout: &[u8]) -> (i64, i32) {
    let s = String::from_utf8_lossy(stdout);
    let mut it = s.split_whitespace();
    let r = it.next().and_then(|v| v.parse().ok()).expect("ret");
    let e = it.next().and_then(|v| v.parse().ok()).expect("errno");
    (r, e)
}

// process_madvise(-1, NULL, 0, MADV_DONTNEED, 0): EBADF when allowed.
const PMADV_ARGS: &[&str] = &["-1", "0", "0", "4", "0"];

#[test]
fn denied_syscall_returns_chosen_errno() {
    assert_eq!(probe(&[], "process_madvise", PMADV_ARGS), (-1, libc::EBADF));
    for (errno, want) in [
        ("", libc::EPERM),
        (":EPERM", libc::EPERM),
        (":ENOSYS", libc::ENOSYS),
        (":77", 77),
    ] {
        let deny =
            format!("process_madvise,io_uring_setup,io_uring_enter,io_uring_register{errno}");
        assert_eq!(
            probe(&["--deny", &deny], "process_madvise", PMADV_ARGS),
            (-1, want),
            "--deny {deny}"
        );
        // io_uring_setup(0, NULL): EINVAL (or EFAULT) when allowed.
        assert_eq!(
            probe(&["--deny", &deny], "io_uring_setup", &["0", "0"]),
            (-1, want)
        );
    }
}

#[test]
fn allowed_syscalls_work() {
    let deny = ["--deny", "process_madvise,io_uring_setup:ENOSYS"];
    // getpid works: a positive pid, errno untouched.
    let (pid, errno) = probe(&deny, "getpid", &[]);
    assert!(
        pid > 0 && errno == 0,
        "getpid under the filter: {pid} {errno}"
    );
    // madvise(NULL, 0, MADV_NORMAL) succeeds.
    assert_eq!(probe(&deny, "madvise", &["0", "0", "0"]), (0, 0));
    // userfaultfd with invalid flags reaches the kernel: EINVAL, not EPERM.
    assert_eq!(probe(&deny, "userfaultfd", &["-1"]), (-1, libc::EINVAL));
    // Another ioctl on a bad fd: EBADF from the kernel.
    let tcgets = "0x5401";
    assert_eq!(
        probe(&["--no-uffd-device"], "ioctl", &["-1", tcgets, "0"]),
        (-1, libc::EBADF)
    );
}

#[test]
fn filter_survives_exec_and_fork() {
    let nr = number("process_madvise");
    let python = format!("python3 -c '{PROBE}' {nr} {}", PMADV_ARGS.join(" "));
    // `exec` replaces the shell (a second exec after the launcher's);
    // without it the shell forks python as its child.
    for script in [
        format!("exec {python}"),
        format!("{python}; grep '^Seccomp' /proc/self/status"),
    ] {
        let out = output(Command::new(CONFINE).args([
            "--deny",
            "process_madvise:ENOSYS",
            "--",
            "sh",
            "-c",
            &script,
        ]));
        assert_eq!(parse(&out.stdout), (-1, libc::ENOSYS), "{script}");
        let text = String::from_utf8_lossy(&out.stdout);
        if script.contains("grep") {
            assert!(text.contains("Seccomp:\t2"), "{text}");
            assert!(text.contains("Seccomp_filters:\t1"), "{text}");
        }
    }
}

#[test]
fn profile_docker_refuses_userfaultfd() {
    // Unconfined, invalid flags: the kernel says EINVAL.
    assert_eq!(probe(&[], "userfaultfd", &["-1"]), (-1, libc::EINVAL));
    let docker = ["--profile", "docker"];
    assert_eq!(probe(&docker, "userfaultfd", &["-1"]), (-1, libc::EPERM));
    assert_eq!(
        probe(&docker, "process_madvise", PMADV_ARGS),
        (-1, libc::EPERM)
    );
    assert_eq!(
        probe(&docker, "io_uring_setup", &["0", "0"]),
        (-1, libc::EPERM)
    );
    // The fix: the profile with userfaultfd allowed.
    let fixed = ["--profile", "docker", "--allow", "userfaultfd"];
    assert_eq!(probe(&fixed, "userfaultfd", &["-1"]), (-1, libc::EINVAL));
    assert_eq!(
        probe(&fixed, "process_madvise", PMADV_ARGS),
        (-1, libc::EPERM)
    );
}

#[test]
fn profile_podman_errnos() {
    let podman = ["--profile", "podman"];
    assert_eq!(probe(&podman, "userfaultfd", &["-1"]), (-1, libc::EPERM));
    assert_eq!(
        probe(&podman, "process_madvise", PMADV_ARGS),
        (-1, libc::EPERM)
    );
    for call in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
        assert_eq!(
            probe(&podman, call, &["-1", "0", "0", "0"]),
            (-1, libc::ENOSYS),
            "{call}"
        );
    }
}

#[test]
fn no_uffd_device_refuses_only_its_ioctl() {
    let req = number("ioctl=USERFAULTFD_IOC_NEW");
    assert_eq!(req, (0xAA00).to_string());
    let dev = ["--no-uffd-device"];
    assert_eq!(probe(&dev, "ioctl", &["-1", &req, "0"]), (-1, libc::ENOENT));
    // High bits the kernel ignores do not get past the filter.
    let high = format!("{:#x}", (1u64 << 32) | 0xAA00);
    assert_eq!(
        probe(&dev, "ioctl", &["-1", &high, "0"]),
        (-1, libc::ENOENT)
    );
    // The next request number reaches the kernel.
    let next = (0xAA01).to_string();
    assert_eq!(probe(&dev, "ioctl", &["-1", &next, "0"]), (-1, libc::EBADF));
}

#[test]
fn bad_command_lines_and_commands() {
    let out = Command::new(CONFINE)
        .args(["--deny", "no_such_call", "--", "true"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("upager-confine: unknown syscall \"no_such_call\""));
    let out = Command::new(CONFINE)
        .args(["--deny", "madvise", "--", "/nonexistent/command"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("upager-confine: could not run \"/nonexistent/command\": "));
}

#[test]
fn uffd_user_mode_only_refuses_kernel_mode_only() {
    let umo = ["--uffd-user-mode-only"];
    // flags 0 (kernel-mode): refused as the kernel refuses a process
    // without CAP_SYS_PTRACE.
    assert_eq!(probe(&umo, "userfaultfd", &["0"]), (-1, libc::EPERM));
    // flags -1 include UFFD_USER_MODE_ONLY: reaches the kernel, which
    // rejects the other bits (EINVAL) without creating anything.
    assert_eq!(probe(&umo, "userfaultfd", &["-1"]), (-1, libc::EINVAL));
}
