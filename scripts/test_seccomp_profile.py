#!/usr/bin/env python3
"""Tests of scripts/seccomp-profile.py on synthetic base profiles.

The bases are made up here in the shapes of the real defaults (see
docs/containers.md): a Docker-like one (default EPERM, userfaultfd and
io_uring in no rule, process_madvise in a CAP_SYS_PTRACE-gated allow rule)
and a Podman-like one (default ENOSYS, userfaultfd in an explicit EPERM
rule, process_madvise allowed with CAP_SYS_PTRACE and refused without it).

Run: python3 scripts/test_seccomp_profile.py (or pytest on this file).
"""

import copy
import errno
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "seccomp-profile.py")
_spec = importlib.util.spec_from_file_location("seccomp_profile", SCRIPT)
sp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sp)

DOCKER_LIKE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": errno.EPERM,
    "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]}],
    "syscalls": [
        {"names": ["futex", "ioctl", "madvise", "mmap", "pidfd_open", "read"], "action": "SCMP_ACT_ALLOW"},
        {
            "names": ["clone3"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": errno.ENOSYS,
            "excludes": {"caps": ["CAP_SYS_ADMIN"]},
        },
        {
            "names": ["kcmp", "process_madvise", "ptrace"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"caps": ["CAP_SYS_PTRACE"]},
        },
    ],
}

PODMAN_LIKE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": errno.ENOSYS,
    "syscalls": [
        {"names": ["kexec_load", "userfaultfd", "vmsplice"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM, "errno": "EPERM"},
        {"names": ["futex", "madvise", "read"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["kcmp", "process_madvise"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_PTRACE"]}},
        {
            "names": ["process_madvise"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": errno.EPERM,
            "excludes": {"caps": ["CAP_SYS_PTRACE"]},
        },
    ],
}

UPAGER = ["userfaultfd", "process_madvise"]


def rules_naming(profile, name):
    return [r for r in profile["syscalls"] if name in sp.rule_names(r)]


def without(profile, names):
    """The profile's rules with `names` removed (what must be unchanged)."""
    out = []
    for r in profile["syscalls"]:
        s = sp.strip_names(r, names)
        if s is not None:
            out.append(s)
    return out


class AddUpager(unittest.TestCase):
    def check_allowed_once(self, out, names):
        for n in names:
            rules = rules_naming(out, n)
            self.assertEqual(len(rules), 1, "{}: {}".format(n, rules))
            r = rules[0]
            self.assertEqual(r["action"], "SCMP_ACT_ALLOW")
            self.assertNotIn("includes", r)
            self.assertNotIn("excludes", r)
            self.assertFalse(r.get("args"))

    def test_docker_like(self):
        base = copy.deepcopy(DOCKER_LIKE)
        out, notes = sp.add_upager(base)
        self.assertEqual(base, DOCKER_LIKE, "the base is not modified")
        self.check_allowed_once(out, UPAGER)
        # ptrace and kcmp keep their capability gate; the rest is unchanged.
        self.assertEqual(out["syscalls"][:-1], without(DOCKER_LIKE, UPAGER))
        self.assertEqual(out["syscalls"][2]["names"], ["kcmp", "ptrace"])
        self.assertEqual({k: v for k, v in out.items() if k != "syscalls"},
                         {k: v for k, v in DOCKER_LIKE.items() if k != "syscalls"})
        self.assertEqual(rules_naming(out, "io_uring_setup"), [])
        self.assertTrue(any("process_madvise" in n for n in notes))

    def test_podman_like_refusals_go(self):
        out, _ = sp.add_upager(PODMAN_LIKE)
        self.check_allowed_once(out, UPAGER)
        # The EPERM rule keeps its other names; the process_madvise-only
        # refusal is dropped.
        self.assertEqual(out["syscalls"][0]["names"], ["kexec_load", "vmsplice"])
        self.assertEqual(out["syscalls"][0]["errnoRet"], errno.EPERM)
        self.assertEqual(len(out["syscalls"]), len(PODMAN_LIKE["syscalls"]))
        self.assertFalse(any(r["action"] == "SCMP_ACT_ERRNO" and "process_madvise" in r["names"]
                             for r in out["syscalls"]))

    def test_io_uring_only_on_request(self):
        out, _ = sp.add_upager(DOCKER_LIKE, io_uring=True)
        self.check_allowed_once(out, UPAGER + sp.IO_URING)
        out, _ = sp.add_upager(DOCKER_LIKE, process_madvise=False)
        self.check_allowed_once(out, ["userfaultfd"])
        self.assertEqual(rules_naming(out, "process_madvise"), rules_naming(DOCKER_LIKE, "process_madvise"))

    def test_user_mode_only(self):
        out, _ = sp.add_upager(PODMAN_LIKE, user_mode_only=True)
        self.check_allowed_once(out, ["process_madvise"])
        (r,) = rules_naming(out, "userfaultfd")
        self.assertEqual(r["action"], "SCMP_ACT_ALLOW")
        self.assertEqual(r["args"], [{"index": 0, "value": sp.UFFD_USER_MODE_ONLY, "valueTwo": sp.UFFD_USER_MODE_ONLY,
                                      "op": "SCMP_CMP_MASKED_EQ"}])

    def test_allow_by_default_base(self):
        base = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["userfaultfd", "mount"], "action": "SCMP_ACT_ERRNO"},
        ]}
        out, _ = sp.add_upager(base)
        self.assertEqual(out["syscalls"], [{"names": ["mount"], "action": "SCMP_ACT_ERRNO"}])
        out, _ = sp.add_upager(base, user_mode_only=True)
        (r,) = rules_naming(out, "userfaultfd")
        self.assertEqual(r["action"], "SCMP_ACT_ERRNO")
        self.assertEqual(r["args"][0]["valueTwo"], 0)

    def test_old_single_name_rules(self):
        base = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
            {"name": "userfaultfd", "action": "SCMP_ACT_ERRNO"},
            {"name": "read", "action": "SCMP_ACT_ALLOW"},
        ]}
        out, _ = sp.add_upager(base)
        self.assertEqual(out["syscalls"][0], {"name": "read", "action": "SCMP_ACT_ALLOW"})
        self.check_allowed_once(out, UPAGER)

    def test_not_a_profile(self):
        for bad in ([], {"syscalls": []}, {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": {}}):
            with self.assertRaises(sp.ProfileError):
                sp.add_upager(bad)


class CommandLine(unittest.TestCase):
    def run_script(self, args, stdin):
        return subprocess.run([sys.executable, SCRIPT] + args, input=stdin,
                              capture_output=True, text=True, check=False)

    def test_stdin_to_stdout(self):
        r = self.run_script([], json.dumps(DOCKER_LIKE))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), sp.add_upager(DOCKER_LIKE)[0])
        self.assertIn("allowed userfaultfd, process_madvise", r.stderr)

    def test_file_to_file(self):
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "base.json"), os.path.join(d, "out.json")
            with open(src, "w") as f:
                json.dump(PODMAN_LIKE, f)
            r = self.run_script([src, "-o", dst, "--io-uring", "-q"], "")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr, "")
            with open(dst) as f:
                self.assertEqual(json.load(f), sp.add_upager(PODMAN_LIKE, io_uring=True)[0])

    def test_bad_input_exits_2(self):
        r = self.run_script([], "not json")
        self.assertEqual(r.returncode, 2)
        self.assertTrue(r.stderr.startswith("seccomp-profile.py: -: "), r.stderr)
        r = self.run_script(["/nonexistent.json"], "")
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
