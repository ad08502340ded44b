"""What the package ships (issue 22): type information that mypy uses
(py.typed, the extension's stubs), and a wheel with a stripped library, both
license files and the README as its description.

The wheel checked is the one `make python` built and installed (kept in
$CARGO_TARGET_DIR/wheels, default ./target/wheels)."""

import glob
import os
import struct
import subprocess
import sys
import zipfile

import pytest

import upager
from conftest import skip_or_fail

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "python", "upager")


def _mypy(args, cwd):
    try:
        import mypy  # noqa: F401
    except ImportError:
        skip_or_fail("mypy is not installed (python/requirements-dev.txt; make python)")
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "--cache-dir", os.path.join(cwd, ".mypy_cache"), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_package_type_checks_strictly(tmp_path):
    r = _mypy([PACKAGE], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr


USER_CODE = '''
import numpy as np
import upager

with upager.Pager(budget="8MiB") as pager:
    region = pager.map_file("data.bin", mode="r")
    a = np.frombuffer(memoryview(region), dtype=np.uint8)
    reveal_type(region)
    reveal_type(region.residency())
    reveal_type(pager.stats())
m = upager.memmap("x.f64", dtype=np.float64, mode="r+", shape=(10,), budget="1MiB")
reveal_type(m)
reveal_type(m.region)
reveal_type(upager.load("x.npy", mmap_mode="r"))
st = upager.safetensors.open("m.safetensors", budget="1GiB")
reveal_type(st)
reveal_type(st.metadata())
'''

MISUSE = '''
import upager
upager.Pager(budget=[1])
upager.Pager(budget="1GiB").map_file("x", mode="w")
upager.Pager().anonymous("1MiB").pin(0, 4096).unpin(3)
'''


def test_users_get_types_not_any(tmp_path):
    """Checked against the installed package, as a user's code would be."""
    (tmp_path / "user.py").write_text(USER_CODE)
    r = _mypy(["user.py"], str(tmp_path))
    out = r.stdout
    assert "missing library stubs or py.typed marker" not in out, out
    revealed = {}
    for line in out.splitlines():
        if "Revealed type is" in line:
            revealed[int(line.split(":")[1])] = line.split("Revealed type is ")[1]
    # line of USER_CODE -> what its type must name (never Any)
    wants = {8: ["upager._upager.Region"], 9: ["list[tuple[", "resident_clean", "busy"],
             10: ["dict[", "str", "int"], 12: ["upager._array.PagedArray"],
             13: ["upager._upager.Region", "None"],
             14: ["upager._array.PagedArray", "NpzFile"],  # what numpy.load gives an .npz
             16: ["upager.safetensors.SafetensorsFile"], 17: ["dict[", "str", "None"]}
    for line, parts in wants.items():
        got = revealed.get(line, "")
        assert all(p in got for p in parts) and "Any" not in got, (line, got, out)
    assert "error" not in out, out
    (tmp_path / "misuse.py").write_text(MISUSE)
    r = _mypy(["misuse.py"], str(tmp_path))
    assert r.returncode == 1, r.stdout
    for line in (3, 4, 5):
        assert f"misuse.py:{line}: error" in r.stdout, r.stdout


def test_help_shows_each_class_its_own_text():
    assert "mapped region" in upager.Region.__doc__
    assert "pinned range" in upager.Pin.__doc__
    assert "hard memory budget" in upager.Pager.__doc__
    assert "numpy.memmap" in upager.memmap.__doc__


def _wheel():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = sorted(glob.glob(os.path.join(target, "wheels", f"upager-*-{tag}-*.whl")),
                   key=os.path.getmtime)
    if not found:
        skip_or_fail(f"no upager wheel for {tag} in {target}/wheels: build it with "
                     "make python")
    return found[-1]


def _elf_sections(data):
    """Section names of an ELF64 little-endian file."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
    str_off = header(shstrndx)[4]
    names = []
    for i in range(shnum):
        name = header(i)[0]
        end = data.index(b"\0", str_off + name)
        names.append(data[str_off + name:end].decode())
    return names


def test_the_wheel_carries_licenses_readme_stubs_and_a_stripped_library():
    path = _wheel()
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        version = upager.__version__
        info = f"upager-{version}.dist-info"
        for want in ("upager/__init__.py", "upager/py.typed", "upager/_upager.pyi",
                     "upager/npy.py", "upager/safetensors.py",
                     f"{info}/licenses/LICENSE-MIT", f"{info}/licenses/LICENSE-APACHE"):
            assert want in names, f"{want} missing from {path}: {names}"
        assert "MIT License" in z.read(f"{info}/licenses/LICENSE-MIT").decode() or \
            "Permission is hereby granted" in z.read(f"{info}/licenses/LICENSE-MIT").decode()
        assert "Apache License" in z.read(f"{info}/licenses/LICENSE-APACHE").decode()
        meta = z.read(f"{info}/METADATA").decode()
        assert "License-Expression: MIT OR Apache-2.0" in meta
        assert "Description-Content-Type: text/markdown" in meta
        assert "# upager for Python" in meta and "upager.memmap" in meta
        libs = [n for n in names if n.startswith("upager/_upager") and n.endswith(".so")]
        assert len(libs) == 1, names
        lib = z.read(libs[0])
        # 8.9 MB stripped since the S3 store (object_store, reqwest, tokio,
        # rustls: +3.5 MB); with debug info it is several times that.
        assert len(lib) < 12 << 20, f"{libs[0]} is {len(lib)} bytes: not stripped?"
        sections = _elf_sections(lib)
        debug = [s for s in sections if s.startswith(".debug") or s == ".symtab"]
        assert not debug, f"{libs[0]} keeps {debug}"
        assert not [n for n in names if n.endswith(".rs") or "/tests/" in n], names
