//! `upager-confine`: run a command under a seccomp filter that refuses
//! chosen syscalls, the way a container runtime's default profile does.
//!
//! upager must keep working where Docker's or Podman's default seccomp
//! profile refuses a call it can do without (`process_madvise`,
//! `io_uring_*`), and must say what to do where one refuses a call it
//! cannot do without (`userfaultfd`). Its tests check both by running the
//! engine under this launcher, not by hope:
//!
//! ```text
//! upager-confine --profile docker --allow userfaultfd,process_madvise -- upager demo ...
//! upager-confine --deny process_madvise,io_uring_setup:EPERM -- upager demo ...
//! upager-confine --deny userfaultfd --no-uffd-device -- upager demo ...
//! ```
//!
//! The launcher builds a deny list ([`Plan`]), installs it with
//! [`upager_sys::seccomp::install`] (all the unsafe code is there) and
//! `exec`s the command, which keeps the filter for good (as do its
//! children). Everything not refused is allowed: this reproduces a
//! profile's refusals of the syscalls upager cares about, not the whole
//! allow list of the profile (for that, run in the container itself).
//!
//! Presets ([`Profile`]) are what each runtime's current default profile
//! does to an unprivileged container (no added capabilities), for the
//! syscalls of `docs/containers.md`, with the same errno. Neither preset
//! touches `/dev/userfaultfd`: a container has no such node unless started
//! with `--device /dev/userfaultfd`; `--no-uffd-device` reproduces its
//! absence by refusing the device's one ioctl (a seccomp filter cannot
//! match the path of an `open`). `--uffd-user-mode-only` reproduces a
//! container without `CAP_SYS_PTRACE` (Docker's and Podman's default
//! capability sets lack it), where the kernel allows only
//! `UFFD_USER_MODE_ONLY` userfaultfds, so that tests run as root see what
//! a container sees.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fmt;

use upager_sys::seccomp::{self, Filter, Rule, USERFAULTFD_IOC_NEW};

/// What one rule refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A syscall, whatever its arguments: name and number.
    Syscall(&'static str, libc::c_long),
    /// `ioctl` with this request number.
    Ioctl(u32),
    /// `userfaultfd(2)` without `UFFD_USER_MODE_ONLY` in its flags.
    UffdKernelMode,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Target::Syscall(name, nr) => write!(f, "{name} (nr {nr})"),
            Target::Ioctl(USERFAULTFD_IOC_NEW) => {
                write!(f, "ioctl USERFAULTFD_IOC_NEW ({USERFAULTFD_IOC_NEW:#x})")
            }
            Target::Ioctl(req) => write!(f, "ioctl {req:#x}"),
            Target::UffdKernelMode => write!(f, "userfaultfd without UFFD_USER_MODE_ONLY"),
        }
    }
}

/// One refusal: target and errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// What is refused.
    pub target: Target,
    /// The errno it fails with.
    pub errno: u16,
}

impl Entry {
    fn rule(&self) -> Rule {
        match self.target {
            Target::Syscall(_, nr) => Rule::syscall(nr, self.errno),
            Target::Ioctl(req) => Rule::ioctl(req, self.errno),
            Target::UffdKernelMode => Rule::userfaultfd_kernel_mode(self.errno),
        }
    }
}

/// A container runtime's default seccomp profile, as far as upager's
/// syscalls go (sources and dates in `docs/containers.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// moby/profiles `seccomp/default.json` (Docker; also containerd 2.x's
    /// built-in default, `contrib/seccomp/seccomp_default.go`):
    /// `defaultAction` SCMP_ACT_ERRNO with `defaultErrnoRet` 1 (EPERM).
    /// `userfaultfd` and `io_uring_*` are in no rule, so EPERM;
    /// `process_madvise` is allowed only with CAP_SYS_PTRACE, so EPERM for a
    /// container without it. `pidfd_open`, `madvise`, `mmap`, `mprotect`,
    /// `memfd_create`, `ioctl`, `futex`, `rt_sigaction`, `tgkill` are
    /// allowed unconditionally.
    Docker,
    /// containers/common `pkg/seccomp/seccomp.json` (Podman, Buildah,
    /// CRI-O): `defaultErrnoRet` 38 (ENOSYS). `userfaultfd` is in the
    /// explicit EPERM list; `process_madvise` is EPERM unless
    /// CAP_SYS_PTRACE; `io_uring_*` are in no rule, so ENOSYS. The same
    /// unconditional allows as Docker for the rest.
    Podman,
}

impl Profile {
    /// Parses `docker` or `podman`.
    pub fn parse(name: &str) -> Option<Profile> {
        match name {
            "docker" => Some(Profile::Docker),
            "podman" => Some(Profile::Podman),
            _ => None,
        }
    }

    /// The refusals of this profile (unprivileged container).
    pub fn entries(self) -> Vec<Entry> {
        let eperm = libc::EPERM as u16;
        let io_uring_errno = match self {
            Profile::Docker => eperm,
            Profile::Podman => libc::ENOSYS as u16,
        };
        let sys = |name: &'static str, errno| Entry {
            target: Target::Syscall(name, syscall_nr(name)),
            errno,
        };
        vec![
            sys("userfaultfd", eperm),
            sys("process_madvise", eperm),
            sys("io_uring_setup", io_uring_errno),
            sys("io_uring_enter", io_uring_errno),
            sys("io_uring_register", io_uring_errno),
        ]
    }
}

/// The number of a syscall the sys crate's table is known to hold.
fn syscall_nr(name: &'static str) -> libc::c_long {
    seccomp::syscall_number(name).expect("preset syscalls are in upager_sys::seccomp's table")
}

/// What the command line asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The refusals, in the order they are tested.
    pub entries: Vec<Entry>,
    /// `--print`: print the refusals instead of running anything.
    pub print: bool,
    /// `--number TARGET`: print the syscall's number (or the ioctl's
    /// request number) and exit.
    pub number: Option<libc::c_long>,
    /// The command and its arguments (after `--`).
    pub command: Vec<OsString>,
}

/// Why the command line could not be understood.
#[derive(Debug, displaydoc::Display, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgsError {
    /// unknown option {0:?} (see --help)
    UnknownOption(String),
    /// option {0} needs a value
    MissingValue(&'static str),
    /// an argument is not valid UTF-8: {0:?}
    NotUtf8(OsString),
    /// unknown profile {0:?}: use docker or podman
    Profile(String),
    /// unknown syscall {0:?}: upager-confine knows {1}
    Syscall(String, String),
    /// unknown errno {0:?}: give a name (EPERM, ENOSYS, EACCES, ENOENT, EINVAL, ...) or a number 1 to 4095
    Errno(String),
    /// bad ioctl request {0:?}: give USERFAULTFD_IOC_NEW or a number (0x... or decimal) below 2^32
    Ioctl(String),
    /// no command given: put it after `--`
    NoCommand,
}

/// Errno names accepted on the command line.
const ERRNOS: &[(&str, i32)] = &[
    ("EPERM", libc::EPERM),
    ("ENOENT", libc::ENOENT),
    ("ENOSYS", libc::ENOSYS),
    ("EACCES", libc::EACCES),
    ("EINVAL", libc::EINVAL),
    ("ENOMEM", libc::ENOMEM),
    ("EFAULT", libc::EFAULT),
    ("EBADF", libc::EBADF),
    ("EAGAIN", libc::EAGAIN),
    ("ENODEV", libc::ENODEV),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
];

/// Parses an errno name or number.
pub fn parse_errno(s: &str) -> Result<u16, ArgsError> {
    if let Some(&(_, e)) = ERRNOS.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
        return Ok(e as u16);
    }
    match s.parse::<u16>() {
        Ok(e) if (1..=4095).contains(&e) => Ok(e),
        _ => Err(ArgsError::Errno(s.to_owned())),
    }
}

/// The name of errno `e`, if it is one of the accepted names.
pub fn errno_name(e: u16) -> Option<&'static str> {
    ERRNOS
        .iter()
        .find(|&&(_, v)| v == i32::from(e))
        .map(|&(n, _)| n)
}

fn parse_ioctl(s: &str) -> Result<u32, ArgsError> {
    if s == "USERFAULTFD_IOC_NEW" {
        return Ok(USERFAULTFD_IOC_NEW);
    }
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse::<u32>(),
    };
    parsed.map_err(|_| ArgsError::Ioctl(s.to_owned()))
}

/// Parses one target: a syscall name or `ioctl=REQUEST`.
pub fn parse_target(s: &str) -> Result<Target, ArgsError> {
    if let Some(req) = s.strip_prefix("ioctl=") {
        return Ok(Target::Ioctl(parse_ioctl(req)?));
    }
    let name = seccomp::syscall_names().find(|n| *n == s).ok_or_else(|| {
        ArgsError::Syscall(
            s.to_owned(),
            seccomp::syscall_names().collect::<Vec<_>>().join(", "),
        )
    })?;
    Ok(Target::Syscall(name, syscall_nr(name)))
}

/// Parses `LIST[:ERRNO]` (comma-separated targets; EPERM by default).
pub fn parse_deny(s: &str) -> Result<Vec<Entry>, ArgsError> {
    let (list, errno) = match s.rsplit_once(':') {
        Some((list, e)) => (list, parse_errno(e)?),
        None => (s, libc::EPERM as u16),
    };
    list.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            Ok(Entry {
                target: parse_target(t)?,
                errno,
            })
        })
        .collect()
}

/// Usage text.
pub const USAGE: &str = "\
usage: upager-confine [OPTIONS] -- COMMAND [ARGS...]

Runs COMMAND under a seccomp filter that refuses the given syscalls with
the given errno (everything else is allowed), then execs it; the filter
stays on COMMAND and its children.

options:
  --profile docker|podman  refuse what that runtime's default profile refuses
                           of upager's syscalls for an unprivileged container:
                           docker: userfaultfd, process_madvise, io_uring_* (EPERM)
                           podman: userfaultfd, process_madvise (EPERM),
                                   io_uring_* (ENOSYS)
  --deny LIST[:ERRNO]      also refuse LIST (comma-separated syscall names, or
                           ioctl=USERFAULTFD_IOC_NEW / ioctl=NUMBER) with ERRNO
                           (a name such as EPERM, ENOSYS, or a number; EPERM
                           by default); repeatable
  --allow LIST             take LIST out of the refusals (applied last): a
                           profile plus its fix, e.g. --allow userfaultfd
  --no-uffd-device         refuse ioctl USERFAULTFD_IOC_NEW with ENOENT, as in
                           a container without --device /dev/userfaultfd
  --uffd-user-mode-only    refuse userfaultfd(2) without UFFD_USER_MODE_ONLY
                           with EPERM, as the kernel does to a process without
                           CAP_SYS_PTRACE (vm.unprivileged_userfaultfd = 0)
  --print                  print the refusals and exit
  --number NAME            print the number of syscall NAME (or of the request
                           of ioctl=NAME) on this architecture and exit
  -h, --help               this text
";

/// Parses the arguments after the program name. `Ok(None)` for `--help`.
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Option<Plan>, ArgsError> {
    let mut plan = Plan::default();
    let mut allow: Vec<Target> = Vec::new();
    let mut it = args.into_iter();
    let utf8 = |a: OsString| a.into_string().map_err(ArgsError::NotUtf8);
    while let Some(arg) = it.next() {
        let arg = utf8(arg)?;
        let mut value = |name: &'static str| -> Result<String, ArgsError> {
            utf8(it.next().ok_or(ArgsError::MissingValue(name))?)
        };
        match arg.as_str() {
            "--" => {
                plan.command = it.by_ref().collect();
                break;
            }
            "-h" | "--help" => return Ok(None),
            "--profile" => {
                let v = value("--profile")?;
                let p = Profile::parse(&v).ok_or(ArgsError::Profile(v))?;
                plan.entries.extend(p.entries());
            }
            "--deny" => plan.entries.extend(parse_deny(&value("--deny")?)?),
            "--allow" => {
                for t in value("--allow")?.split(',').filter(|t| !t.is_empty()) {
                    allow.push(parse_target(t)?);
                }
            }
            "--no-uffd-device" => plan.entries.push(Entry {
                target: Target::Ioctl(USERFAULTFD_IOC_NEW),
                errno: libc::ENOENT as u16,
            }),
            "--uffd-user-mode-only" => plan.entries.push(Entry {
                target: Target::UffdKernelMode,
                errno: libc::EPERM as u16,
            }),
            "--print" => plan.print = true,
            "--number" => {
                plan.number = Some(match parse_target(&value("--number")?)? {
                    Target::Syscall(_, nr) => nr,
                    Target::Ioctl(req) => libc::c_long::from(req),
                    Target::UffdKernelMode => unreachable!("parse_target never returns it"),
                });
            }
            other => return Err(ArgsError::UnknownOption(other.to_owned())),
        }
    }
    plan.entries.retain(|e| !allow.contains(&e.target));
    if plan.command.is_empty() && !plan.print && plan.number.is_none() {
        return Err(ArgsError::NoCommand);
    }
    Ok(Some(plan))
}

/// Why the command could not be started under the filter.
#[derive(Debug, displaydoc::Display, thiserror::Error)]
#[non_exhaustive]
pub enum ConfineError {
    /// could not install the seccomp filter: {0}
    Install(#[source] std::io::Error),
    /// could not run {0:?}: {1}
    Exec(OsString, #[source] std::io::Error),
}

impl Plan {
    /// The seccomp filter of these refusals.
    pub fn filter(&self) -> Filter {
        let mut f = Filter::new();
        for e in &self.entries {
            f.deny(e.rule());
        }
        f
    }

    /// One line per refusal, for `--print`.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for e in &self.entries {
            let name = errno_name(e.errno).map_or_else(|| e.errno.to_string(), str::to_owned);
            s.push_str(&format!("refuse {} with {name}\n", e.target));
        }
        if self.entries.is_empty() {
            s.push_str("refuse nothing\n");
        }
        s
    }

    /// Installs the filter and execs the command; returns only on error.
    pub fn run(&self) -> ConfineError {
        use std::os::unix::process::CommandExt;
        if let Err(e) = seccomp::install(&self.filter()) {
            return ConfineError::Install(e);
        }
        let err = std::process::Command::new(&self.command[0])
            .args(&self.command[1..])
            .exec();
        ConfineError::Exec(self.command[0].clone(), err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn targets(p: &Plan) -> Vec<(String, u16)> {
        p.entries
            .iter()
            .map(|e| match e.target {
                Target::Syscall(n, _) => (n.to_owned(), e.errno),
                Target::Ioctl(r) => (format!("ioctl={r:#x}"), e.errno),
                Target::UffdKernelMode => ("userfaultfd-kernel-mode".into(), e.errno),
            })
            .collect()
    }

    #[test]
    fn deny_list_with_errno() {
        let p = parse_args(args(
            "--deny process_madvise,io_uring_setup,io_uring_enter,io_uring_register:ENOSYS -- true",
        ))
        .expect("parses")
        .expect("not help");
        let enosys = libc::ENOSYS as u16;
        assert_eq!(
            targets(&p),
            vec![
                ("process_madvise".into(), enosys),
                ("io_uring_setup".into(), enosys),
                ("io_uring_enter".into(), enosys),
                ("io_uring_register".into(), enosys),
            ]
        );
        assert_eq!(p.command, args("true"));
    }

    #[test]
    fn profiles_and_allow() {
        let p = parse_args(args(
            "--profile podman --allow userfaultfd --no-uffd-device -- x",
        ))
        .expect("parses")
        .expect("not help");
        let (eperm, enosys) = (libc::EPERM as u16, libc::ENOSYS as u16);
        assert_eq!(
            targets(&p),
            vec![
                ("process_madvise".into(), eperm),
                ("io_uring_setup".into(), enosys),
                ("io_uring_enter".into(), enosys),
                ("io_uring_register".into(), enosys),
                ("ioctl=0xaa00".into(), libc::ENOENT as u16),
            ]
        );
        let d = parse_args(args("--profile docker --print"))
            .expect("parses")
            .expect("not help");
        assert!(d.entries.iter().all(|e| e.errno == eperm));
        assert_eq!(d.entries.len(), 5);
        assert!(d.describe().contains("refuse userfaultfd"));
    }

    #[test]
    fn errors_render() {
        let e = parse_args(args("--deny nosuch -- x")).expect_err("unknown");
        assert!(e.to_string().starts_with("unknown syscall \"nosuch\""));
        assert_eq!(
            parse_args(args("--deny madvise:EWHAT -- x")),
            Err(ArgsError::Errno("EWHAT".into()))
        );
        assert_eq!(
            parse_args(args("--deny madvise")),
            Err(ArgsError::NoCommand)
        );
        assert_eq!(
            parse_args(args("--profile lxc -- x")).map_err(|e| e.to_string()),
            Err("unknown profile \"lxc\": use docker or podman".into())
        );
        assert_eq!(parse_args(args("--help")), Ok(None));
    }

    #[test]
    fn ioctl_targets() {
        assert_eq!(
            parse_target("ioctl=USERFAULTFD_IOC_NEW"),
            Ok(Target::Ioctl(0xAA00))
        );
        assert_eq!(parse_target("ioctl=0x5401"), Ok(Target::Ioctl(0x5401)));
        assert_eq!(parse_target("ioctl=21505"), Ok(Target::Ioctl(0x5401)));
        assert!(parse_target("ioctl=0x1_0000_0000").is_err());
        assert_eq!(parse_errno("38"), Ok(38));
        assert!(parse_errno("0").is_err());
    }
}
