#!/usr/bin/env python3
"""Write a container seccomp profile that lets upager run.

Takes a base profile in the OCI/Docker JSON format (the one your Docker,
Podman, containerd or CRI-O installation uses; see docs/containers.md for
where to get it) and writes it with upager's syscalls allowed:

- ``userfaultfd`` (upager cannot run without it; Docker's and Podman's
  default profiles refuse it with EPERM);
- ``process_madvise`` (one TLB flush per eviction batch; the defaults allow
  it only with CAP_SYS_PTRACE; without it upager falls back to one
  ``madvise`` per run, one flush each). ``--no-process-madvise`` leaves it
  as the base has it;
- ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register`` only with
  ``--io-uring`` (the defaults refuse them on purpose, for the kernel attack
  surface; upager's write-back falls back to pwrite without them).

Every rule of the base that names one of these syscalls loses the name
(a refusal would conflict with the new allow; a capability-gated allow
becomes redundant), rules left with no name are dropped, and one
unconditional allow rule for them is appended. Everything else is written
back unchanged, in the same order.

``--user-mode-only`` allows ``userfaultfd`` only with the
``UFFD_USER_MODE_ONLY`` flag (value 1 in ``include/uapi/linux/userfaultfd.h``),
the kind the kernel gives to everyone: page faults raised inside the kernel
(a ``read(2)`` into a non-resident page) then fail with EFAULT instead of
being served. Without the flag the kernel still decides: a full
userfaultfd needs CAP_SYS_PTRACE or ``vm.unprivileged_userfaultfd = 1``.

Usage::

    seccomp-profile.py BASE.json -o upager-seccomp.json
    seccomp-profile.py < BASE.json > upager-seccomp.json
    docker run --security-opt seccomp=upager-seccomp.json ...
    podman run --security-opt seccomp=upager-seccomp.json ...

Exit status: 0 written, 2 the base is not a seccomp profile (or bad usage).
"""

import argparse
import errno
import json
import sys

USERFAULTFD = "userfaultfd"
PROCESS_MADVISE = "process_madvise"
IO_URING = ["io_uring_setup", "io_uring_enter", "io_uring_register"]
# UFFD_USER_MODE_ONLY, include/uapi/linux/userfaultfd.h (Linux 5.11).
UFFD_USER_MODE_ONLY = 1
COMMENT = "upager (scripts/seccomp-profile.py): {what}"


class ProfileError(Exception):
    """The base is not a seccomp profile this script understands."""


def rule_names(rule):
    """The syscall names of a rule (``names`` list, or the old ``name``)."""
    if "names" in rule and rule["names"] is not None:
        return list(rule["names"])
    if "name" in rule:
        return [rule["name"]]
    return []


def strip_names(rule, names):
    """The rule without `names`, or None when no name is left."""
    left = [n for n in rule_names(rule) if n not in names]
    if left == rule_names(rule):
        return rule
    if not left:
        return None
    out = dict(rule)
    out.pop("name", None)
    out["names"] = left
    return out


def add_upager(base, io_uring=False, process_madvise=True, user_mode_only=False):
    """Returns (profile, notes): `base` with upager's syscalls allowed."""
    if not isinstance(base, dict) or "defaultAction" not in base:
        raise ProfileError("no defaultAction: not a seccomp profile")
    syscalls = base.get("syscalls")
    if syscalls is None:
        syscalls = []
    if not isinstance(syscalls, list) or not all(isinstance(r, dict) for r in syscalls):
        raise ProfileError("syscalls is not a list of rules")
    names = [USERFAULTFD]
    if process_madvise:
        names.append(PROCESS_MADVISE)
    if io_uring:
        names.extend(IO_URING)

    notes = []
    kept = []
    for rule in syscalls:
        stripped = strip_names(rule, names)
        if stripped is not rule:
            gone = [n for n in rule_names(rule) if n in names]
            what = "dropped" if stripped is None else "took out of"
            notes.append(
                "{} {} rule {} ({})".format(
                    what, rule.get("action"), ", ".join(gone), describe_conditions(rule)
                )
            )
        if stripped is not None:
            kept.append(stripped)

    default_allows = base["defaultAction"] == "SCMP_ACT_ALLOW"
    plain = [n for n in names if not (user_mode_only and n == USERFAULTFD)]
    if plain and not default_allows:
        kept.append(
            {
                "names": plain,
                "action": "SCMP_ACT_ALLOW",
                "comment": COMMENT.format(what="allowed unconditionally"),
            }
        )
        notes.append("allowed " + ", ".join(plain))
    if user_mode_only:
        # MASKED_EQ: (arg0 & value) == valueTwo.
        flag_set = {
            "index": 0,
            "value": UFFD_USER_MODE_ONLY,
            "valueTwo": UFFD_USER_MODE_ONLY,
            "op": "SCMP_CMP_MASKED_EQ",
        }
        flag_clear = dict(flag_set, valueTwo=0)
        if not default_allows:
            kept.append(
                {
                    "names": [USERFAULTFD],
                    "action": "SCMP_ACT_ALLOW",
                    "args": [flag_set],
                    "comment": COMMENT.format(what="userfaultfd with UFFD_USER_MODE_ONLY only"),
                }
            )
        else:
            kept.append(
                {
                    "names": [USERFAULTFD],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": errno.EPERM,
                    "args": [flag_clear],
                    "comment": COMMENT.format(what="userfaultfd without UFFD_USER_MODE_ONLY refused"),
                }
            )
        notes.append("allowed userfaultfd with UFFD_USER_MODE_ONLY only")

    out = dict(base)
    out["syscalls"] = kept
    return out, notes


def describe_conditions(rule):
    parts = []
    for key in ("includes", "excludes"):
        cond = rule.get(key) or {}
        for field, values in cond.items():
            if values:
                parts.append("{} {}={}".format(key, field, values))
    if rule.get("args"):
        parts.append("with argument filters")
    return "; ".join(parts) or "unconditional"


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Write a seccomp profile with upager's syscalls allowed "
        "(see docs/containers.md).",
    )
    ap.add_argument("base", nargs="?", default="-", help="base profile (JSON); - or none: stdin")
    ap.add_argument("-o", "--output", default="-", help="where to write (default: stdout)")
    ap.add_argument("--io-uring", action="store_true", help="also allow io_uring_setup/enter/register")
    ap.add_argument(
        "--no-process-madvise",
        action="store_true",
        help="leave process_madvise as the base has it (upager then evicts with madvise per run)",
    )
    ap.add_argument(
        "--user-mode-only",
        action="store_true",
        help="allow userfaultfd only with UFFD_USER_MODE_ONLY",
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    args = ap.parse_args(argv)

    try:
        if args.base == "-":
            base = json.load(sys.stdin)
        else:
            with open(args.base, encoding="utf-8") as f:
                base = json.load(f)
        profile, notes = add_upager(
            base,
            io_uring=args.io_uring,
            process_madvise=not args.no_process_madvise,
            user_mode_only=args.user_mode_only,
        )
    except (OSError, ValueError, ProfileError) as e:
        print("seccomp-profile.py: {}: {}".format(args.base, e), file=sys.stderr)
        return 2

    text = json.dumps(profile, indent="\t") + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    if not args.quiet:
        for n in notes:
            print("seccomp-profile.py: " + n, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
