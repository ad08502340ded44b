"""What the S3 benchmarks share: a SeaweedFS of their own on loopback
(scripts/seaweedfs.sh), the release CLI that uploads the data, an
s3fs-fuse mount of the bench bucket, a memory cgroup per run, and the
loopback byte counter the bytes fetched are estimated from.

Not a benchmark itself: imported by bench/s3_model_bench.py and
bench/s3_array_bench.py (run from the repository root or from bench/).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "seaweedfs.sh"


def cli() -> pathlib.Path:
    """The release CLI (`upager load` uploads the benchmarks' data)."""
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return pathlib.Path(os.environ.get("UPAGER_CLI", target / "release" / "upager"))


def require_cli(s3fs: bool = True) -> None:
    """Exits with what to do when the release CLI or the Python packages
    the comparisons run (numpy, and s3fs unless no side run needs it:
    bench/requirements-s3.txt) are missing, before anything is uploaded."""
    if not cli().exists():
        sys.exit(f"the CLI is not built ({cli()}): cargo build --release -p upager-cli")
    import importlib.util
    wanted = ["numpy", "s3fs"] if s3fs else ["numpy"]
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(f"{', '.join(missing)} not installed: "
                 "python3 -m pip install -r bench/requirements-s3.txt")


def add_output_args(ap: Any) -> None:
    """--rounds, --json and --plot, as every S3 benchmark takes them."""
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--json", type=pathlib.Path, help="write the results here")
    ap.add_argument("--plot", nargs=2, type=pathlib.Path, metavar=("JSON", "PNG"),
                    help="only plot the results of an earlier run (matplotlib)")


class Weed:
    """A SeaweedFS of this benchmark's own on ports `port`.. (built if
    needed, started, its credentials and endpoint exported into this
    process's environment, `bucket` made); stopped on exit."""

    def __init__(self, port: int, bucket: str) -> None:
        self.port, self.bucket = port, bucket

    def script(self, *args: str, timeout: float = 300) -> str:
        env = dict(os.environ, UPAGER_WEED_PORT=str(self.port), UPAGER_WEED_TIMEOUT="90")
        out = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                             text=True, timeout=timeout, check=False)
        if out.returncode != 0:
            sys.exit(f"seaweedfs.sh {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def __enter__(self) -> "Weed":
        self.script("build", timeout=3600)
        os.environ["UPAGER_WEED_OWNER"] = str(os.getpid())
        self.script("start", timeout=600)
        del os.environ["UPAGER_WEED_OWNER"]
        for part in self.script("env").replace("export ", "").split():
            k, _, v = part.partition("=")
            os.environ[k] = v
        self.script("mb", self.bucket)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.script("stop")


def have_s3fs() -> bool:
    """s3fs-fuse is there, or was installed now (as root, from Debian)."""
    if shutil.which("s3fs"):
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-qq", "s3fs"], env=env,
                       capture_output=True, timeout=600, check=False)
    return shutil.which("s3fs") is not None


class Mount:
    """`bucket` mounted read-only with s3fs-fuse at a fresh directory (so
    the kernel's page cache of it starts cold), unmounted on exit. With a
    `cgroup`, the s3fs daemon runs in it (its buffers count with the
    reader's memory); `extra`: more s3fs arguments (``-o use_cache=DIR``)."""

    def __init__(self, endpoint: str, bucket: str, key: str,
                 cgroup: Optional["Cgroup"] = None, extra: Optional[List[str]] = None) -> None:
        self.endpoint, self.bucket, self.key, self.cgroup = endpoint, bucket, key, cgroup
        self.extra = list(extra or [])
        self.dir = pathlib.Path(f"/dev/shm/upager-s3fs-mnt-{os.getpid()}")
        self.passwd = pathlib.Path(f"/dev/shm/upager-s3fs-passwd-{os.getpid()}")

    def __enter__(self) -> pathlib.Path:
        self.dir.mkdir(exist_ok=True)
        self.passwd.write_text(
            f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}\n")
        self.passwd.chmod(0o600)
        subprocess.run(["s3fs", self.bucket, str(self.dir), "-o", f"url={self.endpoint}",
                        "-o", "use_path_request_style", "-o", f"passwd_file={self.passwd}",
                        "-o", "ro", "-o", "endpoint=us-east-1", *self.extra],
                       check=True, timeout=60, capture_output=True,
                       preexec_fn=self.cgroup.join if self.cgroup else None)
        deadline = time.monotonic() + 30
        while not (self.dir / self.key).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"s3fs mount at {self.dir} shows no {self.key}")
            time.sleep(0.1)
        return self.dir / self.key

    def __exit__(self, *exc: Any) -> None:
        subprocess.run(["fusermount", "-u", str(self.dir)], timeout=60, check=False,
                       capture_output=True)
        self.passwd.unlink(missing_ok=True)
        try:
            self.dir.rmdir()
        except OSError:
            pass


def bars(ax: Any, sides: List[str], median: Callable[[str], float],
         runs: Callable[[str], List[float]], fontsize: int = 8) -> None:
    """One bar per side (its median), each run's value as a dot over it."""
    for i, side in enumerate(sides):
        ax.bar(i, median(side), color=f"C{i}")
        vals = runs(side)
        ax.plot([i] * len(vals), vals, "k.", ms=4)
    ax.set_xticks(range(len(sides)), sides, fontsize=fontsize)


def save_plot(fig: Any, title: str, r: Dict[str, Any], png: pathlib.Path) -> None:
    """Titles `fig` with what was measured and on which machine (report
    `r`), lays it out and writes it to `png`."""
    fig.suptitle(f"{title}; {r['date'][:10]}, {r['machine']['cpus']} CPUs, "
                 f"Linux {r['machine']['kernel']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")


def memory_hierarchy() -> tuple[str, str]:
    """("v2", root) where the unified hierarchy has the memory controller,
    else ("v1", the v1 memory hierarchy's mount point)."""
    for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        try:
            with open(os.path.join(root, "cgroup.controllers")) as f:
                if "memory" in f.read().split():
                    return "v2", root
        except OSError:
            pass
    with open("/proc/self/mounts") as f:
        for line in f:
            _, mnt, fstype, opts, *_ = line.split()
            if fstype == "cgroup" and "memory" in opts.split(","):
                return "v1", mnt
    raise SystemExit("no memory cgroup hierarchy is mounted")


class Cgroup:
    """A fresh memory cgroup limited to `limit` bytes (None: no limit, only
    measured). `join` (a preexec_fn) moves the calling process in; `peak`
    is the cgroup's peak charge (page cache and tmpfs included)."""

    def __init__(self, limit: Optional[int], tag: str = "bench") -> None:
        self.version, root = memory_hierarchy()
        self.path = os.path.join(root, f"upager-{tag}-{os.getpid()}-{time.monotonic_ns()}")
        if self.version == "v2":
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        os.mkdir(self.path)
        if limit is not None:
            self._write("memory.max" if self.version == "v2" else "memory.limit_in_bytes",
                        str(limit))

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def join(self) -> None:
        self._write("cgroup.procs", str(os.getpid()))

    def peak(self) -> int:
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        with open(os.path.join(self.path, name)) as f:
            return int(f.read())

    def procs(self) -> Iterator[int]:
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            return iter([int(p) for p in f.read().split()])

    def close(self) -> None:
        for _ in range(200):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.05)


def loopback_bytes() -> int:
    """Bytes sent over loopback so far (every process: the client's GETs,
    and the filer's reads from the volume servers)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    return 0
