"""numpy's own memmap and .npy tests, run against upager with only the
imports swapped (used by test_numpy_suite.py; ``python numpy_suite.py
[handlers|in-thread] [--slow]`` prints the results; --slow adds numpy's
two slow tests).

The test files are read from the installed numpy at run time (its wheel
ships them), never copied into this repository, so a numpy upgrade that
breaks parity fails the suite:

- ``numpy/_core/tests/test_memmap.py``: ``from upager import memmap``
  shadows numpy's ``memmap``;
- ``numpy/lib/tests/test_format.py``: ``format.open_memmap`` becomes
  ``upager.open_npy``, and ``np.load`` calls that pass ``mmap_mode`` (or
  ``**kwargs``) become ``upager.load``;
- ``numpy/lib/tests/test_io.py``: the same ``np.load`` swap; only its
  mmap tests run (``-k "mmap or memmap"``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

import numpy as np

#: (path in the numpy package, -k expression or None for every test)
SUITES: List[Tuple[str, Optional[str]]] = [
    ("_core/tests/test_memmap.py", None),
    ("lib/tests/test_format.py", None),
    ("lib/tests/test_io.py", "mmap or memmap"),
]

#: The least number of swaps each file must get: if numpy's tests stop
#: spelling the calls this way, the swap would silently test numpy against
#: itself.
MIN_SWAPS = {"test_memmap.py": 1, "test_format.py": 5, "test_io.py": 3}


def _is_np_load_with_mmap(node: ast.Call) -> bool:
    f = node.func
    if not (isinstance(f, ast.Attribute) and f.attr == "load"
            and isinstance(f.value, ast.Name) and f.value.id == "np"):
        return False
    return any(k.arg in ("mmap_mode", None) for k in node.keywords)


def rewrite(source: str, name: str) -> Tuple[str, int]:
    """`source` with the imports swapped; the number of swaps."""
    tree = ast.parse(source)
    spans = []  # (line, col, end_col, replacement)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_np_load_with_mmap(node):
            f = node.func
            spans.append((f.lineno, f.col_offset, f.end_col_offset, "upager.load"))
        elif (isinstance(node, ast.Attribute) and node.attr == "open_memmap"
              and isinstance(node.value, ast.Name) and node.value.id == "format"):
            spans.append((node.lineno, node.col_offset, node.end_col_offset,
                          "upager.open_npy"))
    lines = source.splitlines(keepends=True)
    for line, col, end, new in sorted(spans, reverse=True):
        text = lines[line - 1]
        lines[line - 1] = text[:col] + new + text[end:]
    swaps = len(spans)
    # After the last top-level import: upager's names shadow numpy's.
    last = max(n.end_lineno or n.lineno for n in tree.body
               if isinstance(n, (ast.Import, ast.ImportFrom)))
    extra = "import upager\n"
    if name == "test_memmap.py":
        imported = any(isinstance(n, ast.ImportFrom) and n.module == "numpy"
                       and any(a.name == "memmap" for a in n.names) for n in tree.body)
        if imported:
            extra += "from upager import memmap\n"
            swaps += 1
    lines.insert(last, extra)
    return "".join(lines), swaps


def prepare(workdir: str) -> List[Tuple[str, Optional[str], int]]:
    """Writes the rewritten test files into `workdir` (with a link to the
    data files they read): (file, -k expression, swaps) for each."""
    root = os.path.dirname(np.__file__)
    out = []
    for rel, expr in SUITES:
        name = os.path.basename(rel)
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text, n = rewrite(f.read(), name)
        sub = os.path.join(workdir, os.path.dirname(rel).replace("/", "_"))
        os.makedirs(sub, exist_ok=True)
        data = os.path.join(root, os.path.dirname(rel), "data")
        if os.path.isdir(data) and not os.path.exists(os.path.join(sub, "data")):
            os.symlink(data, os.path.join(sub, "data"))
        # "numpy_" + its name: a -k expression naming the module cannot
        # match a test's name (test_format would match test_io's
        # test_format_2_0)
        path = os.path.join(sub, "numpy_" + name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        out.append((path, expr, n))
    return out


#: numpy's tests marked slow (numpy's own CI skips them by default): two
#: large-archive tests of test_format.py that never map (np.save, np.savez,
#: np.load without mmap_mode: nothing is swapped), 20 s on a small VM.
SLOW = "not slow"


def run(fault_mode: str, slow: bool = False, timeout: float = 300) -> Dict[str, str]:
    """Runs the rewritten tests in a pytest of their own per file, in
    `fault_mode`: {test id: "passed" / "skipped" / "failed: why"}. `slow`:
    numpy's slow tests too."""
    results: Dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="upager-numpy-suite-") as d:
        files, exprs = [], []
        for path, expr, swaps in prepare(d):
            name = os.path.basename(path)
            if swaps < MIN_SWAPS[name[len("numpy_"):]]:
                results[f"{name}::<swaps>"] = (
                    f"failed: {swaps} swaps, expected {MIN_SWAPS[name[len('numpy_'):]]} at "
                    "least: numpy's test changed how it calls memmap/open_memmap/np.load")
                continue
            files.append(path)
            exprs.append(f"({name[:-3]} and ({expr}))" if expr else name[:-3])
        # one pytest for all: its start-up (and numpy's test modules'
        # imports) is most of the time
        results.update(_run_one(d, files, " or ".join(exprs), fault_mode, slow, timeout))
    return results


def _run_one(d: str, files: List[str], expr: Optional[str], fault_mode: str, slow: bool,
             timeout: float) -> Dict[str, str]:
    xml = os.path.join(d, "results.xml")
    env = dict(os.environ, UPAGER_FAULT_MODE=fault_mode)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "--noconftest", "-W", "ignore::pytest.PytestUnknownMarkWarning",
           "--rootdir", d, "--junitxml", xml, *files]
    if expr:
        cmd += ["-k", expr]
    if not slow:
        cmd += ["-m", SLOW]
    proc = subprocess.run(cmd, cwd=d, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if not os.path.exists(xml):
        raise RuntimeError(f"pytest wrote no results (exit {proc.returncode}):\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    results = {}
    if True:
        for case in ET.parse(xml).getroot().iter("testcase"):
            tid = f"{case.get('classname')}::{case.get('name')}"
            kinds = {c.tag for c in case}
            if kinds & {"failure", "error"}:
                msg = next(c.get("message", "") for c in case if c.tag in ("failure", "error"))
                results[tid] = "failed: " + (msg or "")[:300]
            elif "skipped" in kinds:
                results[tid] = "skipped"
            else:
                results[tid] = "passed"
    if proc.returncode not in (0, 1):
        results["<pytest>"] = (
            f"failed: exit {proc.returncode}\n{proc.stdout[-2000:]}")
    return results


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "handlers"
    res = run(mode, slow="--slow" in sys.argv)
    for tid, r in sorted(res.items()):
        if r != "passed":
            print(tid, r)
    print(f"{mode}: {sum(r == 'passed' for r in res.values())} of {len(res)} passed")
