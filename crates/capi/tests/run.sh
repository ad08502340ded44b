#!/bin/sh
# Builds the C tests against an INSTALLED upager (make install-c
# PREFIX=DIR) with gcc, the way users build them, and runs them.
#   sh crates/capi/tests/run.sh DIR
# Scratch files go to $UPAGER_TEST_DIR (default /dev/shm).
set -eu
PREFIX=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/c" && pwd)
OUT=$(mktemp -d "${TMPDIR:-/tmp}/upager-ctest.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
CC=${CC:-gcc}
CFLAGS="-O2 -g -Wall -Wextra -Werror -std=c11 -pthread"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
RPATH="-Wl,-rpath,$PREFIX/lib"

build() { # name source link-flags...
    name=$1; src=$2; shift 2
    echo "cc $name: $*"
    $CC $CFLAGS -I"$SRC" "$src" -o "$OUT/$name" "$@"
}

# Native API through pkg-config, shared and static.
build native_rw "$SRC/native_rw.c" $(pkg-config --cflags --libs upager) $RPATH
build native_rw_static "$SRC/native_rw.c" $(pkg-config --cflags upager) \
    "$PREFIX/lib/libupager.a" $(pkg-config --libs-only-other --static upager) \
    $(pkg-config --static --libs-only-l upager | sed 's/-lupager//')
# Fully static (-static) with what pkg-config --static says, as users do:
# every library it names must exist as an archive (no -lgcc_s). glibc warns
# about name lookup in static programs (the Redis store's); not an error here.
build native_rw_fullstatic "$SRC/native_rw.c" -static $(pkg-config --cflags upager) \
    -L"$PREFIX/lib" -Wl,-Bstatic $(pkg-config --static --libs upager) 2>&1 |
    grep -v 'statically linked applications requires at runtime' || true
[ -x "$OUT/native_rw_fullstatic" ] || { echo "native_rw_fullstatic did not link"; exit 1; }
# UMap programs: only the include path and -lumap change.
build umap_rw "$SRC/umap_rw.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
build umap_atexit "$SRC/umap_atexit.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
build errors "$SRC/errors.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lupager $RPATH
build stat_names "$SRC/stat_names.c" $(pkg-config --cflags --libs upager) $RPATH
build fault_mode "$SRC/fault_mode.c" $(pkg-config --cflags --libs upager) $RPATH
build umap_fault_mode "$SRC/umap_fault_mode.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
build store_ops "$SRC/store_ops.c" $(pkg-config --cflags --libs upager) $RPATH
build footprint "$SRC/footprint.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
build store_redis "$SRC/store_redis.c" $(pkg-config --cflags --libs upager) $RPATH
build dirty_expire "$SRC/dirty_expire.c" $(pkg-config --cflags --libs upager) $RPATH
build warm "$SRC/warm.c" $(pkg-config --cflags --libs upager) $RPATH
build writers "$SRC/writers.c" $(pkg-config --cflags --libs upager) $RPATH
build huge_runs "$SRC/huge_runs.c" $(pkg-config --cflags --libs upager) $RPATH
build unmap_race "$SRC/unmap_race.c" $(pkg-config --cflags --libs upager) $RPATH
build fork "$SRC/fork.c" $(pkg-config --cflags --libs upager) $RPATH
build umap_warm "$SRC/umap_warm.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
build umap_fixed_sort "$SRC/umap_fixed_sort.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
build umap_store_url "$SRC/umap_store_url.c" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
# UMap's C++ API (header-only over the C library): the system's g++.
CXX=${CXX:-g++}
CXXFLAGS="-O2 -g -Wall -Wextra -Werror -std=c++17 -pthread"
buildxx() { # name source link-flags...
    name=$1; src=$2; shift 2
    echo "c++ $name: $*"
    $CXX $CXXFLAGS "$src" -o "$OUT/$name" "$@"
}
buildxx umap_store "$SRC/umap_store.cpp" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH
buildxx umap_sparsestore "$SRC/umap_sparsestore.cpp" -I"$PREFIX/include" -L"$PREFIX/lib" -lumap $RPATH

# -lumap records the soname of the one library.
readelf -d "$OUT/umap_rw" | grep -q 'NEEDED.*libupager.so.0' ||
    { echo "umap_rw does not need libupager.so.0"; exit 1; }
if readelf -d "$OUT/native_rw_static" | grep -q 'NEEDED.*libupager'; then
    echo "native_rw_static links libupager dynamically"; exit 1
fi

run() { echo "run $*"; "$@"; }
run "$OUT/native_rw"
run "$OUT/native_rw_static"
run "$OUT/native_rw_fullstatic"
# 64 MiB file, buffer of 2048 pages of 4 KiB = 8 MiB (UMap's default page).
run env UMAP_BUFSIZE=2048 UMAP_PAGE_FILLERS=2 "$OUT/umap_rw" 64 4
# 64 KiB pages, with readahead pinned to 4 pages.
run env UMAP_PAGESIZE=65536 UMAP_BUFSIZE=128 UMAP_READ_AHEAD=4 "$OUT/umap_rw" 64 4
# 2 MiB pages (folios mapped as huge pages in the view), a 32 MiB buffer.
run env UMAP_PAGESIZE=2097152 UMAP_BUFSIZE=16 "$OUT/umap_rw" 64 2
# A buffer of 4 pages (16 KiB), which crashes UMap: still correct, in budget.
run env UMAP_BUFSIZE=4 "$OUT/umap_rw" 2 3
# Whole file in the buffer (nothing evicted): only the atexit flush saves it.
run env UMAP_BUFSIZE=4096 "$OUT/umap_atexit"
run env UMAP_BUFSIZE=256 "$OUT/errors"
run "$OUT/stat_names"
# Readers racing an unmap: right data or SIGSEGV, never SIGBUS.
run "$OUT/unmap_race"
run "$OUT/dirty_expire"
# Warm starts: record, replay, record anew; both fault modes.
run env UPAGER_FAULT_MODE=handlers "$OUT/warm"
run env UPAGER_FAULT_MODE=in-thread "$OUT/warm"
# fork: children and a grandchild use the inherited region.
run env UPAGER_FAULT_MODE=handlers "$OUT/fork"
run env UPAGER_FAULT_MODE=in-thread "$OUT/fork"
run "$OUT/writers"
run "$OUT/huge_runs"
# The fault mode: options, defaults from UPAGER_FAULT_MODE, both
# modes at work; the UMap drop-in under each value of the variable.
run env -u UPAGER_FAULT_MODE "$OUT/fault_mode"
run env UPAGER_FAULT_MODE=in-thread "$OUT/fault_mode"
for mode in "" handlers in-thread sigbus; do
    run env UPAGER_FAULT_MODE="$mode" UMAP_BUFSIZE=1024 "$OUT/umap_fault_mode"
done
# Stores of the program's own: C callbacks (short, failing and
# blocking stores), UMap's C++ Umap::Store and SparseStore, umapsort's
# multi-file mode at fixed addresses.
run "$OUT/store_ops"
run env UMAP_BUFSIZE=512 "$OUT/umap_store"
run env UMAP_BUFSIZE=256 "$OUT/umap_sparsestore"
run env UMAP_BUFSIZE=4096 "$OUT/umap_fixed_sort"
# UMap programs with warm starts (UPAGER_WARM), both fault modes.
for mode in handlers in-thread; do
    run env UPAGER_FAULT_MODE="$mode" UPAGER_WARM=on UMAP_BUFSIZE=2048 "$OUT/umap_warm"
done
# A Redis Cluster store: a local cluster of its own (ports
# 7200-7205, or UPAGER_REDIS_PORT), stopped again at the end. Without
# redis-server the test is skipped, except under CI=true.
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
if command -v redis-server >/dev/null; then
    export UPAGER_REDIS_PORT=${UPAGER_REDIS_PORT:-7200}
    bash "$REPO/scripts/redis-cluster.sh" start >/dev/null
    trap 'bash "$REPO/scripts/redis-cluster.sh" stop >/dev/null 2>&1; rm -rf "$OUT"' EXIT
    run "$OUT/store_redis" "redis-cluster://127.0.0.1:$UPAGER_REDIS_PORT"
    # A UMap program's file paged from the cluster (UPAGER_UMAP_STORE).
    for mode in handlers in-thread; do
        run env UPAGER_FAULT_MODE="$mode" UMAP_BUFSIZE=6144 "$OUT/umap_store_url" "redis-cluster://127.0.0.1:$UPAGER_REDIS_PORT"
    done
    bash "$REPO/scripts/redis-cluster.sh" stop >/dev/null
elif [ "${CI:-}" = true ]; then
    echo "store_redis: redis-server is missing (scripts/setup.sh installs it)"; exit 1
else
    echo "skip store_redis: no redis-server (scripts/setup.sh installs it)"
fi
# The engine's own memory: start, growth and shrink, overhead_bytes.
run env UMAP_BUFSIZE=4096 "$OUT/footprint"
echo "C tests passed"
