#!/usr/bin/env python3
"""Print a benchmark report (JSON from `upager bench`) as a Markdown table.

Usage: python3 bench/md_table.py REPORT.json [...]

One row per variant x engine: median of the metric over the interleaved
rounds, min..max, ratio vs `kernel` (and vs the other kernel engines), CPU,
TLB shootdowns (tlb:tlb_flush remote sends of the engine's process) and
shootdowns per 1000 evicted 4 KiB pages; the p50/p99/max latency of one
access where the scenario times them (random-read, multi-fault); and a table
of phases (time, rate, ratio vs the baseline engine) where it has phases
(numpy: by variant too, one per kind of data, where there are several).
"""
import json
import sys


def fmt(v, digits=3):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) < 0.01 and v != 0:
        return f"{v:.2e}"
    return f"{v:.{digits}f}"


def main(paths):
    for p in paths:
        rep = json.load(open(p))
        metric = {"ElapsedS": "elapsed s", "OpsPerS": "ops/s", "SysS": "sys s"}[rep["metric"]]
        print(f"**{rep['scenario']}** — seed {rep['seed']} · {rep['date']} · "
              f"median of {rep['params']['rounds']} interleaved rounds\n")
        lat = any(r.get("latency_p50_ns") is not None for r in rep["summary"])
        base = rep.get("baseline_engine", "kernel")
        vs_col = "vs kernel" if base == "kernel" else f"vs {base}"
        print(f"| variant | engine | {metric} (min–max) | {vs_col} | elapsed s | user s | sys s "
              f"| TLB sends | sends / 1000 evicted pages |" + (" p50 µs | p99 µs | max µs |" if lat else ""))
        print("|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if lat else ""))
        us = lambda v: "-" if v is None else f"{v / 1000:.1f}"
        for r in rep["summary"]:
            vs = "-" if r.get("vs_kernel") is None else f"{r['vs_kernel']:.2f}×"
            if r.get("vs_baseline_pct") is not None:
                vs += f" ({r['vs_baseline_pct']:+.0f}% vs {rep['summary'][0]['variant']})"
            others = [f"{v:.2f}× vs {k}" for k, v in (r.get("vs_kernels") or {}).items()
                      if k != base and not r["engine"].startswith("kernel")]
            if others:
                vs += "; " + "; ".join(others)
            lo, hi = r["range"]
            val = f"{fmt(r['value'], 4)} ({fmt(lo, 4)}–{fmt(hi, 4)})"
            fail = f" ({r['failures']} failed)" if r["failures"] else ""
            print(f"| {r['variant']} | {r['engine']}{fail} | {val} | {vs} | {fmt(r['elapsed_s'])} "
                  f"| {fmt(r['user_s'])} | {fmt(r['sys_s'])} | {fmt(r.get('tlb_sends'), 0)} "
                  f"| {fmt(r.get('sends_per_1000_evicted'), 2)} |"
                  + (f" {us(r.get('latency_p50_ns'))} | {us(r.get('latency_p99_ns'))} "
                     f"| {us(r.get('latency_max_ns'))} |" if lat else ""))
        phase_names = rep.get("phase_names") or []
        if phase_names:
            units = rep.get("phase_units") or [""] * len(phase_names)
            heads = [f"{p} {u} (s) vs {base}" for p, u in zip(phase_names, units)]
            # A variant column where there are several (numpy: one per kind
            # of data, the label starting with it).
            by_variant = len({r["variant"] for r in rep["summary"]}) > 1
            first = "| variant | engine |" if by_variant else "| engine |"
            print(f"\n{first} " + " | ".join(heads) + " |")
            print("|" + "---|" * ((2 if by_variant else 1) + len(phase_names)))
            for r in rep["summary"]:
                ph, vs = r.get("phases") or {}, r.get("phases_vs_kernel") or {}
                cells = []
                for p in phase_names:
                    rate, secs = ph.get(p), ph.get(f"{p} s")
                    ratio = "-" if p not in vs else f"**{vs[p]:.2f}×**"
                    cells.append(f"{fmt(rate)} ({fmt(secs, 2)} s) {ratio}")
                row = f"| {r['variant']} | {r['engine']} |" if by_variant else f"| {r['engine']} |"
                print(f"{row} " + " | ".join(cells) + " |")
        for n in rep.get("notes") or []:
            print(f"\nnote: {n}")
        errs = [x for x in rep["runs"] if x.get("error")]
        for x in errs:
            print(f"\nfailed: {x['variant']} {x['engine']} round {x['round'] + 1}: {x['error']}")
        print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__)
        sys.exit(2)
    main(sys.argv[1:])
