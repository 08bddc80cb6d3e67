#!/usr/bin/env python3
"""Condenses several runs of benchmarks/run.sh into the goal figures.

usage: benchmarks/summarize.py OUT_DIR [OUT_DIR ...]

Reads each OUT_DIR's main.json, floor.json and small-frames.json (the
samples patchbay-bench wrote) and prints, per run, the figures the warm-pool
goals are about: pool-on session p99, pool hit rate, first_audio p50 against
direct and against the tcp-relay floor, dial p99 against direct, and the
small-frames turn p50 difference. Percentiles are nearest-rank over the
successful sessions, as in the bench's own report. Then, for every report
that measured the targets' processes (--cpu-pid; cpu-issue.json is the
issue-15 workload with the issue's four targets, cpu.json the same with the
ws-relay and metered-relay floors as well), the CPU-seconds per 1000 sessions of tcp-relay and of each
gateway, and each gateway's ratio to tcp-relay (with the CPU-ms per session
it adds over tcp-relay) and to the other floors. Standard library only.
"""

import json
import math
import sys
from pathlib import Path


def pct(values, p):
    """Nearest-rank percentile (p in 0..100); NaN for no values (a target
    whose sessions all failed)."""
    if not values:
        return math.nan
    v = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(v)))
    return v[rank - 1]


def phases(doc, target, phase):
    key = f"{phase}_us"
    return [
        s[key] / 1000.0
        for s in doc["samples"]
        if s["target"] == target and s["ok"] and s.get(key) is not None
    ]


def hit_rate(doc, target):
    for p in doc.get("pools", []):
        if p.get("target") == target and p.get("hit_rate") is not None:
            return 100.0 * p["hit_rate"]
    return None


def cpu_per_1000(doc, target):
    for c in doc.get("cpu", []):
        if c.get("target") == target:
            return c.get("cpu_secs_per_1000_sessions")
    return None


def cpu_row(name, doc):
    """CPU per 1000 sessions of tcp-relay, ws-relay, metered-relay, pool-on
    and pool-off, and the gateways' ratios to each floor (n/a for a floor
    the run did not have); None when the report has no CPU table."""
    relay, ws, metered, on, off = (
        cpu_per_1000(doc, t)
        for t in ("tcp-relay", "ws-relay", "metered-relay", "pool-on", "pool-off")
    )
    if on is None and off is None:
        return None

    def fmt(v):
        return "n/a" if v is None else f"{v:.3f}"

    def ratio(v, floor):
        return "n/a" if v is None or not floor else f"{v / floor:.3f}"

    def ratio_ms(v, floor):
        # CPU-s per 1000 sessions are CPU-ms per session: the difference is
        # what a gateway adds per session, steadier than the ratio.
        return "n/a" if v is None or not floor else f"{v / floor:.3f} ({v - floor:+.3f})"

    return [
        name,
        fmt(relay),
        fmt(ws),
        fmt(metered),
        ratio(metered, relay),
        fmt(on),
        ratio_ms(on, relay),
        ratio(on, ws),
        ratio(on, metered),
        fmt(off),
        ratio_ms(off, relay),
        ratio(off, ws),
        ratio(off, metered),
    ]


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        print(f"  (skipped {path}: {e})", file=sys.stderr)
        return None


def row(name, doc, relay):
    on = "pool-on"

    def p50(target, phase):
        return pct(phases(doc, target, phase), 50)

    cells = [
        name,
        f"{pct(phases(doc, on, 'session'), 99):.2f}",
        "n/a" if hit_rate(doc, on) is None else f"{hit_rate(doc, on):.1f}",
        f"{p50(on, 'first_audio') / p50('direct', 'first_audio'):.2f}",
        f"{p50('pool-off', 'first_audio') / p50('direct', 'first_audio'):.2f}",
    ]
    if relay:
        r = p50("tcp-relay", "first_audio")
        cells += [
            f"{p50('tcp-relay', 'first_audio') / p50('direct', 'first_audio'):.2f}",
            f"{p50(on, 'first_audio') / r:.2f} ({p50(on, 'first_audio') - r:+.2f})",
            f"{p50('pool-off', 'first_audio') / r:.2f} ({p50('pool-off', 'first_audio') - r:+.2f})",
        ]
    else:
        cells += ["-", "-", "-"]
    d99 = pct(phases(doc, "direct", "dial"), 99)
    cells.append(f"{pct(phases(doc, on, 'dial'), 99) / d99:.2f}")
    return cells


def main(dirs):
    if not dirs:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    head = [
        "run",
        "on session p99 ms",
        "hit %",
        "on fa/direct",
        "off fa/direct",
        "relay fa/direct",
        "on fa/relay (ms)",
        "off fa/relay (ms)",
        "on dial p99/direct",
    ]
    rows = []
    small = []
    cpu = []
    for d in dirs:
        for name, relay in (("main", False), ("floor", True)):
            doc = load(Path(d) / f"{name}.json")
            if doc:
                rows.append(row(f"{Path(d).name}/{name}", doc, relay))
        for name in ("main", "floor", "small-frames", "cpu-issue", "cpu"):
            path = Path(d) / f"{name}.json"
            doc = load(path) if path.exists() else None
            r = doc and cpu_row(f"{Path(d).name}/{name}", doc)
            if r:
                cpu.append(r)
        doc = load(Path(d) / "small-frames.json")
        if doc:

            def t(target, doc=doc):
                return pct(phases(doc, target, "turn"), 50)

            def f(target, doc=doc):
                return pct(phases(doc, target, "first_audio"), 50)

            has_relay = any(s["target"] == "tcp-relay" for s in doc["samples"])
            small.append(
                [
                    Path(d).name,
                    f"{t('pool-on') - t('direct'):+.2f}",
                    f"{t('pool-off') - t('direct'):+.2f}",
                    f"{t('tcp-relay') - t('direct'):+.2f}" if has_relay else "-",
                    f"{f('pool-on') - f('direct'):+.2f}",
                    f"{f('tcp-relay') - f('direct'):+.2f}" if has_relay else "-",
                ]
            )
    if not rows and not small and not cpu:
        print("no results read", file=sys.stderr)
        return 1
    if rows:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    if small:
        print()
        h = [
            "run",
            "turn p50 on − direct (ms)",
            "off − direct",
            "relay − direct",
            "first_audio p50 on − direct",
            "relay − direct",
        ]
        print("| " + " | ".join(h) + " |")
        print("|" + "---|" * len(h))
        for r in small:
            print("| " + " | ".join(r) + " |")
    if cpu:
        print()
        h = [
            "run",
            "tcp-relay CPU-s/1000",
            "ws-relay CPU-s/1000",
            "metered-relay CPU-s/1000",
            "metered/tcp-relay",
            "pool-on CPU-s/1000",
            "on/tcp-relay (+ms/session)",
            "on/ws-relay",
            "on/metered",
            "pool-off CPU-s/1000",
            "off/tcp-relay (+ms/session)",
            "off/ws-relay",
            "off/metered",
        ]
        print("| " + " | ".join(h) + " |")
        print("|" + "---|" * len(h))
        for r in cpu:
            print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
