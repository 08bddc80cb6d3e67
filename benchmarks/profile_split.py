#!/usr/bin/env python3
"""Tables for profile.sh (standard library and `perf` only).

profile_split.py stat N OUT_DIR NAME...    perf stat counts per session
profile_split.py record N OUT_DIR NAME...  cpu-clock samples as µs per session,
                                           by class, and the top user symbols
N is the number of sessions each process served in the watched run.
"""
import collections
import re
import subprocess
import sys

CLASSES = ["kernel", "libc", "allocator", "runtime", "own", "other"]
SAMPLE = re.compile(r"\s+[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.*)")
HZ_LINE = re.compile(r"sample_freq } = (\d+)")


def classify(dso, kind, sym):
    """The class of one perf symbol."""
    if kind == "k":
        return "kernel"
    if dso.startswith(("libc", "libm", "[vdso]", "ld-linux", "libgcc")):
        return "libc"
    if re.search(r"(^|[^a-z])_?mi_|mimalloc", sym):
        return "allocator"
    if sym.startswith(("tokio::", "<tokio::", "mio::", "<mio::")):
        return "runtime"
    if "patchbay" in sym or "tcp_relay" in sym:
        return "own"
    return "other"


def stat(n, out, names):
    rows = collections.OrderedDict()
    for name in names:
        with open(f"{out}/stat-{name}.csv") as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) < 3 or line.startswith("#"):
                    continue
                try:
                    value = float(parts[0])
                except ValueError:
                    continue
                event = parts[2].replace("syscalls:sys_enter_", "syscall ")
                event = event.replace("raw_syscalls:sys_enter", "syscalls (all)")
                if event == "task-clock":  # perf prints it in ms
                    event, value = "task-clock (µs)", value * 1000.0
                rows.setdefault(event, {})[name] = value / n
    print(f"| per session | {' | '.join(names)} |")
    print(f"|---|{'---|' * len(names)}")
    for event, values in rows.items():
        cells = " | ".join(f"{values.get(name, 0):.1f}" for name in names)
        print(f"| {event} | {cells} |")


def report(path):
    out = subprocess.run(
        ["perf", "report", "-i", path, "--stdio", "--no-children", "--sort",
         "dso,sym", "-g", "none", "--show-nr-samples", "--header"],
        capture_output=True, text=True, check=True).stdout
    hz = HZ_LINE.search(out)
    samples = []
    for line in out.splitlines():
        m = SAMPLE.match(line)
        if m:
            samples.append((int(m.group(1)), m.group(2), m.group(3), m.group(4)))
    return (int(hz.group(1)) if hz else None), samples


def record(n, out, names):
    classes, tops = {}, {}
    for name in names:
        hz, samples = report(f"{out}/record-{name}.data")
        if not hz:
            sys.exit(f"no sample frequency in {out}/record-{name}.data")
        per = 1e6 / hz / n  # µs of CPU per session that one sample stands for
        counts = collections.Counter()
        for count, dso, kind, sym in samples:
            counts[classify(dso, kind, sym)] += count * per
        classes[name] = counts
        tops[name] = sorted(((count * per, sym) for count, _, kind, sym in samples
                             if kind != "k"), reverse=True)[:12]
    print(f"| µs per session | {' | '.join(names)} |")
    print(f"|---|{'---|' * len(names)}")
    for c in CLASSES + ["all"]:
        cells = []
        for name in names:
            v = sum(classes[name].values()) if c == "all" else classes[name][c]
            cells.append(f"{v:.0f}")
        print(f"| {c} | {' | '.join(cells)} |")
    for name in names:
        print(f"\ntop user-space symbols of {name} (µs per session):")
        for us, sym in tops[name]:
            print(f"  {us:6.1f}  {sym[:120]}")


def main():
    if len(sys.argv) < 5 or sys.argv[1] not in ("stat", "record"):
        sys.exit(__doc__)
    n = int(sys.argv[2])
    (stat if sys.argv[1] == "stat" else record)(n, sys.argv[3], sys.argv[4:])


if __name__ == "__main__":
    main()
