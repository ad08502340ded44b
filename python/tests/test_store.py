"""A Redis Cluster store from Python (issue 14): datasets uploaded with
``upager.upload_dataset`` and mapped by URL (``open_array(None, ..., store=url)``,
``Pager.map_store``), far memory (``Pager.anonymous(..., store=url)``), and
clear errors. The cluster is a local one of this module's own (ports
7300-7305 unless UPAGER_REDIS_PORT says otherwise), started through
scripts/redis-cluster.sh and stopped at the end."""

import errno
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid

import numpy as np
import pytest

import upager
from conftest import MIB, make_file, skip_or_fail

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "redis-cluster.sh")
PORT = int(os.environ.get("UPAGER_REDIS_PORT_PY", "7300"))


@pytest.fixture(scope="module")
def cluster():
    """The seed URL of a running local cluster (no dataset name)."""
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server is missing (scripts/setup.sh installs it)")
    env = dict(os.environ, UPAGER_REDIS_PORT=str(PORT))
    subprocess.run(["bash", SCRIPT, "start"], env=env, check=True, timeout=120,
                   stdout=subprocess.DEVNULL)
    try:
        yield f"redis-cluster://127.0.0.1:{PORT}"
    finally:
        subprocess.run(["bash", SCRIPT, "stop"], env=env, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def dataset(cluster):
    return f"{cluster}/py-{uuid.uuid4().hex[:12]}"


def test_a_loaded_dataset_maps_as_an_array_under_the_budget_and_keeps_writes(cluster, scratch):
    path = os.path.join(scratch, "data")
    words = make_file(path, 32 * MIB)
    url = dataset(cluster)
    seen = []
    assert upager.upload_dataset(path, url, progress=lambda d, t: seen.append((d, t))) == 32 * MIB
    assert seen[-1] == (32 * MIB, 32 * MIB)
    a = upager.open_array(None, np.uint64, mode="r+", budget="8MiB", store=url)
    assert a.shape == words.shape
    assert np.array_equal(a[::7], words[::7])
    a[::4096] = 7
    a.flush()
    st = a.pager_stats()
    assert st["resident_peak_bytes"] <= 8 * MIB
    assert st["writebacks"] > 0
    del a
    b = upager.open_array(None, np.uint64, budget="8MiB", store=url)
    want = words.copy()
    want[::4096] = 7
    assert np.array_equal(b, want)
    del b
    upager.delete_dataset(url)
    with pytest.raises(FileNotFoundError):
        upager.open_array(None, np.uint64, store=url)


def test_w_plus_creates_a_zeroed_dataset_of_the_arrays_shape(cluster):
    url = dataset(cluster)
    a = upager.open_array(None, np.float64, (1024, 1024), mode="w+",
                          budget="4MiB", store=url)
    assert float(a.sum()) == 0.0
    a[:, 3] = 1.5
    a.flush()
    del a
    b = upager.open_array(None, np.float64, (1024, 1024), budget="4MiB", store=url)
    assert float(b.sum()) == 1.5 * 1024
    del b
    upager.delete_dataset(url)


def test_far_memory_swaps_to_the_cluster(cluster):
    with upager.Pager(budget="4MiB") as pager:
        r = pager.anonymous("32MiB", store=cluster)
        x = np.frombuffer(r, dtype=np.uint64)
        x[::512] = np.arange(len(x[::512]), dtype=np.uint64)
        assert np.array_equal(x[::512], np.arange(len(x[::512]), dtype=np.uint64))
        assert int(x.sum()) == int(np.arange(len(x[::512])).sum())
        assert pager.stats()["writebacks"] > 0
        assert pager.stats()["resident_peak_bytes"] <= 4 * MIB
        del x
        r.close()


def test_store_urls_with_credentials_pass_through_and_are_never_printed():
    """Issue 22 item 6: URLs with USER:PASSWORD@ reach the Rust parser as
    given (percent-escapes included: no ValueError, a connection is tried),
    and no message quotes the password."""
    secret = "hunter2"
    url = f"redis-cluster://alice:{secret}%40x@127.0.0.1:1/x"
    with pytest.raises(ConnectionRefusedError) as e:
        upager.open_array(None, np.uint8, store=url)
    assert secret not in str(e.value) and "127.0.0.1:1" in str(e.value)
    with pytest.raises(ConnectionRefusedError) as e:
        upager.list_datasets(f"redis-cluster://:{secret}@127.0.0.1:1")
    assert secret not in str(e.value)
    with pytest.raises(ValueError) as e:
        upager.memmap("/etc/hostname", np.uint8, store=url)
    assert secret not in str(e.value), str(e.value)
    assert "redis-cluster://alice:***@127.0.0.1:1/x" in str(e.value)
    with pytest.raises(ValueError) as e:
        upager.open_array(None, np.uint8, store=f"redis://alice:{secret}@127.0.0.1:1/x")
    assert secret not in str(e.value) and "redis://alice:***@127.0.0.1:1/x" in str(e.value)
    with pytest.raises(ValueError, match="a user needs a password"):
        upager.open_array(None, np.uint8, store="redis-cluster://alice@127.0.0.1:1/x")


def test_store_misuse_is_a_clear_error(cluster, scratch):
    with pytest.raises(ValueError, match="redis-cluster://"):
        upager.open_array(None, np.uint8, store="redis://127.0.0.1:7000/x")
    with pytest.raises(ValueError, match="not both"):
        upager.open_array("/etc/hostname", np.uint8, store=f"{cluster}/x")
    with pytest.raises(ConnectionRefusedError, match="127.0.0.1:1"):
        upager.open_array(None, np.uint8, store="redis-cluster://127.0.0.1:1/x")
    path = os.path.join(scratch, "small")
    make_file(path, MIB)
    url = dataset(cluster)
    upager.upload_dataset(path, url, chunk="64KiB")
    with pytest.raises(FileExistsError):
        upager.upload_dataset(path, url)
    with pytest.raises(ValueError, match="chunk"):
        upager.open_array(None, np.uint8, folio="16KiB", store=url)
    with pytest.raises(OSError) as e:
        with upager.Pager(budget="4MiB") as p:
            p.anonymous("1MiB", store="redis-cluster://127.0.0.1:1")
    assert e.value.errno == errno.ECONNREFUSED
    upager.delete_dataset(url)
    with pytest.raises(OSError) as gone:
        upager.delete_dataset(url)  # deleted already
    assert gone.value.errno == errno.ENOENT
    with pytest.raises(ValueError, match="copy-on-write"):
        upager.memmap(None, np.uint8, "c", store=url)


def test_list_datasets_shows_a_loaded_one_until_deleted(cluster, scratch):
    path = os.path.join(scratch, "listed")
    make_file(path, 1 * MIB)
    url = dataset(cluster)
    name = url.rsplit("/", 1)[1]
    upager.upload_dataset(path, url, chunk="16KiB")
    listed = {d["name"]: d for d in upager.list_datasets(cluster)}
    assert listed[name] == {"name": name, "size": MIB, "chunk": 16384, "complete": True}
    upager.delete_dataset(url)
    assert name not in {d["name"] for d in upager.list_datasets(cluster)}
    with pytest.raises(OSError) as e:
        upager.delete_dataset(url)
    assert e.value.errno == errno.ENOENT


def test_signals_do_not_break_connecting(cluster):
    """A signal that reaches a thread blocked on a socket with a timeout
    makes the call fail with EINTR, SA_RESTART or not (signal(7)): a
    program's own handlers or a profiler's timer must not make the cluster
    unreachable (the CI run of 2026-11-27 failed so once)."""
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    main = threading.main_thread().ident
    stop = threading.Event()

    def pester():
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.001)  # 1 kHz: a fast profiler's timer

    t = threading.Thread(target=pester)
    t.start()
    try:
        for _ in range(150):
            upager.list_datasets(cluster)
    finally:
        stop.set()
        t.join(timeout=10)
        signal.signal(signal.SIGUSR1, previous)
