#!/usr/bin/env python3
"""The report of benchmarks/callgrind.sh: instructions per session (1 delta)
and per 16 kB delta for each target, and their ratio to tcp-relay. Only
the dumps' totals are used: a dump taken while threads are inside calls
credits those calls' frames with costs that do not add up per function, so
a per-function breakdown is left to reading the dumps with
callgrind_annotate.

usage: callgrind_report.py OUT_DIR N HI
"""

import glob
import json
import sys

TARGETS = ("tcp-relay", "ws-relay", "metered-relay", "gw-off")


def dump(out_dir, name):
    """The dump taken after the measured sessions (`NAME.cg.<n>`)."""
    files = sorted(glob.glob(f"{out_dir}/{name}.cg.*"))
    if not files:
        sys.exit(f"no callgrind dump for {name} in {out_dir}")
    return files[-1]


def total(path):
    """Instructions counted between the zeroing and the dump (the file's
    `summary:` line)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    sys.exit(f"no totals in {path}")


def sessions_ok(out_dir, deltas):
    """Successful sessions per target in the measured run."""
    doc = json.load(open(f"{out_dir}/run-{deltas}.json"))
    ok = {}
    for s in doc["samples"]:
        ok[s["target"]] = ok.get(s["target"], 0) + (1 if s["ok"] else 0)
    return ok


def main():
    out_dir, n, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    per = {}
    for deltas in (1, hi):
        ok = sessions_ok(out_dir, deltas)
        for t in TARGETS:
            if ok.get(t, 0) != n:
                sys.exit(f"{t}: {ok.get(t, 0)} of {n} sessions succeeded at {deltas} deltas; no figures")
            per[(t, deltas)] = total(dump(out_dir, f"{t}-{deltas}")) / n
    base = per[("tcp-relay", 1)], (per[("tcp-relay", hi)] - per[("tcp-relay", 1)]) / (hi - 1)
    print(f"\ninstructions (user space) per session at 1 delta, and per 16 kB delta"
          f" ((at {hi} − at 1) / {hi - 1}):")
    print(f"{'process':10s} {'Ir/session':>11s} {'Ir/delta':>9s} {'session × tcp-relay':>20s} {'delta × tcp-relay':>18s}")
    for t in TARGETS:
        lo = per[(t, 1)]
        d = (per[(t, hi)] - lo) / (hi - 1)
        print(f"{t:10s} {lo:11.0f} {d:9.0f} {lo / base[0]:20.2f} {d / base[1]:18.2f}")
    print(f"\nthe dumps: {out_dir}/<target>-<deltas>.cg.<n> (callgrind_annotate --inclusive=yes FILE)")

if __name__ == "__main__":
    main()
