"""The fault mode from Python (issue 12): ``fault_mode=`` on Pager and
open_array, its default from UPAGER_FAULT_MODE, clear errors for a bad
value, both modes at work, and system calls on region memory (EFAULT in
"in-thread" mode until Region.fault_in)."""

import errno
import os

import numpy as np
import pytest

import upager
from conftest import MIB

BUDGET = 8 * MIB
MODES = ["handlers", "in-thread"]


def test_names():
    assert upager.FAULT_MODES == ("handlers", "in-thread")
    assert upager.FAULT_MODE_ENV == "UPAGER_FAULT_MODE"


def test_default_is_handlers_or_the_environment(monkeypatch):
    monkeypatch.delenv("UPAGER_FAULT_MODE", raising=False)
    with upager.Pager(budget=BUDGET) as pager:
        # upager chooses: in-thread where the userfaultfd is user-mode-only
        # (an ordinary user's, issue 28), else handlers.
        default = "in-thread" if pager.info()["user_mode_only"] else "handlers"
        assert pager.fault_mode == default
        assert f"fault_mode={default}" in repr(pager)
    monkeypatch.setenv("UPAGER_FAULT_MODE", "in-thread")
    pager = upager.Pager(budget=BUDGET)
    assert pager.fault_mode == "in-thread"
    pager.close()
    assert pager.fault_mode == "in-thread"  # still readable after close()
    # An argument wins over the variable.
    with upager.Pager(budget=BUDGET, fault_mode="handlers") as pager:
        assert pager.fault_mode == "handlers"
    monkeypatch.setenv("UPAGER_FAULT_MODE", "")
    with upager.Pager(budget=BUDGET) as pager:
        assert pager.fault_mode == default


def test_info_says_what_the_kernel_allowed(monkeypatch):
    """Pager.info() (issue 28): the same names on every face."""
    with upager.Pager(budget=BUDGET) as pager:
        info = pager.info()
    assert set(info) == {"fault_mode", "user_mode_only", "syscalls_fault_in",
                         "batched_unmap", "io_uring", "uffd_move", "uffd_poison",
                         "pagemap_scan", "masked"}
    assert info["fault_mode"] == pager.fault_mode
    assert info["syscalls_fault_in"] == (
        info["fault_mode"] == "handlers" and not info["user_mode_only"])
    # UPAGER_USERFAULTFD=user-mode-only: an ordinary user's userfaultfd,
    # for root too; the fault mode follows unless one is asked for.
    monkeypatch.setenv("UPAGER_USERFAULTFD", "user-mode-only")
    monkeypatch.delenv("UPAGER_FAULT_MODE", raising=False)
    with upager.Pager(budget=BUDGET) as pager:
        info = pager.info()
    assert info["user_mode_only"] and not info["syscalls_fault_in"], info
    assert info["fault_mode"] == "in-thread"
    with upager.Pager(budget=BUDGET, fault_mode="handlers") as pager:
        assert pager.info()["fault_mode"] == "handlers"
    monkeypatch.setenv("UPAGER_USERFAULTFD", "kernel")
    with pytest.raises(ValueError, match="UPAGER_USERFAULTFD"):
        upager.Pager(budget=BUDGET)


def test_bad_values_name_the_choices(monkeypatch, scratch):
    monkeypatch.delenv("UPAGER_FAULT_MODE", raising=False)
    with pytest.raises(ValueError, match='fault_mode: unknown fault mode "sigbus": '
                       'use "handlers" or "in-thread"'):
        upager.Pager(budget=BUDGET, fault_mode="sigbus")
    with pytest.raises(TypeError, match='"handlers", "in-thread" or None, not int'):
        upager.Pager(budget=BUDGET, fault_mode=1)
    path = os.path.join(scratch, "arr")
    with pytest.raises(ValueError, match='"handlers" or "in-thread"'):
        upager.open_array(path, np.uint8, (4096,), mode="w+", fault_mode="threads")
    # From the environment: the message names the variable too.
    monkeypatch.setenv("UPAGER_FAULT_MODE", "sigbus")
    with pytest.raises(ValueError, match='UPAGER_FAULT_MODE="sigbus": .*'
                       'use "handlers" or "in-thread"'):
        upager.Pager(budget=BUDGET)
    with pytest.raises(ValueError, match="UPAGER_FAULT_MODE"):
        upager.open_array(path, np.uint8, (4096,), mode="w+")
    # An argument overrides a bad variable.
    with upager.Pager(budget=BUDGET, fault_mode="in-thread") as pager:
        assert pager.fault_mode == "in-thread"


@pytest.mark.parametrize("mode", MODES)
def test_open_array_in_each_mode(data64, mode):
    """An array 8x the budget read, updated and flushed; the counters show
    which mode took the faults."""
    path, words = data64
    a = upager.open_array(path, np.uint64, mode="r+", budget=BUDGET, folio="4KiB",
                          fault_mode=mode)
    assert a.region.fault_mode == mode
    assert int(a.sum(dtype=np.uint64)) == int(words.sum(dtype=np.uint64))
    a[::512] += np.uint64(1)
    a.flush()
    s = a.pager_stats()
    assert s["resident_peak_bytes"] <= s["budget_bytes"] == BUDGET
    assert s["faults_missing"] > 0 and s["evictions"] > 0
    if mode == "in-thread":
        assert s["faults_in_thread"] > 0
    else:
        assert s["faults_in_thread"] == 0
    del a
    want = words.copy()
    want[::512] += np.uint64(1)
    assert np.array_equal(np.fromfile(path, dtype=np.uint64), want)


@pytest.mark.parametrize("mode", MODES)
def test_system_calls_on_region_memory(data64, scratch, mode):
    """os.write from, and readinto into, never-touched region memory: EFAULT
    in "in-thread" mode, or with a user-mode-only userfaultfd (an ordinary
    user's: issue 28), until Region.fault_in; works at once with handlers
    otherwise (Region.syscalls_fault_in says which)."""
    path, words = data64
    n, off = 256 * 1024, 4 * MIB
    out = os.path.join(scratch, "out")
    with upager.Pager(budget=BUDGET, fault_mode=mode) as pager:
        region = pager.map_file(path, mode="r+")
        assert region.fault_mode == mode and f"fault_mode={mode}" in repr(region)
        info = pager.info()
        assert region.syscalls_fault_in == info["syscalls_fault_in"] == (
            mode == "handlers" and not info["user_mode_only"])
        efault = not region.syscalls_fault_in
        view = memoryview(region)
        fd = os.open(out, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        try:
            if efault:
                with pytest.raises(OSError) as e:
                    os.write(fd, view[off:off + n])
                assert e.value.errno == errno.EFAULT
                region.fault_in(off, n)
            assert os.write(fd, view[off:off + n]) == n
        finally:
            os.close(fd)
        got = np.fromfile(out, dtype=np.uint64)
        assert np.array_equal(got, words[off // 8:(off + n) // 8])
        # Into the region: a read(2) writes region memory.
        dst = 16 * MIB
        with open(out, "rb", buffering=0) as f:
            if efault:
                with pytest.raises(OSError) as e:
                    f.readinto(view[dst:dst + n])
                assert e.value.errno == errno.EFAULT
                f.seek(0)
                region.fault_in(dst, n, write=True)
            assert f.readinto(view[dst:dst + n]) == n
        a = np.frombuffer(region, dtype=np.uint64)
        assert np.array_equal(a[dst // 8:(dst + n) // 8], got)
        del a, view
        with pytest.raises(ValueError, match="outside the region"):
            region.fault_in(64 * MIB, 1)
        region.close()
    ro = upager.Pager(budget=BUDGET, fault_mode=mode).map_file(path)
    with pytest.raises(OSError, match="read-only"):
        ro.fault_in(0, 4096, write=True)
    ro.close()


@pytest.mark.parametrize("mode", MODES)
def test_pin_is_a_context_manager_that_keeps_a_range_resident(data64, scratch, mode):
    """Region.pin (issue 15): inside the with block the range is resident
    and counted in pinned_bytes, survives a scan of the whole region (8x
    the budget), and system calls on it work in either mode; on exit it is
    unpinned; pinning more than half the budget fails with ENOMEM and pins
    nothing."""
    path, words = data64
    n, off = 1 * MIB, 4 * MIB
    out = os.path.join(scratch, "pinned")
    with upager.Pager(budget=BUDGET, fault_mode=mode) as pager:
        region = pager.map_file(path, mode="r+")
        a = np.frombuffer(region, dtype=np.uint64)
        with region.pin(off, n, write=True) as pin:
            assert isinstance(pin, upager.Pin) and "offset" in repr(pin)
            assert pager.stats()["pinned_bytes"] == n
            assert int(a[::512].sum(dtype=np.uint64)) == int(words[::512].sum(dtype=np.uint64))
            assert all(region.mincore(off, n)), "a pinned range was evicted"
            fd = os.open(out, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
            try:
                assert os.write(fd, memoryview(region)[off:off + n]) == n
            finally:
                os.close(fd)
        assert pager.stats()["pinned_bytes"] == 0
        assert "unpinned" in repr(pin)
        pin.unpin()  # a second unpin does nothing
        assert np.array_equal(np.fromfile(out, dtype=np.uint64), words[off // 8:(off + n) // 8])
        with pytest.raises(OSError) as e:
            region.pin(0, BUDGET)
        assert e.value.errno == errno.ENOMEM
        assert pager.stats()["pinned_bytes"] == 0
        del a
        region.close()
