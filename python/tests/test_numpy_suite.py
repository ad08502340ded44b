"""numpy's own memmap and .npy tests pass against upager with only the
imports swapped (numpy_suite.py says how), in both fault modes: read from
the installed numpy at run time, so a numpy upgrade that breaks parity
fails here."""

import pytest

import numpy_suite


@pytest.mark.parametrize("fault_mode", ["handlers", "in-thread"])
def test_numpys_own_tests_pass_with_the_imports_swapped(fault_mode):
    results = numpy_suite.run(fault_mode, timeout=300)
    failed = {t: r for t, r in results.items() if r != "passed"}
    assert not failed, "\n".join(f"{t}: {r}" for t, r in sorted(failed.items()))
    by_file = {}
    for t in results:  # "_core_tests.numpy_test_memmap.TestMemmap::test_flush"
        stem = t.split("::")[0].split(".")[1]
        by_file[stem] = by_file.get(stem, 0) + 1
    # numpy 2.4 without its slow tests: 21 + 42 + 5. Fewer means a file was
    # not collected (or numpy dropped tests: look, then lower these).
    assert by_file.get("numpy_test_memmap", 0) >= 21, by_file
    assert by_file.get("numpy_test_format", 0) >= 40, by_file
    assert by_file.get("numpy_test_io", 0) >= 5, by_file


def test_the_swap_rewrites_what_it_must():
    src = (
        "import numpy as np\n"
        "from numpy import (\n    arange,\n    memmap,\n)\n"
        "from numpy.lib import format\n"
        "def t(f, kw):\n"
        "    a = format.open_memmap(f, mode='w+')\n"
        "    b = np.load(f, mmap_mode='r')\n"
        "    c = np.load(f, **kw)\n"
        "    d = np.load(f)\n"
    )
    out, n = numpy_suite.rewrite(src, "test_memmap.py")
    assert n == 4, out
    assert "from upager import memmap\n" in out and "import upager\n" in out
    assert "upager.open_npy(f, mode='w+')" in out
    assert "upager.load(f, mmap_mode='r')" in out and "upager.load(f, **kw)" in out
    assert "d = np.load(f)\n" in out  # no mmap_mode: numpy's own
    # upager's imports come after numpy's, so its names win
    assert out.index("from upager import memmap") > out.index("memmap,\n)")
