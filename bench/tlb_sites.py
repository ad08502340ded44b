"""Remote TLB flush IPI sends (tlb:tlb_flush reason 4) of one process by
call site: each event line is followed by the stack trace of that event
(same thread); the first known caller in it names the site.

Usage: tlb_sites.py TRACE TGID   (a trace written by bench/tlb_sites.sh)
"""
import collections
import re
import sys

SITES = [
    ("move_pages_huge_pmd", "UFFDIO_MOVE of a huge page (pmdp_huge_clear_flush of the source PMD)"),
    ("move_pages", "UFFDIO_MOVE (PTE level)"),
    ("mwriteprotect_range", "UFFDIO_WRITEPROTECT"),
    ("vector_madvise", "process_madvise(MADV_DONTNEED)"),
    ("do_madvise", "madvise"),
    ("__vm_munmap", "munmap"),
    ("exit_mmap", "exit"),
]


def main(path, tgid):
    lines = open(path).read().split("\n")
    sites, pages = collections.Counter(), collections.Counter()
    total = 0
    for i, line in enumerate(lines):
        m = re.match(r"\s*(\S+-\d+)\s+\(\s*(\d+)\)", line)
        if not (m and "tlb_flush:" in line and m.group(2) == tgid):
            continue
        total += 1
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(m.group(1)) and "<stack trace>" in lines[j]
        ):
            j += 1
        stack = []
        j += 1
        while j < len(lines) and lines[j].startswith(" =>"):
            stack.append(lines[j][4:].strip())
            j += 1
        site = next((name for key, name in SITES if key in stack), None)
        site = site or "other: " + " < ".join(stack[1:6])
        sites[site] += 1
        pages[(site, re.search(r"pages:(-?\d+)", line).group(1))] += 1
    print(f"remote IPI sends of process {tgid}: {total}")
    for site, n in sites.most_common():
        print(f"{n:7d}  {site}")
    print("by the event's pages field (-1: full flush):")
    for (site, p), n in pages.most_common():
        print(f"{n:7d}  pages:{p:>5}  {site}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
