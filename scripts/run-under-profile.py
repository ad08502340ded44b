#!/usr/bin/python3
"""Run a command under a whole OCI/Docker seccomp profile, as runc would.

upager-confine (crates/confine) reproduces only a profile's refusals of
the syscalls upager cares about. This loads a complete profile (Docker's,
Podman's, or one written by scripts/seccomp-profile.py) through libseccomp,
so a run also meets everything the profile does NOT allow: the check that
upager needs no other syscall a container refuses.

Needs libseccomp's Python binding (Debian: python3-seccomp, for the
system's /usr/bin/python3). Resolution of conditional rules follows
moby/profiles seccomp/seccomp_linux.go and containers/common
pkg/seccomp/seccomp_linux.go:

- ``includes``/``excludes``: ``caps`` against the container's capability
  set (Docker's and Podman's default set, plus ``--cap-add``),
  ``arches`` against this machine's, ``minKernel`` against ``uname -r``;
- ``args``: one libseccomp rule with all conditions when their indices
  differ, else one rule per condition (runc does the same);
- names libseccomp does not know are skipped (runc skips them too);
- the default action's errno is ``defaultErrnoRet`` (EPERM if unset).

- a rule's ``SCMP_ACT_ERRNO`` without ``errnoRet`` is EPERM, and rules
  whose action is the default's are left out (runc does both);
- the native architecture is filtered, and the sub-architectures the
  profile's ``archMap`` lists for it (32-bit calls of a 64-bit process).

It does not drop capabilities: run it under ``setpriv --bounding-set
-sys_ptrace`` (util-linux) to be a root process without CAP_SYS_PTRACE, as
in a container with Docker's default capabilities.

Usage: run-under-profile.py [--cap-add CAP]... PROFILE.json -- CMD ARGS...
"""

import argparse
import errno as errnos
import json
import os
import platform
import sys

import seccomp

# Docker's default capabilities (moby daemon/pkg/oci/caps/defaults.go);
# Podman's default set (containers/common pkg/config/default.go) is the
# same less AUDIT_WRITE, MKNOD and NET_RAW, which no rule of either
# profile tests.
DEFAULT_CAPS = {
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
    "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())

OPS = {
    "SCMP_CMP_NE": seccomp.NE, "SCMP_CMP_LT": seccomp.LT, "SCMP_CMP_LE": seccomp.LE,
    "SCMP_CMP_EQ": seccomp.EQ, "SCMP_CMP_GE": seccomp.GE, "SCMP_CMP_GT": seccomp.GT,
    "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
}

ARCHES = {
    "SCMP_ARCH_X86_64": "X86_64", "SCMP_ARCH_X86": "X86", "SCMP_ARCH_X32": "X32",
    "SCMP_ARCH_AARCH64": "AARCH64", "SCMP_ARCH_ARM": "ARM",
}


def kernel_at_least(spec):
    def nums(v):
        out = []
        for part in v.split("-")[0].split(".")[:2]:
            digits = "".join(c for c in part if c.isdigit())
            out.append(int(digits or 0))
        return out

    return nums(platform.release()) >= nums(spec)


def applies(rule, caps):
    inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
    if inc.get("caps") and not set(inc["caps"]) <= caps:
        return False
    if inc.get("arches") and GOARCH not in inc["arches"]:
        return False
    if inc.get("minKernel") and not kernel_at_least(inc["minKernel"]):
        return False
    if exc.get("caps") and set(exc["caps"]) & caps:
        return False
    if exc.get("arches") and GOARCH in exc["arches"]:
        return False
    if exc.get("minKernel") and kernel_at_least(exc["minKernel"]):
        return False
    return True


def action(rule):
    a = rule["action"]
    if a == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if a == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(rule.get("errnoRet") or errnos.EPERM)
    if a in ("SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD"):
        return seccomp.KILL
    if a == "SCMP_ACT_KILL_PROCESS":
        return seccomp.KILL_PROCESS
    if a == "SCMP_ACT_LOG":
        return seccomp.LOG
    if a == "SCMP_ACT_TRAP":
        return seccomp.TRAP
    raise ValueError("action {} not supported here".format(a))


def build(profile, caps):
    default_errno = profile.get("defaultErrnoRet") or errnos.EPERM
    default = action({"action": profile["defaultAction"], "errnoRet": default_errno})
    f = seccomp.SyscallFilter(default)
    # system_arch() is the AUDIT_ARCH value unsigned; Arch.* are signed.
    native = seccomp.system_arch() & 0xFFFFFFFF
    for entry in profile.get("archMap") or []:
        arch = getattr(seccomp.Arch, ARCHES.get(entry["architecture"], "?"), None)
        if arch is None or arch & 0xFFFFFFFF != native:
            continue
        for sub in entry.get("subArchitectures") or []:
            arch = getattr(seccomp.Arch, ARCHES.get(sub, "?"), None)
            if arch is not None:
                f.add_arch(arch)
    skipped = []
    for rule in profile.get("syscalls") or []:
        if not applies(rule, caps):
            continue
        act = action(rule)
        if act == default:
            continue
        names = rule.get("names") or [rule["name"]]
        args = rule.get("args") or []
        conds = [seccomp.Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0)) for a in args]
        groups = [conds] if len({a["index"] for a in args}) == len(args) else [[c] for c in conds]
        for name in names:
            # -1 (__NR_SCMP_ERROR): a name libseccomp does not know. Other
            # negative numbers are its pseudo-syscalls for calls this
            # architecture lacks (mmap2 on x86-64), which add_rule accepts.
            if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) == -1:
                skipped.append(name)
                continue
            for group in groups:
                f.add_rule(act, name, *group)
    return f, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap-add", action="append", default=[], metavar="CAP",
                    help="a capability the container has on top of the default set (SYS_PTRACE, ...)")
    ap.add_argument("profile")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given: put it after --")
    caps = DEFAULT_CAPS | {"CAP_" + c.upper().removeprefix("CAP_") for c in args.cap_add}
    with open(args.profile, encoding="utf-8") as fh:
        profile = json.load(fh)
    f, skipped = build(profile, caps)
    if skipped:
        print("run-under-profile.py: libseccomp does not know {}; skipped (as runc does)".format(
            ", ".join(sorted(set(skipped)))), file=sys.stderr)
    f.load()
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
