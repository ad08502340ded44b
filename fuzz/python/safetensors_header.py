"""atheris target: safetensors headers (python/upager/safetensors.py,
_parse_header), against the safetensors package (its Rust parser).

The input is a .safetensors file's bytes. Holds, for every input:
- upager accepts exactly what safetensors accepts; what it refuses raises
  upager.safetensors.HeaderError (the documented error), nothing else;
- an accepted header has the same tensors (names, dtypes, shapes) and
  metadata as safetensors reads, and every tensor's bytes lie inside the
  file (8 + header + end <= size; the tensors cover the data exactly);
- a tensor numpy can hold reads the same values through upager.safe_open
  as through safetensors.

Run: python3 fuzz/python/safetensors_header.py [libFuzzer flags] CORPUS...
"""

import os
import sys
import tempfile
import warnings

import atheris

with atheris.instrument_imports(include=["upager"]):
    import numpy as np
    from upager import safetensors as ust

import safetensors
import safetensors.numpy

warnings.simplefilter("ignore")
DIR = tempfile.mkdtemp(prefix="upager-fuzz-st-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
PATH = os.path.join(DIR, "x.safetensors")


def theirs():
    try:
        with safetensors.safe_open(PATH, framework="np") as f:
            keys = sorted(f.keys())
            meta = f.metadata()
            infos = {}
            for k in keys:
                s = f.get_slice(k)
                infos[k] = (s.get_dtype(), tuple(s.get_shape()))
            return ("ok", keys, meta, infos)
    except Exception as e:  # safetensors_rust.SafetensorError and the like
        return ("refused", f"{type(e).__name__}: {e}")


def ours():
    try:
        h = ust._parse_header(PATH)
    except ust.HeaderError as e:
        return ("refused", str(e)), None
    keys = sorted(h.entries)
    infos = {k: (e.dtype, tuple(e.shape)) for k, e in h.entries.items()}
    return ("ok", keys, h.metadata, infos), h


def test_one(data: bytes) -> None:
    with open(PATH, "wb") as f:
        f.write(data)
    t = theirs()
    o, h = ours()
    assert t[0] == o[0], f"safetensors {t!r}, upager {o!r}"
    if o[0] != "ok":
        return
    assert t == o, f"safetensors {t!r}, upager {o!r}"
    assert h.size == len(data)
    for name, e in h.entries.items():
        assert 0 <= e.begin <= e.end and h.data_start + e.end <= h.size, (name, e)
    # Values, for tensors numpy can hold (safetensors' numpy face).
    if not h.entries or any(e.dtype not in ust.DTYPES for e in h.entries.values()):
        return
    want = safetensors.numpy.load(data)
    with ust.safe_open(PATH, framework="numpy") as f:
        for name in h.entries:
            got = f.get_tensor(name)
            assert got.dtype == want[name].dtype and got.shape == want[name].shape, name
            assert got.tobytes() == want[name].tobytes(), name


def main() -> None:
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
