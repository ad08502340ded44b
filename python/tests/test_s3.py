"""The Python face on an S3-compatible object store (issue 31): memmap,
load and safe_open of "s3://BUCKET/KEY" URLs, against a local SeaweedFS
(scripts/seaweedfs.sh, ports 22500..22505 and +10000), the objects
uploaded the way a user does, with the CLI (`upager load FILE s3://B/K`).
The C face's test (crates/capi/tests/c/store_s3.c, built with gcc against
the installed library in $UPAGER_C_PREFIX) runs on the same server.

These tests run in the suite's S3 step (`make test-python-s3`, which sets
UPAGER_TEST_S3=1, after the weed binary and the release CLI are built);
elsewhere conftest.py does not collect them. With UPAGER_TEST_S3=1 a
missing weed binary or CLI is a failure, not a skip.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Dict, Iterator

import numpy as np
import pytest

import upager
import upager.safetensors

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "seaweedfs.sh"
PORT = 22500
BUCKET = "upager-py"
MIB = 1 << 20


def _cli() -> pathlib.Path:
    exe = os.environ.get("UPAGER_CLI")
    if exe:
        return pathlib.Path(exe)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "release" / "upager"


def _script(*args: str, timeout: float = 120) -> str:
    env = dict(os.environ, UPAGER_WEED_PORT=str(PORT), UPAGER_WEED_TIMEOUT="90")
    out = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                         text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"seaweedfs.sh {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


@pytest.fixture(scope="module")
def s3() -> Iterator[Dict[str, str]]:
    """A SeaweedFS server with a bucket; the AWS_* variables set in this
    process for its lifetime (the store reads them as the AWS SDKs do)."""
    if os.environ.get("UPAGER_TEST_S3") != "1":
        pytest.skip("the S3 tests run in the suite's S3 step: make test-python-s3")
    if not _cli().exists():
        pytest.fail(f"the CLI is not built ({_cli()}): cargo build --release -p upager-cli")
    _script("wait-build", "3600", timeout=3700)
    # Stopped at teardown, and by the script once this process exits.
    os.environ["UPAGER_WEED_OWNER"] = str(os.getpid())
    try:
        _script("start", timeout=600)
    finally:
        del os.environ["UPAGER_WEED_OWNER"]
    saved = {k: os.environ.get(k) for k in
             ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")}
    env: Dict[str, str] = {}
    for part in _script("env").replace("export ", "").split():
        k, _, v = part.partition("=")
        env[k] = v
    os.environ.update(env)
    try:
        _script("mb", BUCKET)
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _script("stop")


def _upload(path: pathlib.Path, key: str) -> str:
    url = f"s3://{BUCKET}/{key}"
    out = subprocess.run([str(_cli()), "load", str(path), url], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return url


def test_memmap_of_an_object_reads_it_under_the_budget(s3: Dict[str, str],
                                                        tmp_path: pathlib.Path) -> None:
    want = np.random.default_rng(1).random(2 * MIB)  # 16 MiB of float64
    f = tmp_path / "a.f64"
    want.tofile(f)
    url = _upload(f, "arrays/a.f64")
    a = upager.memmap(url, np.float64, mode="r", budget="4MiB")
    assert isinstance(a, np.memmap)
    assert a.shape == want.shape and a.dtype == np.float64
    idx = np.random.default_rng(2).integers(0, want.size, 2000)
    assert np.array_equal(a[idx], want[idx])
    assert np.array_equal(a, want)  # a whole pass, 4x the budget
    st = a._mmap.stats()
    assert st["faults_missing"] > 0
    assert st["resident_peak_bytes"] <= 4 * MIB, st
    # The store's own counters beside the pager's: GETs, bytes received.
    assert st["store_gets"] > 0 and st["store_bytes_received"] >= want.nbytes, st
    assert a.pager_stats()["store_gets"] == a._mmap.stats()["store_gets"]
    # A slice with an offset and a shape, numpy.memmap's arguments.
    b = upager.memmap(url, np.float64, mode="r", offset=8 * 1000, shape=(10, 7),
                      budget="4MiB")
    assert np.array_equal(b, want[1000:1070].reshape(10, 7))


def test_an_object_maps_read_only_and_says_so(s3: Dict[str, str],
                                              tmp_path: pathlib.Path) -> None:
    f = tmp_path / "b.bin"
    f.write_bytes(bytes(range(256)) * 1024)
    url = _upload(f, "ro/b.bin")
    # numpy.memmap's default mode is "r+": refused, with the way out.
    with pytest.raises(ValueError, match='read-only.*mode "r"'):
        upager.memmap(url, np.uint8)
    with pytest.raises(ValueError, match="read-only"):
        upager.memmap(url, np.uint8, mode="w+", shape=(10,))
    with pytest.raises(FileNotFoundError):
        upager.memmap(f"s3://{BUCKET}/no/such/key", np.uint8, mode="r")
    a = upager.memmap(url, np.uint8, mode="r")
    assert not a.flags.writeable
    assert bytes(a[:4]) == b"\x00\x01\x02\x03"


def test_load_maps_an_npy_object(s3: Dict[str, str], tmp_path: pathlib.Path) -> None:
    want = np.asfortranarray(np.arange(300 * 200, dtype=np.int32).reshape(300, 200))
    f = tmp_path / "c.npy"
    np.save(f, want)
    url = _upload(f, "npy/c.npy")
    a = upager.load(url, budget="1MiB")
    assert a.shape == (300, 200) and a.dtype == np.int32
    assert a.flags.f_contiguous
    assert np.array_equal(a, want)
    hdr = upager.npy.read_header(url)
    assert hdr[:3] == ((300, 200), True, np.dtype(np.int32))
    b = upager.open_npy(url, mode="r")
    assert np.array_equal(b[7], want[7])
    with pytest.raises(ValueError, match='mmap_mode "r"'):
        upager.load(url, mmap_mode="c")
    with pytest.raises(ValueError, match="creates an .npy file on disk"):
        upager.open_npy(url, mode="w+", dtype=np.int8, shape=(3,))
    # What is not an .npy file is named, not mapped as one.
    z = tmp_path / "z.npz"
    np.savez(z, x=want)
    zurl = _upload(z, "npy/z.npz")
    with pytest.raises(ValueError, match="is not an .npy file"):
        upager.load(zurl)


def test_safe_open_reads_tensors_of_an_object(s3: Dict[str, str],
                                              tmp_path: pathlib.Path) -> None:
    sn = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(3)
    tensors = {f"layer{i}.w": rng.random((64, 128)).astype(np.float32) for i in range(8)}
    tensors["emb"] = rng.integers(0, 1000, (512, 64)).astype(np.int64)
    f = tmp_path / "m.safetensors"
    sn.save_file(tensors, str(f), metadata={"format": "np"})
    url = _upload(f, "models/m.safetensors")
    with upager.safetensors.safe_open(url, framework="np", budget="1MiB") as st:
        assert st.keys() == sorted(tensors)
        assert st.metadata() == {"format": "np"}
        for name in reversed(st.keys()):  # not in file order
            assert np.array_equal(st.get_tensor(name), tensors[name]), name
        assert np.array_equal(st.get_slice("emb")[10:20, 3], tensors["emb"][10:20, 3])
    # A file that breaks the format is refused from a store as from disk.
    bad = tmp_path / "bad.safetensors"
    raw = f.read_bytes()
    bad.write_bytes(raw[:-1])
    burl = _upload(bad, "models/bad.safetensors")
    with pytest.raises(upager.safetensors.SafetensorError, match="not fully covered"):
        upager.safetensors.safe_open(burl, framework="np")


def test_get_tensor_reads_the_tensor_in_and_the_header_through_the_region(
        s3: Dict[str, str], tmp_path: pathlib.Path) -> None:
    sn = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(4)
    # 4 tensors of 2 MiB: the third is read in whole when asked for.
    tensors = {f"t{i}": rng.random((512, 1024)).astype(np.float32) for i in range(4)}
    f = tmp_path / "m.safetensors"
    sn.save_file(tensors, str(f))
    url = _upload(f, "models/ahead.safetensors")
    with upager.safetensors.safe_open(url, framework="np", budget="64MiB") as st:
        # The header was read through the region: one fault, one folio.
        opened = st.stats()
        assert (opened["faults_missing"], opened["fills"]) == (1, 1), opened
        t = st.get_tensor("t2")
        # Read in by get_tensor (the default folio is 64 KiB here; the
        # tensor spans one folio more than its size): using it faults no more.
        stats = st.stats()
        assert stats["fills"] >= 1 + t.nbytes // (64 << 10), stats
        assert np.array_equal(t, tensors["t2"])
        after = st.stats()
        assert after["faults_missing"] == stats["faults_missing"] == 1, (stats, after)
    # A tensor larger than a quarter of the budget: that much read in, the
    # rest faults in.
    with upager.safetensors.safe_open(url, framework="np", budget="4MiB") as st:
        t = st.get_tensor("t1")
        stats = st.stats()
        assert stats["fills"] == 1 + (1 << 20) // (64 << 10), stats
        assert np.array_equal(t, tensors["t1"])
    # An empty object is refused as safetensors refuses an empty file.
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    eurl = _upload(empty, "models/empty.safetensors")
    with pytest.raises(upager.safetensors.SafetensorError, match="header too small"):
        upager.safetensors.safe_open(eurl, framework="np")


def test_a_wrong_secret_is_an_error_that_names_no_secret(s3: Dict[str, str],
                                                         tmp_path: pathlib.Path) -> None:
    f = tmp_path / "d.bin"
    f.write_bytes(b"x" * 4096)
    url = _upload(f, "auth/d.bin")
    os.environ["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    try:
        with pytest.raises(OSError) as e:
            upager.load(url)
        assert "not-the-secret" not in str(e.value)
        with pytest.raises(OSError) as e2:
            upager.memmap(url, np.uint8, mode="r")
        assert "not-the-secret" not in str(e2.value)
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = s3["AWS_SECRET_ACCESS_KEY"]


def test_the_c_face_maps_an_object(s3: Dict[str, str], tmp_path: pathlib.Path) -> None:
    prefix = os.environ.get("UPAGER_C_PREFIX")
    if not prefix:
        pytest.skip("UPAGER_C_PREFIX (an installed C library: make install-c) is not set")
    n = 4 * MIB
    f = tmp_path / "pattern.bin"
    i = np.arange(n // 8, dtype=np.uint64)
    with np.errstate(over="ignore"):
        ((i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)).tofile(f)  # common.h's pattern()
    url = _upload(f, "c/pattern.bin")
    src = ROOT / "crates" / "capi" / "tests" / "c"
    exe = tmp_path / "store_s3"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11", "-pthread",
                    f"-I{src}", f"-I{prefix}/include", str(src / "store_s3.c"), "-o", str(exe),
                    f"-L{prefix}/lib", "-lupager", f"-Wl,-rpath,{prefix}/lib"],
                   check=True, timeout=120)
    out = subprocess.run([str(exe), url, str(n)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "store_s3: ok" in out.stdout


def test_memmap_of_a_dataset_writes_back_under_the_budget(s3: Dict[str, str],
                                                          tmp_path: pathlib.Path) -> None:
    """A dataset (s3://BUCKET/NAME/, uploaded with `upager load`) maps
    "r+" under a budget a quarter of its size: scattered writes go back
    as conditional PUTs of their groups (whole: the writable map's folio
    is the group, so none is read back first) and read back from a fresh
    map (read-only: 64 KiB folios); "w+" creates one (zeros), and
    delete_dataset removes it."""
    want = np.random.default_rng(5).random(2 * MIB)  # 16 MiB of float64
    f = tmp_path / "d.f64"
    want.tofile(f)
    url = _upload(f, "sets/d/")
    a = upager.memmap(url, np.float64, mode="r+", budget="4MiB")
    assert a.flags.writeable and a.shape == want.shape
    idx = np.unique(np.random.default_rng(6).integers(0, want.size, 3000))
    a[idx] = -1.0
    want[idx] = -1.0
    a.flush()
    st = a._mmap.stats()
    assert st["resident_peak_bytes"] <= 4 * MIB, st
    assert st["store_puts"] > 0 and st["store_bytes_sent"] > 0, st
    assert a._mmap.folio == 256 << 10 and st["store_rmw_groups"] == 0, st
    del a
    b = upager.memmap(url, np.float64, mode="r", budget="4MiB")
    assert b._mmap.folio == 64 << 10
    assert np.array_equal(b, want)
    del b
    new = f"s3://{BUCKET}/sets/new/"
    c = upager.memmap(new, np.int64, mode="w+", shape=(1000, 100), budget="4MiB")
    assert not c.any()
    c[::7] = 3
    c.flush()
    del c
    d = upager.memmap(new, np.int64, mode="r", shape=(1000, 100))
    assert int(d.sum()) == 3 * 100 * len(range(0, 1000, 7))
    del d
    with pytest.raises(FileExistsError):
        upager.memmap(new, np.int64, mode="w+", shape=(10,))
    upager.delete_dataset(new)
    upager.delete_dataset(url)
    with pytest.raises(FileNotFoundError):
        upager.memmap(url, np.float64, mode="r")


def test_far_memory_swaps_to_an_s3_prefix(s3: Dict[str, str]) -> None:
    """Anonymous memory with store="s3://BUCKET/PREFIX/": evicted folios go
    to objects under a unique name there, and are removed at close; an
    object URL is refused (anonymous memory swaps to a bucket or prefix)."""
    with upager.Pager(budget="4MiB") as pager:
        r = pager.anonymous("16MiB", store=f"s3://{BUCKET}/swap/")
        x = np.frombuffer(r, dtype=np.uint64)
        x[::512] = np.arange(len(x[::512]), dtype=np.uint64)
        assert np.array_equal(x[::512], np.arange(len(x[::512]), dtype=np.uint64))
        st = pager.stats()
        assert st["writebacks"] > 0 and st["resident_peak_bytes"] <= 4 * MIB, st
        del x
        r.close()
    out = subprocess.run([str(_cli()), "list", f"s3://{BUCKET}/swap/"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "swap-" not in out, out
    with upager.Pager(budget="4MiB") as pager:
        with pytest.raises(ValueError, match="bucket or a prefix"):
            pager.anonymous("1MiB", store=f"s3://{BUCKET}/an/object")


def _run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(_cli()), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_cli_demo_and_stat_page_an_object(s3: Dict[str, str],
                                              tmp_path: pathlib.Path) -> None:
    """The CLI's faces on an object: `upager demo --store s3://BUCKET/PREFIX/`
    uploads its dataset as an object, reads it read-only (every word
    checked; 5,000 random reads per thread by default, each evicted folio
    a GET) and deletes it; `upager stat --store URL` maps an object
    read-only and prints its residency after each step and its GETs."""
    out = _run_cli("demo", "--store", f"s3://{BUCKET}/cli/", "--size", "32M",
                   "--budget", "8M", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every word read was checked" in out.stdout, out.stdout
    assert "random reads" in out.stdout and "K/s" in out.stdout, out.stdout
    assert f"deleted s3://{BUCKET}/cli/upager-demo-" in out.stdout, out.stdout
    listed = _run_cli("list", f"s3://{BUCKET}/cli/", timeout=120)
    assert listed.returncode == 0 and "upager-demo" not in listed.stdout, listed.stdout

    f = tmp_path / "s.bin"
    f.write_bytes(os.urandom(16 * MIB))
    url = _upload(f, "stat/s.bin")
    out = _run_cli("stat", "--store", url, "--budget", "4M")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"read-only region of {url}: 16 MiB, 64 KiB folios" in out.stdout, out.stdout
    assert "read the first half" in out.stdout and "store_gets" in out.stdout, out.stdout
    # An object of under four folios: no quarter to page out, no error.
    t = tmp_path / "t.bin"
    t.write_bytes(os.urandom(10_000))
    out = _run_cli("stat", "--store", _upload(t, "stat/t.bin"))
    assert out.returncode == 0 and "under four folios" in out.stdout, out.stdout + out.stderr
    out = _run_cli("stat", "--store", f"s3://{BUCKET}/stat/missing.bin")
    assert out.returncode != 0 and "no such object" in out.stderr, out.stderr


def test_the_cli_demo_interrupted_in_its_upload_leaves_nothing(s3: Dict[str, str],
                                                               tmp_path: pathlib.Path) -> None:
    """SIGINT while `upager demo --store s3://...` uploads its dataset: the
    multipart upload stops at its next batch of parts and is aborted, the
    demo exits with 130, and no object is left (before, the demo exited at
    once and left the multipart upload unfinished on the server)."""
    import signal
    import time
    p = subprocess.Popen([str(_cli()), "demo", "--store", f"s3://{BUCKET}/cli-int/",
                          "--size", "512M", "--dir", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "made dataset" in line:
                break
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out + err
    assert "stopping the upload" in err, err
    listed = _run_cli("list", f"s3://{BUCKET}/cli-int/", timeout=120)
    assert listed.returncode == 0 and "upager-demo" not in listed.stdout, listed.stdout
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
