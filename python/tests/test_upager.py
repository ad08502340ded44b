"""The upager Python package: numpy over files 8x the budget, errors,
closing, residency and advice. Files live on /dev/shm; sizes are small."""

import gc
import os
import threading
import time

import numpy as np
import pytest

import upager
from conftest import MIB, make_file

BUDGET = 8 * MIB


def check_budget(stats):
    assert stats["resident_peak_bytes"] <= stats["budget_bytes"] == BUDGET
    assert stats["evictions"] > 0, "an 8x-the-budget pass must evict"


def test_reductions_over_8x_the_budget(data64):
    path, words = data64
    with upager.Pager(budget="8MiB", folio="64KiB") as pager:
        region = pager.map_file(path)
        a = np.frombuffer(region, dtype=np.uint64)
        assert a.size == words.size and not a.flags.writeable
        assert int(a.sum(dtype=np.uint64)) == int(words.sum(dtype=np.uint64))
        assert int(a.max()) == int(words.max())
        assert np.array_equal(a[::4096], words[::4096])
        # float view of the same bytes, reduced in chunks
        f = np.frombuffer(region, dtype=np.float32)
        ref = np.fromfile(path, dtype=np.float32)
        assert np.isnan(f).sum() == np.isnan(ref).sum()
        check_budget(region.stats())
        del a, f
        region.close()


def test_in_place_updates_over_8x_the_budget(data64):
    path, words = data64
    a = upager.open_array(path, np.uint64, words.shape, mode="r+", budget=BUDGET)
    assert isinstance(a, upager.PagedArray) and a.flags.writeable
    a[::8] ^= np.uint64(0xFFFF)  # strided read-modify-write over all pages
    a[: a.size // 2] += np.uint64(3)  # a dense half
    a.flush()
    want = words.copy()
    want[::8] ^= np.uint64(0xFFFF)
    want[: want.size // 2] += np.uint64(3)
    assert np.array_equal(np.fromfile(path, dtype=np.uint64), want)
    check_budget(a.pager_stats())
    # reductions give plain numbers, views stay paged
    assert type(a.sum()) is np.uint64
    assert type(a + 1) is np.ndarray
    assert type(a[10:20]) is upager.PagedArray
    del a
    gc.collect()


def test_two_mib_folios_are_huge_pages(data64):
    """folio="2MiB" (issue 13): a writable array's 2 MiB folios are moved
    into the view as huge pages (thp_fills), and updates reach the file."""
    path, words = data64
    a = upager.open_array(path, np.uint64, words.shape, mode="r+", budget=32 * MIB, folio="2MiB")
    a[::512] += np.uint64(1)
    a.flush()
    want = words.copy()
    want[::512] += np.uint64(1)
    assert np.array_equal(np.fromfile(path, dtype=np.uint64), want)
    s = a.pager_stats()
    assert s["thp_fills"] > 0 and s["thp_fills"] + s["thp_fill_fallback"] == s["fills"], s
    assert s["resident_peak_bytes"] <= 32 * MIB
    del a
    gc.collect()


def test_sequential_passes_read_ahead_on_another_thread_and_fill_huge_runs(data64):
    """Issue 23: async readahead (on by default) and mixed folio sizes
    (huge_runs, off by default), each set by its keyword. The sum is the
    file's in every case."""
    path, words = data64
    want = int(words.sum(dtype=np.uint64))
    seen = {}
    for kw in ({}, {"readahead_async": False}, {"huge_runs": True}):
        a = upager.open_array(path, np.uint64, words.shape, mode="r+", budget="32MiB",
                              folio="4KiB", **kw)
        for _ in range(2):
            assert sum(int(a[lo:lo + MIB].sum(dtype=np.uint64)) for lo in
                       range(0, a.size, MIB)) % (1 << 64) == want % (1 << 64)
        s = a.pager_stats()
        seen[tuple(kw)] = (s["readahead_async"], s["thp_fills"])
        del a
        gc.collect()
    assert seen[()][0] > 0 and seen[()][1] == 0, seen
    assert seen[("readahead_async",)][0] == 0, seen
    assert seen[("huge_runs",)][1] > 0, seen


def test_threads_share_a_region(data64):
    """numpy releases the GIL; faults are served without it."""
    path, words = data64
    pager = upager.Pager(budget=BUDGET)
    region = pager.map_file(path, mode="r+")
    a = np.frombuffer(region, dtype=np.uint64)
    parts = np.array_split(np.arange(a.size), 4)
    sums = [0] * 4

    def work(i):
        lo, hi = parts[i][0], parts[i][-1] + 1
        a[lo:hi] += np.uint64(1)
        sums[i] = int(a[lo:hi].sum(dtype=np.uint64))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    flusher = threading.Thread(target=region.flush)
    for t in ts:
        t.start()
    flusher.start()
    for t in ts + [flusher]:
        t.join()
    region.flush()
    assert sum(sums) % (1 << 64) == int((words + np.uint64(1)).sum(dtype=np.uint64))
    assert np.array_equal(np.fromfile(path, dtype=np.uint64), words + np.uint64(1))
    del a
    region.close()


def test_open_array_like_memmap(scratch):
    path = os.path.join(scratch, "arr")
    a = upager.open_array(path, np.float64, (256, 1024), mode="w+", budget="1MiB", batch=4)
    assert a.shape == (256, 1024) and os.path.getsize(path) == 256 * 1024 * 8
    a[:, 0] = np.arange(256)
    a[5] = 1.5
    a.flush()
    m = np.memmap(path, dtype=np.float64, mode="r", shape=(256, 1024))
    assert np.array_equal(np.asarray(m), np.asarray(a))
    del m, a
    # unaligned offset and shape=None, read-only
    make_file(path, 1 * MIB, seed=7)
    ref = np.fromfile(path, dtype=np.uint32)
    b = upager.open_array(path, np.uint32, None, offset=12, budget="1MiB", batch=4)
    assert np.array_equal(b, ref[3:])
    assert not b.flags.writeable
    with pytest.raises(ValueError):
        b[0] = 1


def test_anonymous_region(scratch):
    with upager.Pager(budget=BUDGET, swap_dir=scratch) as pager:
        with pager.anonymous("32MiB") as region:
            a = np.frombuffer(region, dtype=np.int64)
            assert not a.any()
            a[:] = np.arange(a.size)
            assert int(a[::1000].sum()) == int(np.arange(a.size)[::1000].sum())
            assert np.array_equal(a[-5:], np.arange(a.size - 5, a.size))
            check_budget(region.stats())
            del a


def test_memoryview_and_residency_advice(data64):
    path, words = data64
    pager = upager.Pager(budget=BUDGET)
    region = pager.map_file(path, mode="r+", length=4 * MIB)
    assert region.residency() == [(0, 4 * MIB, "never_touched")]
    mv = memoryview(region)
    assert len(mv) == 4 * MIB and not mv.readonly
    assert bytes(mv[:8]) == words[:1].tobytes()
    mv[2 * MIB : 2 * MIB + 8] = b"\x01" * 8
    mv.release()
    region.prefetch(0, 1 * MIB, wait=True)
    assert region.mincore(0, 1 * MIB) == b"\x01" * 256
    states = {s for _, _, s in region.residency()}
    assert "resident_dirty" in states
    evicted = region.pageout()
    assert evicted >= 2
    assert region.residency(0, 4096) == [(0, 4096, "evicted")]
    assert region.stats()["resident_bytes"] == 0
    with open(path, "rb") as f:
        f.seek(2 * MIB)
        assert f.read(8) == b"\x01" * 8  # pageout wrote it back
    region.discard(0, 64 * 1024)
    with pytest.raises(ValueError, match="not a multiple"):
        region.pageout(100, 4096)
    with pytest.raises(ValueError, match="outside the region"):
        region.residency(0, 8 * MIB)
    region.close()


# The counter names and their order are ABI, shared with Rust (Stats::NAMES,
# pinned in crates/upager/tests/engine.rs) and C (upager_stat_name(i), pinned
# in crates/capi/tests/c/stat_names.c). Written out, not read from the
# package, so a rename, removal or reorder fails here; a new counter goes at
# the end of all three lists.
PINNED_STAT_NAMES = [
    "faults_missing",
    "faults_wp",
    "faults_deferred",
    "faults_stale",
    "faults_failed",
    "fills",
    "fills_readahead",
    "bytes_read",
    "bytes_written",
    "evictions",
    "evict_batches",
    "evict_direct",
    "evict_background",
    "evict_pageout",
    "reclaim_scanned",
    "writebacks",
    "writeback_errors",
    "read_errors",
    "tlb_flush_batches",
    "wp_unprotects",
    "direct_reclaim_stalls",
    "refaults",
    "refaults_activated",
    "deactivations",
    "flushes",
    "resident_bytes",
    "resident_peak_bytes",
    "budget_bytes",
    "discards",
    "reclaim_lock_acquisitions",
    "evicted_markers",
    "dirty_bytes",
    "dirty_throttled",
    "writes_refused",
    "faults_in_thread",
    "faults_handed_off",
    "pinned_bytes",
    "writeback_submits",
    "thp_fills",
    "thp_fill_fallback",
    "thp_evictions",
    "overhead_bytes",
    "thp_recycled",
    "thp_fill_raced",
    "writes_lost",
    "kernel_call_errors",
    "writebacks_aged",
    "faults_slow",
    "twins_made",
    "diff_writebacks",
    "writer_switches",
    "readahead_async",
    "replay_reads",
    "replay_hits",
    "replay_wasted",
    "ztier_stores",
    "ztier_loads",
    "ztier_rejects",
    "ztier_writebacks",
    "ztier_folios",
    "ztier_bytes",
    "ztier_pool_bytes",
    "ztier_saved_bytes",
    "ztier_compress_ns",
    "ztier_decompress_ns",
]


def test_stat_names_are_pinned_in_order():
    assert list(upager.STAT_NAMES) == PINNED_STAT_NAMES


def test_stats_use_the_stable_names():
    pager = upager.Pager(budget=BUDGET)
    s = pager.stats()
    assert list(s) == list(upager.STAT_NAMES)
    for name in ("faults_missing", "evictions", "evict_batches", "tlb_flush_batches",
                 "resident_bytes", "resident_peak_bytes", "budget_bytes", "flushes"):
        assert name in s
    assert s["budget_bytes"] == BUDGET


def test_bad_arguments_raise_clear_errors(data64, scratch):
    path, _ = data64
    with pytest.raises(ValueError, match="invalid size"):
        upager.Pager(budget="12Q")
    with pytest.raises(ValueError, match="cannot be negative"):
        upager.Pager(budget=-1)
    with pytest.raises(TypeError, match="size string"):
        upager.Pager(budget=True)
    with pytest.raises(TypeError, match="size string"):
        upager.Pager(budget=[1])
    with pytest.raises(ValueError, match="smaller than one folio"):
        upager.Pager(budget=100)
    with pytest.raises(ValueError, match="power of two"):
        upager.Pager(budget=BUDGET, folio=3000)
    with pytest.raises(ValueError, match="handler threads"):
        upager.Pager(budget=BUDGET, handler_threads=0)
    assert upager.parse_size("1.5K") == 1536 and upager.parse_size(7) == 7
    pager = upager.Pager(budget=BUDGET)
    missing = os.path.join(scratch, "missing")
    with pytest.raises(FileNotFoundError, match="no such file") as e:
        pager.map_file(missing)
    assert missing in str(e.value) and isinstance(e.value, OSError)
    with pytest.raises(ValueError, match='mode must be "r"'):
        pager.map_file(path, mode="w")
    with pytest.raises(ValueError, match="not a multiple of the folio size"):
        pager.map_file(path, offset=100)
    with pytest.raises(ValueError, match="beyond the end"):
        pager.map_file(path, length=65 * MIB)
    with pytest.raises(ValueError, match="at least 1 byte"):
        pager.anonymous(0)
    with pytest.raises(ValueError, match="eviction batch"):
        upager.Pager(budget="1MiB", batch=64, folio="64KiB").map_file(path)
    with pytest.raises(ValueError, match="dirty limit"):
        upager.Pager(budget="1MiB", dirty_limit="2MiB")
    upager.Pager(budget="8MiB", dirty_limit="2MiB").close()
    # The default batch fits a small budget.
    with upager.Pager(budget="1MiB") as small:
        r = small.map_file(path)
        assert r.stats()["budget_bytes"] == MIB
        r.close()
    ro = os.path.join(scratch, "ro")
    make_file(ro, 64 * 1024)
    os.chmod(ro, 0o400)
    if os.geteuid() != 0:  # root may write anyway
        with pytest.raises(PermissionError):
            pager.map_file(ro, mode="r+")
    region = pager.map_file(ro)
    assert memoryview(region).readonly
    with pytest.raises((TypeError, BufferError)):  # refused by __getbuffer__
        with open(ro, "rb") as f:
            f.readinto(region)  # asks for a writable buffer
    a = np.frombuffer(region, dtype=np.uint8)
    with pytest.raises(ValueError):
        a[0] = 1
    with pytest.raises(ValueError, match='"r", "r\\+", "w\\+", "c"'):
        upager.open_array(path, np.uint8, 10, mode="x")
    with pytest.raises(ValueError, match="needs a shape"):
        upager.open_array(os.path.join(scratch, "new"), np.uint8, None, mode="w+")


def test_what_is_not_a_regular_file_is_refused_at_map_time(scratch):
    """Issue 20 item 6: a directory was mapped and the first access died
    by SIGBUS; now map_file and open_array raise IsADirectoryError (EISDIR),
    other non-files OSError ENODEV, each naming the path and what to pass."""
    import errno
    pager = upager.Pager(budget=BUDGET)
    for call in (lambda: pager.map_file(scratch),
                 lambda: upager.open_array(scratch, np.uint8, None, budget=BUDGET),
                 lambda: upager.open_array(scratch, np.uint8, (10,), budget=BUDGET),
                 lambda: upager.open_array("/tmp", np.uint64, None, mode="r+", budget=BUDGET)):
        with pytest.raises(IsADirectoryError, match="is a directory, which upager cannot page") as e:
            call()
        assert e.value.errno == errno.EISDIR
        assert "pass the path of a file inside it" in str(e.value)
    fifo = os.path.join(scratch, "fifo")
    os.mkfifo(fifo)
    for path, what in ((fifo, "a FIFO"), ("/dev/zero", "a character device"),
                       ("/proc/self/status", "a pseudo-file")):
        with pytest.raises(OSError, match=what) as e:
            pager.map_file(path)
        assert e.value.errno == errno.ENODEV
    pager.close()


def test_closing_is_idempotent_and_closed_objects_raise(data64):
    path, _ = data64
    pager = upager.Pager(budget=BUDGET)
    region = pager.map_file(path, mode="r+", length=1 * MIB)
    a = np.frombuffer(region, dtype=np.uint8)
    assert region.exports == 1
    with pytest.raises(BufferError, match="delete them first"):
        region.close()
    assert not region.closed and a[0] == a[0]  # still usable
    del a
    region.close()
    region.close()  # harmless
    assert region.closed and "closed" in repr(region)
    assert len(region) == 1 * MIB  # metadata stays readable
    for call in (region.flush, region.stats, region.residency, region.pageout,
                 lambda: np.frombuffer(region, dtype=np.uint8),
                 lambda: memoryview(region), lambda: region.address):
        with pytest.raises(ValueError, match="closed"):
            call()
    with region:  # a closed region still works as a context manager
        pass
    pager.close()
    pager.close()
    with pytest.raises(ValueError, match="pager is closed"):
        pager.map_file(path)
    with pytest.raises(ValueError, match="pager is closed"):
        pager.stats()


def test_region_outlives_its_pager_handle(data64):
    path, words = data64
    region = upager.Pager(budget=BUDGET).map_file(path)  # pager handle dropped
    gc.collect()
    a = np.frombuffer(region, dtype=np.uint64)
    assert int(a[-1]) == int(words[-1])
    assert int(a.sum(dtype=np.uint64)) == int(words.sum(dtype=np.uint64))


def _sum_every_512th(path, q):
    """Runs in a spawned child: opens the array again, as documented."""
    a = upager.open_array(path, np.uint64, budget="8MiB")
    q.put(int(a[::512].sum(dtype=np.uint64)))


def _read_first_word(a, want):
    """Runs in a forked child: the inherited array works (issue 21)."""
    os._exit(0 if int(a[0]) == want else 3)


def test_multiprocessing_spawn_reopens_and_fork_inherits(data64):
    import multiprocessing as mp

    path, words = data64
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_sum_every_512th, args=(path, q))
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0
    assert got == int(words[::512].sum(dtype=np.uint64))

    a = upager.open_array(path, np.uint64, budget="8MiB")
    assert int(a[0]) == int(words[0])
    f = mp.get_context("fork").Process(target=_read_first_word, args=(a, int(words[0])))
    f.start()
    f.join(60)
    if f.exitcode is None:
        f.kill()
        f.join(10)
    assert f.exitcode == 0
    assert int(a[1]) == int(words[1])  # the parent goes on
    del a


def test_invalidate_shows_another_regions_flushed_writes(scratch):
    """Issue 21 item 3: close-to-open consistency between two regions of
    one file; invalidate drops the clean copy, dirty folios stay."""
    path = os.path.join(scratch, "shared")
    make_file(path, 1 * MIB)
    with upager.Pager(budget="8MiB", folio="16KiB") as pager:
        a = pager.map_file(path, mode="r+")
        b = pager.map_file(path, mode="r+")
        wa = np.frombuffer(a, dtype=np.uint64)
        wb = np.frombuffer(b, dtype=np.uint64)
        old = int(wb[0])
        wb[5000] = 99  # b's own write: its folio is dirty
        wa[0] = old + 1
        a.flush()
        assert int(wb[0]) == old, "b still holds its copy"
        assert b.invalidate(0, 8) >= 1
        assert int(wb[0]) == old + 1
        b.invalidate()
        assert int(wb[5000]) == 99, "dirty folios are kept"
        del wa, wb
        a.close()
        b.close()


def test_dirty_expire_writes_back_in_the_background(scratch):
    """Issue 20 item 10: data dirty longer than dirty_expire reaches the
    file without flush; a negative expiry is refused."""
    with pytest.raises(ValueError, match="dirty_expire"):
        upager.Pager(dirty_expire=-1)
    path = os.path.join(scratch, "aged")
    make_file(path, 1 * MIB)
    with upager.Pager(budget="8MiB", folio="16KiB", dirty_expire=0.2) as pager:
        r = pager.map_file(path, mode="r+")
        w = np.frombuffer(r, dtype=np.uint64)
        w[::512] = 7
        # The background writer may take the aged folios in more than one
        # batch (a loaded machine): wait for all of them, not the first.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            on_disk = np.fromfile(path, dtype=np.uint64)
            if (on_disk[::512] == 7).all():
                break
            time.sleep(0.05)
        assert r.stats()["writebacks_aged"] > 0
        assert (on_disk[::512] == 7).all(), "in the file without flush"
        del w
        r.close()
