//! seccomp: a deny-list filter in classic BPF, installed on this process.
//!
//! For tests that must run upager the way a container runtime's default
//! profile would (Docker refuses `userfaultfd`, `process_madvise` without
//! `CAP_SYS_PTRACE` and `io_uring_*`; see `docs/containers.md`): the
//! `upager-confine` launcher builds a [`Filter`], calls [`install`] and
//! execs the command, which inherits the filter for good.
//!
//! Contract of the filter program (`Filter::program`), in order:
//!
//! 1. `seccomp_data.arch` must be this build's audit architecture
//!    (`AUDIT_ARCH_X86_64` or `AUDIT_ARCH_AARCH64`); any other (an i386
//!    `int 0x80` from an x86-64 process, say) kills the process. A deny
//!    list keyed on syscall numbers means nothing under another
//!    architecture's numbering.
//! 2. On x86-64, x32 syscalls (`nr` with `__X32_SYSCALL_BIT`) get ENOSYS:
//!    they share the audit architecture and would otherwise slip past the
//!    numbers below under different ones.
//! 3. The rules in the order they were added: a rule matches on the syscall
//!    number and, optionally, on the low 32 bits of one argument under a
//!    mask (`ioctl`'s request: the kernel takes `unsigned int cmd`, so
//!    high bits a caller sets in the register are ignored by the kernel and
//!    must be ignored here, or they would slip past an equality test;
//!    `userfaultfd`'s flags, an `int`: refuse it unless
//!    `UFFD_USER_MODE_ONLY` is set). The first match returns
//!    `SECCOMP_RET_ERRNO | errno`.
//! 4. Everything else is allowed.
//!
//! A filter cannot be removed, is inherited across `fork` and kept across
//! `execve`, and stacks on filters already installed (the most restrictive
//! action of all of them wins). [`install`] sets `PR_SET_NO_NEW_PRIVS`
//! first, which the kernel requires of a process without `CAP_SYS_ADMIN`
//! and which also stops set-uid binaries from gaining privilege after exec.
//!
//! Syscall numbers come from `libc::SYS_*` ([`syscall_number`]), structs
//! and BPF opcodes from `libc`, the audit architecture and the x32 bit from
//! `linux-raw-sys`; no number here is typed by hand.
#![allow(unsafe_code)]

use std::io;
use std::mem::offset_of;

use linux_raw_sys::general as k;

use crate::{cvt, ioc, IOC_NONE};

/// `USERFAULTFD_IOC_NEW` (`_IO(0xAA, 0x00)`): the ioctl on
/// `/dev/userfaultfd` that returns a new userfaultfd. Refusing it makes the
/// device unusable the way its absence in a container does (a seccomp
/// filter cannot match a path, so `open` itself cannot be refused by name).
pub const USERFAULTFD_IOC_NEW: u32 = ioc(IOC_NONE, k::USERFAULTFD_IOC, 0x00, 0);

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = linux_raw_sys::ptrace::AUDIT_ARCH_X86_64;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = linux_raw_sys::ptrace::AUDIT_ARCH_AARCH64;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("upager's seccomp filter knows the audit architecture of x86-64 and arm64 only");

/// The most rules one [`Filter`] takes: a rule is at most 6 instructions,
/// so the program stays far below `BPF_MAXINSNS` (4096). (Jumps are local,
/// at most 5 ahead, so the 8-bit jump offsets of classic BPF never limit.)
pub const MAX_RULES: usize = 200;

/// A test on one argument of a syscall: its low 32 bits, masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgMatch {
    /// Which argument (0..=5).
    pub index: u8,
    /// Bits of the argument's low 32 that are compared.
    pub mask: u32,
    /// What they must equal for the rule to match.
    pub value: u32,
}

/// One refusal: a syscall, optionally only when one argument matches,
/// answered with an errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The syscall number (`libc::SYS_*`).
    pub nr: libc::c_long,
    /// `Some(m)`: match only when the argument matches `m`.
    pub arg: Option<ArgMatch>,
    /// The errno the call fails with (1..=4095; 0 would look like success).
    pub errno: u16,
}

impl Rule {
    /// Refuse syscall `nr` whatever its arguments.
    pub fn syscall(nr: libc::c_long, errno: u16) -> Rule {
        Rule {
            nr,
            arg: None,
            errno,
        }
    }

    /// Refuse `ioctl(fd, request, ...)` for this one request number.
    pub fn ioctl(request: u32, errno: u16) -> Rule {
        Rule {
            nr: libc::SYS_ioctl,
            arg: Some(ArgMatch {
                index: 1,
                mask: u32::MAX,
                value: request,
            }),
            errno,
        }
    }

    /// Refuse `userfaultfd(flags)` unless `flags` has
    /// `UFFD_USER_MODE_ONLY`: what the kernel itself does to a process
    /// without `CAP_SYS_PTRACE` while `vm.unprivileged_userfaultfd` is 0
    /// (EPERM, `userfaultfd_syscall_allowed`).
    pub fn userfaultfd_kernel_mode(errno: u16) -> Rule {
        Rule {
            nr: libc::SYS_userfaultfd,
            arg: Some(ArgMatch {
                index: 0,
                mask: k::UFFD_USER_MODE_ONLY,
                value: 0,
            }),
            errno,
        }
    }

    /// The errno this rule returns for a call, or `None` if it does not
    /// match (the reference the BPF program is tested against).
    pub fn decide(&self, nr: libc::c_long, args: &[u64; 6]) -> Option<u16> {
        if nr != self.nr {
            return None;
        }
        match self.arg {
            Some(m) if args[usize::from(m.index)] as u32 & m.mask != m.value => None,
            _ => Some(self.errno),
        }
    }
}

/// A deny list (see the module docs for the program it becomes). By
/// default it is empty: everything is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    rules: Vec<Rule>,
}

/// Shorthand for one classic BPF instruction.
fn insn(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Offset in `struct seccomp_data` of the low 32 bits of argument `i`.
fn arg_low_offset(i: u8) -> u32 {
    let base = offset_of!(libc::seccomp_data, args) + 8 * usize::from(i);
    // The low half of a u64 is its first 4 bytes on little-endian.
    let low = if cfg!(target_endian = "little") { 0 } else { 4 };
    (base + low) as u32
}

impl Filter {
    /// An empty filter (allows everything).
    pub fn new() -> Filter {
        Filter::default()
    }

    /// Adds a rule after the ones already there (the first match wins).
    pub fn deny(&mut self, rule: Rule) -> &mut Filter {
        self.rules.push(rule);
        self
    }

    /// The rules, in the order they are tested.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The errno the filter returns for a call, `None` when it is allowed
    /// (the rules' meaning, without BPF; x32 and foreign architectures
    /// aside).
    pub fn decide(&self, nr: libc::c_long, args: &[u64; 6]) -> Option<u16> {
        self.rules.iter().find_map(|r| r.decide(nr, args))
    }

    /// The classic BPF program of the module docs. Fails with
    /// `InvalidInput` for more than [`MAX_RULES`] rules, an errno outside
    /// 1..=4095, an argument index above 5 or a negative syscall number.
    pub fn program(&self) -> io::Result<Vec<libc::sock_filter>> {
        let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
        if self.rules.len() > MAX_RULES {
            return Err(invalid(format!(
                "{} seccomp rules, at most {MAX_RULES}",
                self.rules.len()
            )));
        }
        const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
        const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
        const RET_K: u32 = libc::BPF_RET | libc::BPF_K;
        const AND_K: u32 = libc::BPF_ALU | libc::BPF_AND | libc::BPF_K;
        let nr_off = offset_of!(libc::seccomp_data, nr) as u32;
        let arch_off = offset_of!(libc::seccomp_data, arch) as u32;

        let mut p = vec![
            // 1. Architecture: next instruction if ours, else kill.
            insn(LD_W_ABS, arch_off, 0, 0),
            insn(JEQ_K, AUDIT_ARCH, 1, 0),
            insn(RET_K, libc::SECCOMP_RET_KILL_PROCESS, 0, 0),
            insn(LD_W_ABS, nr_off, 0, 0),
        ];
        // 2. x32 numbers on x86-64.
        #[cfg(target_arch = "x86_64")]
        p.extend([
            insn(
                libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
                k::__X32_SYSCALL_BIT,
                0,
                1,
            ),
            insn(RET_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32, 0, 0),
        ]);
        // 3. The rules. The accumulator holds `nr` at the start of each.
        for r in &self.rules {
            if !(1..=4095).contains(&r.errno) {
                return Err(invalid(format!("errno {} outside 1..=4095", r.errno)));
            }
            let nr = u32::try_from(r.nr)
                .map_err(|_| invalid(format!("syscall number {} is negative", r.nr)))?;
            let ret = insn(
                RET_K,
                libc::SECCOMP_RET_ERRNO | (u32::from(r.errno) & libc::SECCOMP_RET_DATA),
                0,
                0,
            );
            match r.arg {
                None => {
                    p.push(insn(JEQ_K, nr, 0, 1));
                    p.push(ret);
                }
                Some(m) => {
                    if m.index > 5 {
                        return Err(invalid(format!("argument index {} above 5", m.index)));
                    }
                    // nr?  no: skip the 5 below.  yes: load the argument,
                    // mask it; equal: refuse; else reload nr for the next
                    // rule.
                    p.push(insn(JEQ_K, nr, 0, 5));
                    p.push(insn(LD_W_ABS, arg_low_offset(m.index), 0, 0));
                    p.push(insn(AND_K, m.mask, 0, 0));
                    p.push(insn(JEQ_K, m.value, 0, 1));
                    p.push(ret);
                    p.push(insn(LD_W_ABS, nr_off, 0, 0));
                }
            }
        }
        // 4. Everything else.
        p.push(insn(RET_K, libc::SECCOMP_RET_ALLOW, 0, 0));
        debug_assert!(p.len() <= libc::BPF_MAXINSNS as usize);
        Ok(p)
    }
}

/// Installs `filter` on every thread of this process
/// (`SECCOMP_FILTER_FLAG_TSYNC`), after `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
/// For good: a filter cannot be removed, and children and exec'd programs
/// keep it. Errors: `InvalidInput` from [`Filter::program`]; the errno of
/// `prctl` or `seccomp` (EINVAL on a kernel without seccomp filters;
/// `Other` naming the thread when another thread's filters diverge and
/// TSYNC cannot apply).
pub fn install(filter: &Filter) -> io::Result<()> {
    let mut program = filter.program()?;
    let prog = libc::sock_fprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers only.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into())?;
    // SAFETY: `prog` points to `program`, alive and unmoved until the call
    // returns; the kernel copies the instructions and only reads them.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const libc::sock_fprog,
        )
    };
    match cvt(ret)? {
        0 => Ok(()),
        tid => Err(io::Error::other(format!(
            "thread {tid} has seccomp filters of its own; TSYNC refused"
        ))),
    }
}

/// This process's seccomp state from `/proc/self/status`: `(mode, filters)`
/// where mode is 0 (none), 1 (strict) or 2 (filter) and `filters` the
/// number of filters stacked (0 on kernels before 5.9, which lack the
/// line). An EPERM from a call the kernel itself allows to everyone (such
/// as a `UFFD_USER_MODE_ONLY` userfaultfd) under mode 2 is seccomp's.
pub fn status() -> io::Result<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    let mode = field("Seccomp:").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "no Seccomp line in /proc/self/status",
        )
    })?;
    Ok((mode, field("Seccomp_filters:").unwrap_or(0)))
}

/// Syscalls the launcher and the docs name, with their numbers on this
/// architecture. Not every syscall: the ones upager calls, the ones the
/// container profiles treat specially, and a few for tests.
const SYSCALLS: &[(&str, libc::c_long)] = &[
    ("userfaultfd", libc::SYS_userfaultfd),
    ("process_madvise", libc::SYS_process_madvise),
    ("process_mrelease", libc::SYS_process_mrelease),
    ("pidfd_open", libc::SYS_pidfd_open),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("madvise", libc::SYS_madvise),
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mprotect", libc::SYS_mprotect),
    ("mremap", libc::SYS_mremap),
    ("mincore", libc::SYS_mincore),
    ("memfd_create", libc::SYS_memfd_create),
    ("ioctl", libc::SYS_ioctl),
    ("futex", libc::SYS_futex),
    ("rt_sigaction", libc::SYS_rt_sigaction),
    ("tgkill", libc::SYS_tgkill),
    ("mbind", libc::SYS_mbind),
    ("set_mempolicy", libc::SYS_set_mempolicy),
    ("get_mempolicy", libc::SYS_get_mempolicy),
    ("move_pages", libc::SYS_move_pages),
    ("migrate_pages", libc::SYS_migrate_pages),
    ("fallocate", libc::SYS_fallocate),
    ("fadvise64", libc::SYS_fadvise64),
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("preadv", libc::SYS_preadv),
    ("pwritev", libc::SYS_pwritev),
    ("fdatasync", libc::SYS_fdatasync),
    ("eventfd2", libc::SYS_eventfd2),
    ("sched_setaffinity", libc::SYS_sched_setaffinity),
    ("getpid", libc::SYS_getpid),
    ("gettid", libc::SYS_gettid),
    ("clone3", libc::SYS_clone3),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("ptrace", libc::SYS_ptrace),
];

/// The number of syscall `name` on this architecture, for the names in
/// the table above (`None` for any other).
pub fn syscall_number(name: &str) -> Option<libc::c_long> {
    SYSCALLS.iter().find(|(n, _)| *n == name).map(|&(_, nr)| nr)
}

/// The names [`syscall_number`] knows.
pub fn syscall_names() -> impl Iterator<Item = &'static str> {
    SYSCALLS.iter().map(|&(n, _)| n)
}

/// The name of syscall `nr`, if [`syscall_number`] knows it.
pub fn syscall_name(nr: libc::c_long) -> Option<&'static str> {
    SYSCALLS.iter().find(|&&(_, n)| n == nr).map(|&(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions `program` emits,
    /// the reference the program is checked against.
    fn run(prog: &[libc::sock_filter], data: &libc::seccomp_data) -> u32 {
        // SAFETY: seccomp_data is plain old data with no padding (two u32,
        // then u64s); viewing it as bytes reads initialised memory only.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (data as *const libc::seccomp_data).cast::<u8>(),
                size_of::<libc::seccomp_data>(),
            )
        };
        let word = |off: u32| {
            let o = off as usize;
            u32::from_ne_bytes(bytes[o..o + 4].try_into().expect("4 bytes"))
        };
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = prog[pc];
            let code = u32::from(i.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => acc = word(i.k),
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => acc &= i.k,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if acc == i.k { i.jt } else { i.jf })
                }
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => {
                    pc += usize::from(if acc >= i.k { i.jt } else { i.jf })
                }
                c => panic!("instruction {c:#x} not emitted by Filter::program"),
            }
        }
    }

    fn data(nr: libc::c_long, args: [u64; 6]) -> libc::seccomp_data {
        libc::seccomp_data {
            nr: nr as i32,
            arch: AUDIT_ARCH,
            instruction_pointer: 0,
            args,
        }
    }

    fn errno_ret(e: i32) -> u32 {
        libc::SECCOMP_RET_ERRNO | e as u32
    }

    #[test]
    fn ioc_new_is_0xaa00() {
        assert_eq!(USERFAULTFD_IOC_NEW, 0xAA00);
    }

    #[test]
    fn program_agrees_with_rules() {
        let mut f = Filter::new();
        f.deny(Rule::syscall(libc::SYS_process_madvise, libc::EPERM as u16))
            .deny(Rule::ioctl(USERFAULTFD_IOC_NEW, libc::ENOENT as u16))
            .deny(Rule::ioctl(0x1234, libc::EACCES as u16))
            .deny(Rule::syscall(libc::SYS_io_uring_setup, libc::ENOSYS as u16))
            .deny(Rule::userfaultfd_kernel_mode(libc::EPERM as u16));
        let p = f.program().expect("valid");
        let calls: Vec<(libc::c_long, [u64; 6])> = vec![
            (libc::SYS_process_madvise, [0; 6]),
            (libc::SYS_io_uring_setup, [1, 2, 3, 4, 5, 6]),
            (libc::SYS_ioctl, [3, 0xAA00, 0, 0, 0, 0]),
            // High bits the kernel ignores (cmd is an unsigned int).
            (libc::SYS_ioctl, [3, 0xDEAD_BEEF_0000_AA00, 0, 0, 0, 0]),
            (libc::SYS_ioctl, [3, 0x1234, 0, 0, 0, 0]),
            (libc::SYS_ioctl, [3, 0xAA01, 0, 0, 0, 0]),
            (libc::SYS_ioctl, [0xAA00, 0, 0, 0, 0, 0]),
            (libc::SYS_madvise, [0; 6]),
            (libc::SYS_userfaultfd, [0; 6]),
            (
                libc::SYS_userfaultfd,
                [libc::O_CLOEXEC as u64, 0, 0, 0, 0, 0],
            ),
            (
                libc::SYS_userfaultfd,
                [k::UFFD_USER_MODE_ONLY.into(), 0, 0, 0, 0, 0],
            ),
            (libc::SYS_userfaultfd, [u64::MAX, 0, 0, 0, 0, 0]),
            (libc::SYS_getpid, [0; 6]),
        ];
        for (nr, args) in calls {
            let want = match f.decide(nr, &args) {
                Some(e) => errno_ret(i32::from(e)),
                None => libc::SECCOMP_RET_ALLOW,
            };
            assert_eq!(run(&p, &data(nr, args)), want, "nr {nr} args {args:x?}");
        }
        assert_eq!(
            f.decide(libc::SYS_ioctl, &[3, 0xDEAD_BEEF_0000_AA00, 0, 0, 0, 0]),
            Some(libc::ENOENT as u16)
        );
        assert_eq!(
            f.decide(libc::SYS_userfaultfd, &[0; 6]),
            Some(libc::EPERM as u16)
        );
        assert_eq!(f.decide(libc::SYS_userfaultfd, &[1, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn foreign_arch_is_killed_and_x32_refused() {
        let p = Filter::new().program().expect("valid");
        let mut d = data(libc::SYS_getpid, [0; 6]);
        assert_eq!(run(&p, &d), libc::SECCOMP_RET_ALLOW);
        d.arch = !AUDIT_ARCH;
        assert_eq!(run(&p, &d), libc::SECCOMP_RET_KILL_PROCESS);
        #[cfg(target_arch = "x86_64")]
        {
            let d = data(
                libc::c_long::from(k::__X32_SYSCALL_BIT as i32) + libc::SYS_getpid,
                [0; 6],
            );
            assert_eq!(run(&p, &d), errno_ret(libc::ENOSYS));
        }
    }

    #[test]
    fn many_rules_keep_jumps_in_range() {
        let mut f = Filter::new();
        for nr in 0..MAX_RULES as libc::c_long {
            f.deny(match nr % 3 {
                0 => Rule::syscall(nr, 1 + (nr % 100) as u16),
                1 => Rule::ioctl(nr as u32, 7),
                _ => Rule {
                    nr,
                    arg: Some(ArgMatch {
                        index: (nr % 6) as u8,
                        mask: 0xF0,
                        value: 0x30,
                    }),
                    errno: 9,
                },
            });
        }
        let p = f.program().expect("valid");
        for nr in 0..MAX_RULES as libc::c_long + 5 {
            for a in [nr as u64, 0xAA00, 0x35, 0x1_0000_0035] {
                let args = [a; 6];
                let want = f
                    .decide(nr, &args)
                    .map_or(libc::SECCOMP_RET_ALLOW, |e| errno_ret(i32::from(e)));
                assert_eq!(run(&p, &data(nr, args)), want);
            }
        }
        f.deny(Rule::syscall(1, 1));
        assert_eq!(
            f.program().err().map(|e| e.kind()),
            Some(io::ErrorKind::InvalidInput)
        );
    }

    #[test]
    fn bad_rules_are_refused() {
        for r in [
            Rule::syscall(libc::SYS_getpid, 0),
            Rule::syscall(libc::SYS_getpid, 4096),
            Rule::syscall(-1, 1),
            Rule {
                nr: libc::SYS_ioctl,
                arg: Some(ArgMatch {
                    index: 6,
                    mask: 1,
                    value: 0,
                }),
                errno: 1,
            },
        ] {
            let mut f = Filter::new();
            f.deny(r);
            assert_eq!(
                f.program().err().map(|e| e.kind()),
                Some(io::ErrorKind::InvalidInput),
                "{r:?}"
            );
        }
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(
            syscall_number("process_madvise"),
            Some(libc::SYS_process_madvise)
        );
        assert_eq!(syscall_number("no_such_call"), None);
        for n in syscall_names() {
            let nr = syscall_number(n).expect("listed");
            assert_eq!(syscall_name(nr), Some(n), "duplicate number {nr}");
        }
    }

    #[test]
    fn status_reads_this_process() {
        let (mode, _) = status().expect("Linux has the Seccomp line since 3.8");
        assert!(mode <= 2);
    }
}
