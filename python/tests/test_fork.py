"""Issue 21 items 1 and 4: fork and multiprocessing.

- a forked child reads the whole inherited array right, including the
  parent's writes made (not flushed) before the fork, and its writes reach
  the file;
- pickling a PagedArray (and views of it) reopens it;
- multiprocessing.Pool with each start method and ProcessPoolExecutor, 2 to
  8 workers each writing a block of rows: the file is exact after the
  join, with the blocks in folios of their own and with blocks that share
  folios (boundaries not folio-aligned: twins and diffs, issue 21 item 2);
  a parent and its fork child writing halves of one folio both land.

Every wait has a timeout; forked children are reaped (killed if overdue).
"""

import concurrent.futures
import multiprocessing as mp
import os
import pickle
import signal
import time

import numpy as np
import pytest

import upager

MIB = 1 << 20
FOLIO = 64 << 10
COLS = 1000  # a row is 8,000 bytes: row boundaries are not folio-aligned


def _reap(pid, timeout=120):
    """The exit code of forked child `pid` (128 + signal if killed by one),
    waiting at most `timeout` seconds; an overdue child is killed."""
    end = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"forked child {pid} overdue: killed")
        time.sleep(0.005)


def _fork(body):
    """Forks; the child runs `body()` and exits 0 if it returned True, 1 if
    False, 2 if it raised. Returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = 0 if body() else 1
        except BaseException as e:  # report, and never return into pytest
            os.write(2, f"child: {e!r}\n".encode())
        finally:
            os._exit(code)
    return pid


def _expected(rows):
    return np.arange(rows * COLS, dtype=np.float64).reshape(rows, COLS)


@pytest.fixture
def table(scratch):
    """A float64 file of 1,048 rows of 1,000 columns (8.4 MB), each value
    its own index."""
    rows = 1048
    path = os.path.join(scratch, "table.f64")
    _expected(rows).tofile(path)
    return path, rows


def test_a_forked_child_reads_the_whole_array_and_its_writes_land(table):
    path, rows = table
    a = upager.memmap(path, np.float64, mode="r+", shape=(rows, COLS), budget="2MiB")
    a[0, :] = -1.0  # not flushed: the fork handler flushes it
    want = _expected(rows)
    want[0, :] = -1.0

    def child():
        if not np.array_equal(np.asarray(a), want):  # every row, 4x the budget
            return False
        a[rows - 1, :] = -2.0  # the last row: in a folio the parent never writes
        a.flush()
        return a.pager_stats()["budget_bytes"] == 2 * MIB

    assert _reap(_fork(child)) == 0
    want[rows - 1, :] = -2.0
    a.region.invalidate()  # drop clean copies: read what the child wrote
    assert np.array_equal(np.asarray(a), want)
    assert np.array_equal(np.fromfile(path, np.float64).reshape(rows, COLS), want)


def _close_inherited(a, q):
    """A fork child (multiprocessing): writes, closes and drops the array it
    inherited, then exits the way multiprocessing's children do."""
    import gc

    a[1, :] = -3.0
    a.flush()
    a.close()
    del a
    gc.collect()
    q.put("closed")


def test_a_child_that_closes_and_drops_the_inherited_array_leaves_the_parent_alone(table):
    path, rows = table
    a = upager.memmap(path, np.float64, mode="r+", shape=(rows, COLS), budget="2MiB")
    assert float(a[:, 0].sum()) == float(_expected(rows)[:, 0].sum())
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_close_inherited, args=(a, q))
    p.start()
    assert q.get(timeout=120) == "closed"
    p.join(60)
    if p.exitcode is None:
        p.kill()
        p.join(10)
    assert p.exitcode == 0
    # The parent's array and pager work on (no destructor of theirs ran
    # in the child); the child's row is in the file.
    assert a.pager_stats()["budget_bytes"] == 2 * MIB
    a.region.invalidate()
    assert (a[1] == -3.0).all() and a[2, 0] == 2 * COLS
    a[3, :] = 7.0
    a.flush()
    assert (np.fromfile(path, np.float64).reshape(rows, COLS)[3] == 7.0).all()


def test_an_inherited_anonymous_region_is_refused_in_the_child():
    with upager.Pager(budget="4MiB") as pager:
        r = pager.anonymous(MIB)

        def child():
            try:
                r.stats()
            except BaseException as e:  # a Rust panic: PanicException
                return "not inherited" in str(e)
            return False

        assert _reap(_fork(child)) == 0
        r.close()


def test_pickling_reopens_the_array_and_its_views(table):
    path, rows = table
    a = upager.memmap(path, np.float64, mode="r+", shape=(rows, COLS), budget="4MiB",
                      folio="16KiB")
    for view in (a, a[3:17], a[5:900:7, 1:999:3], a.T[::-1], a[10]):
        b = pickle.loads(pickle.dumps(view))
        assert isinstance(b, upager.PagedArray)
        assert b.region is not None and b.region is not view.region
        assert b.shape == view.shape and b.dtype == view.dtype
        assert np.array_equal(np.asarray(b), np.asarray(view))
        assert b.pager_stats()["budget_bytes"] == 4 * MIB
        assert b.region.folio == 16 << 10
    b = pickle.loads(pickle.dumps(a[7:9]))
    b[:] = 5.0
    b.flush()
    a.region.invalidate()
    assert (a[7:9] == 5.0).all() and a[6, 0] == 6 * COLS
    r = pickle.loads(pickle.dumps(upager.memmap(path, np.float64, mode="r")))
    assert r.mode == "r" and not r.flags.writeable
    c = upager.memmap(path, np.float64, mode="c")
    c[0] = 42.0
    cc = pickle.loads(pickle.dumps(c))  # mode "c": the data, as numpy.memmap
    assert not isinstance(cc, upager.PagedArray) and cc[0] == 42.0


def _write_rows(a, lo, hi):
    """A worker: writes rows [lo, hi) of `a` (pickled: opened again here)."""
    a[lo:hi] = -np.arange(lo * COLS, hi * COLS, dtype=np.float64).reshape(-1, COLS)
    a.flush()
    return os.getpid()


_INHERITED = None


def _write_rows_inherited(lo, hi):
    """A fork worker: writes rows [lo, hi) of the array it inherited."""
    return _write_rows(_INHERITED, lo, hi)


def _blocks(rows, workers, disjoint):
    """`workers` blocks of rows; with `disjoint`, each block keeps to folios
    of its own (a row or two left out at each folio boundary), else the
    blocks meet at row boundaries inside folios."""
    if not disjoint:
        step = rows // workers
        return [(i * step, rows if i == workers - 1 else (i + 1) * step)
                for i in range(workers)]
    row_bytes = COLS * 8
    span = rows * row_bytes // workers // FOLIO * FOLIO  # whole folios each
    out = []
    for i in range(workers):
        lo_b, hi_b = i * span, (i + 1) * span
        lo = -(-lo_b // row_bytes)  # first row starting in the span
        hi = hi_b // row_bytes      # rows ending inside it
        out.append((lo, hi))
    return out


def _check_blocks(path, rows, blocks):
    got = np.fromfile(path, np.float64).reshape(rows, COLS)
    want = _expected(rows)
    for lo, hi in blocks:
        want[lo:hi] = -want[lo:hi]
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} values wrong, first at {bad[0].tolist()}"


def _run_pool(method, a, blocks):
    global _INHERITED
    ctx = mp.get_context(method)
    _INHERITED = a  # before the workers start: the fork ones inherit it
    with ctx.Pool(len(blocks)) as pool:
        if method == "fork":
            # Half the blocks through the inherited array, half pickled.
            half = len(blocks) // 2
            r1 = pool.starmap_async(_write_rows_inherited, blocks[:half])
            r2 = pool.starmap_async(_write_rows, [(a, lo, hi) for lo, hi in blocks[half:]])
            pids = r1.get(timeout=180) + r2.get(timeout=180)
        else:
            pids = pool.starmap_async(_write_rows,
                                      [(a, lo, hi) for lo, hi in blocks]).get(timeout=180)
    _INHERITED = None
    return pids


@pytest.mark.parametrize("workers", [2, 3, 8])
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver", "executor"])
def test_workers_writing_blocks_in_folios_of_their_own_leave_the_file_exact(
        table, method, workers):
    path, rows = table
    a = upager.memmap(path, np.float64, mode="r+", shape=(rows, COLS), budget="2MiB")
    blocks = _blocks(rows, workers, disjoint=True)
    assert all(lo * COLS * 8 % FOLIO for lo, _ in blocks[1:]), "unaligned starts"
    if method == "executor":
        with concurrent.futures.ProcessPoolExecutor(workers) as ex:
            futs = [ex.submit(_write_rows, a, lo, hi) for lo, hi in blocks]
            pids = [f.result(timeout=180) for f in futs]
    else:
        pids = _run_pool(method, a, blocks)
    assert os.getpid() not in pids
    del a
    _check_blocks(path, rows, blocks)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_workers_writing_blocks_that_share_folios_leave_the_file_exact(table, method):
    path, rows = table
    a = upager.memmap(path, np.float64, mode="r+", shape=(rows, COLS), budget="2MiB")
    blocks = _blocks(rows, 7, disjoint=False)
    _run_pool(method, a, blocks)
    del a
    _check_blocks(path, rows, blocks)


def test_parent_and_child_writing_halves_of_one_folio_both_land(table):
    path, rows = table
    a = upager.memmap(path, np.float64, mode="r+", budget="2MiB")
    half = FOLIO // 8 // 2
    a[0]  # the folio is resident (clean) in the parent at the fork

    def child():
        a[half:2 * half] = -2.0
        a.flush()
        return True

    pid = _fork(child)
    a[:half] = -1.0
    assert _reap(pid) == 0
    a.flush()
    got = np.fromfile(path, np.float64)
    assert (got[:half] == -1.0).all() and (got[half:2 * half] == -2.0).all()
