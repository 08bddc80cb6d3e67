#!/usr/bin/env python3
"""Call capacity from the calls stage's steps (run.sh, stage "calls").

Each argument is the JSON of one step (`patchbay-bench --calls N --out
FILE`): N calls at once per target, every target interleaved in one run. A
target passes a step when every one of its calls completed and its added
p99 per-frame latency (its p99 minus direct's in the same step, each
direction) is under --limit-ms; direct passes when its calls complete (its
own p99s are printed: they show how loaded the machine was). A
target's capacity is the largest N it passed with every smaller step passed
too; its ratio to tcp-relay's is printed beside it. Given one step, it prints
each target's verdict at that N instead (the calls-latency stage).

With --quiet and one step: prints nothing, and exits 1 when no target but
direct passed (run.sh then stops stepping up).
"""

import argparse
import json
import sys

BASELINE = "direct"
FLOOR = "tcp-relay"


def verdicts(step, limit_ms):
    """{target: (passed, why)} for one step's JSON."""
    targets = {t["name"]: t for t in step["targets"]}
    base = targets.get(BASELINE)
    out = {}
    for name, t in targets.items():
        if t["completed"] < t["calls"]:
            out[name] = (False, f"{t['calls'] - t['completed']} of {t['calls']} calls failed")
            continue
        if name == BASELINE:
            # Its own p99s show how loaded the machine was at this step.
            p99 = "/".join(f"{t[d]['p99_ns'] / 1e6:.1f}" if t.get(d) else "n/a" for d in ("up", "down"))
            out[name] = (True, f"p99 up/down {p99} ms")
            continue
        worst = []
        for d in ("up", "down"):
            if not (t.get(d) and base and base.get(d)):
                worst.append((float("inf"), d))
                continue
            worst.append(((t[d]["p99_ns"] - base[d]["p99_ns"]) / 1e6, d))
        added, d = max(worst)
        ok = added < limit_ms
        out[name] = (ok, f"added p99 {added:+.3f} ms ({d})")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", nargs="+")
    ap.add_argument("--limit-ms", type=float, default=5.0)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    steps = []
    for path in args.steps:
        with open(path) as f:
            step = json.load(f)
        steps.append((step["calls_per_target"], verdicts(step, args.limit_ms)))
    steps.sort()
    if args.quiet:
        _, v = steps[-1]
        sys.exit(0 if any(ok for name, (ok, _) in v.items() if name != BASELINE) else 1)
    names = list(steps[0][1])
    if len(steps) == 1:
        # One N (the calls-latency stage): a verdict per target, no capacity.
        n, v = steps[0]
        print(f"at {n} calls (added p99 < {args.limit_ms:g} ms both ways against {BASELINE}, every call completed):")
        width = max(len(name) for name in names)
        for name in names:
            ok, why = v[name]
            print(f"{name:<{width}}  {'pass' if ok else 'FAIL'}  {why}")
        return
    capacity = {}
    for name in names:
        cap = 0
        for n, v in steps:
            if not v.get(name, (False, ""))[0]:
                break
            cap = n
        capacity[name] = cap
    print(f"call capacity (added p99 < {args.limit_ms:g} ms both ways against {BASELINE}, every call completed):")
    width = max(len(n) for n in names)
    header = "".join(f"  {'N=' + str(n):>28}" for n, _ in steps)
    print(f"{'target':<{width}}  {'capacity':>8}  {'× ' + FLOOR:>12}{header}")
    for name in names:
        floor = capacity.get(FLOOR)
        ratio = f"{capacity[name] / floor:.2f}" if floor else "n/a"
        cells = "".join(
            f"  {('pass ' if v[name][0] else 'FAIL ') + v[name][1]:>28}" for _, v in steps if name in v
        )
        # Passing the largest step measured is a lower bound.
        cap = f"≥{capacity[name]}" if capacity[name] == steps[-1][0] else str(capacity[name])
        print(f"{name:<{width}}  {cap:>8}  {ratio:>12}{cells}")


if __name__ == "__main__":
    main()
