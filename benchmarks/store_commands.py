#!/usr/bin/env python3
"""Store commands per session-minute, from the store stage of run.sh.

Reads the Redis `INFO commandstats` taken after a run (the counters were
reset with `CONFIG RESETSTAT` before it; several answers one after the
other, one per primary of a cluster, add up) and the `redis-cli MONITOR`
logs of the same run (one per primary), and prints:

1. per command, the calls `INFO commandstats` counted (a script's own
   commands included: Redis counts each `redis.call`) and per
   session-minute;
2. per feature, the round trips the gateway sent (commands from a client
   connection; a pipeline's commands count one each) and the commands its
   scripts ran, per session-minute.

Features are told apart by the first key a command names (a script's
commands go to the feature of the `EVALSHA` that ran them, which MONITOR
prints just before them):

- admission: `rpm`, `tpm` and `budget` keys read or counted outside a
  script (the admission pipeline);
- metering: the flush script (`flushed` mark first) and anything on
  `request_logs`;
- leases: fleet session leases (`sessions` keys: acquire script, renewal
  pipeline, removals);
- calls: call records, holders, indexes (`call`, `call_holder`, `calls`,
  `live_charged`);
- connection: commands without a key (`PING`, `HELLO`, `CLIENT`,
  `SCRIPT LOAD`, …);
- other: any other key family, named.

The run's own commands (`CONFIG RESETSTAT`, `MONITOR`, `INFO`) and the
replication commands a cluster primary counts for its replica (`REPLCONF`,
`PSYNC`) are left out. Session-minutes are `--sessions × --secs / 60` (each call lasts
`--secs`). With `--metrics`, the gateway's own figures (sessions ended,
turns, request-log rows) are printed beside.

With `--redis-cpu-secs` (Redis's `used_cpu_user + used_cpu_sys` over the
run, less what it uses idle over as long), Redis CPU per session-minute, and how many such sessions one core
would hold; a MONITOR feed adds to it, so read it from a run without one.

Usage: store_commands.py --sessions N --secs T [--wall-ms MS]
       [--metrics FILE] [--redis-cpu-secs S] COMMANDSTATS [MONITOR_LOG ...]
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections import Counter

PREFIX = "patchbay:"
HARNESS = {"config|resetstat", "monitor", "info"}
# A cluster primary also counts its replicas' replication commands.
REPLICATION = {"replconf", "psync", "sync"}
FAMILIES = {
    "rpm": "admission",
    "tpm": "admission",
    "budget": "admission",
    "flushed": "metering",
    "request_logs": "metering",
    "sessions": "leases",
    "call": "calls",
    "call_holder": "calls",
    "calls": "calls",
    "live_charged": "calls",
}
# Commands whose first argument is not a key.
NO_KEY = {"ping", "hello", "client", "script", "select", "auth", "echo", "time", "info",
          "config", "monitor", "command", "readonly", "cluster", "role", "sentinel"}
LINE = re.compile(r"^\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$")


def parse_commandstats(text: str) -> Counter:
    calls = Counter()
    for line in text.splitlines():
        m = re.match(r"^cmdstat_([^:]+):calls=(\d+)", line.strip())
        if m and m.group(1) not in HARNESS | REPLICATION:
            calls[m.group(1)] += int(m.group(2))
    return calls


def family(key: str) -> str:
    rest = key[len(PREFIX):] if key.startswith(PREFIX) else key
    return rest.split(":", 1)[0]


def feature_of(cmd: str, args: list[str]) -> str:
    if cmd in ("evalsha", "eval", "evalsha_ro", "eval_ro"):
        keys = args[2:] if len(args) >= 2 and args[1] != "0" else []
    elif cmd in NO_KEY:
        return "connection"
    else:
        keys = args
    if not keys:
        return "connection"
    fam = family(keys[0])
    return FAMILIES.get(fam, f"other ({fam})")


def parse_monitor(text: str) -> tuple[Counter, Counter, Counter]:
    """Round trips per feature, script commands per feature, and per
    (client|lua, command)."""
    trips, scripted, by_cmd = Counter(), Counter(), Counter()
    script_feature = "connection"
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        source, rest = m.groups()
        try:
            words = shlex.split(rest)
        except ValueError:
            continue
        if not words:
            continue
        cmd, args = words[0].lower(), words[1:]
        if (cmd in ("monitor", "info") or cmd in REPLICATION
                or (cmd == "config" and args[:1] == ["RESETSTAT"])):
            continue
        if source == "lua":
            scripted[script_feature] += 1
            by_cmd[("lua", cmd)] += 1
            continue
        feature = feature_of(cmd, args)
        if cmd.startswith("eval"):
            script_feature = feature
        trips[feature] += 1
        by_cmd[("client", cmd)] += 1
    return trips, scripted, by_cmd


def gateway_figures(text: str) -> dict[str, float]:
    wanted = {
        "sessions": r"^patchbay_realtime_sessions_total\{[^}]*\} (\S+)",
        "turns": r"^patchbay_turns_total\{[^}]*\} (\S+)",
        "store refusals": r"^patchbay_store_refusals_total\{[^}]*\} (\S+)",
        "outbox dropped": r"^patchbay_outbox_dropped_total(?:\{[^}]*\})? (\S+)",
    }
    out = {}
    for name, pattern in wanted.items():
        total = sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))
        out[name] = total
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, required=True)
    ap.add_argument("--secs", type=float, required=True)
    ap.add_argument("--wall-ms", type=int)
    ap.add_argument("--metrics")
    ap.add_argument("--redis-cpu-secs", type=float,
                    help="Redis's user + system CPU over the run (INFO cpu), less its idle CPU")
    ap.add_argument("commandstats")
    ap.add_argument("monitor", nargs="*", help="MONITOR logs, one per data node")
    a = ap.parse_args()

    minutes = a.sessions * a.secs / 60
    stats = parse_commandstats(open(a.commandstats).read())
    trips, scripted, by_cmd = Counter(), Counter(), Counter()
    for path in a.monitor:
        t, s, c = parse_monitor(open(path, errors="replace").read())
        trips, scripted, by_cmd = trips + t, scripted + s, by_cmd + c
    monitored = bool(by_cmd)
    total = sum(stats.values())

    print(f"store commands per session-minute: {a.sessions} sessions × {a.secs:g} s "
          f"= {minutes:g} session-minutes")
    if a.wall_ms:
        print(f"run wall time {a.wall_ms / 1000:.1f} s; Redis rate {total / (a.wall_ms / 1000):.1f} commands/s")
    if a.redis_cpu_secs is not None:
        per = a.redis_cpu_secs / minutes * 1e3
        print(f"Redis CPU {a.redis_cpu_secs:.2f} s: {per:.2f} ms per session-minute "
              f"(one core holds {60e3 / per:.0f} such sessions, all Redis's work at 100 %)"
              if per > 0 else f"Redis CPU {a.redis_cpu_secs:.2f} s")
    if a.metrics:
        g = gateway_figures(open(a.metrics).read())
        print("gateway: " + ", ".join(f"{k} {v:g}" for k, v in g.items()))
    print()
    print("per command (INFO commandstats; a script's own commands included):")
    print(f"  {'command':<22} {'calls':>8} {'per session-minute':>20}")
    for cmd, n in sorted(stats.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {cmd:<22} {n:>8} {n / minutes:>20.2f}")
    print(f"  {'total':<22} {total:>8} {total / minutes:>20.2f}")
    if not monitored:
        print("\n(no MONITOR log: per feature and per source left out)")
        return 0
    print()
    print("per feature (MONITOR): round trips the gateway sent, and the commands its scripts ran:")
    print(f"  {'feature':<18} {'round trips':>12} {'/ session-min':>14} {'in scripts':>11} "
          f"{'/ session-min':>14} {'all / session-min':>18}")
    features = sorted(set(trips) | set(scripted), key=lambda f: -(trips[f] + scripted[f]))
    for f in features:
        t, s = trips[f], scripted[f]
        print(f"  {f:<18} {t:>12} {t / minutes:>14.2f} {s:>11} {s / minutes:>14.2f} "
              f"{(t + s) / minutes:>18.2f}")
    t_all, s_all = sum(trips.values()), sum(scripted.values())
    print(f"  {'total':<18} {t_all:>12} {t_all / minutes:>14.2f} {s_all:>11} "
          f"{s_all / minutes:>14.2f} {(t_all + s_all) / minutes:>18.2f}")
    print()
    print("per command and source (MONITOR):")
    for (source, cmd), n in sorted(by_cmd.items(), key=lambda kv: -kv[1]):
        print(f"  {source:<6} {cmd:<16} {n:>8} {n / minutes:>10.2f}")
    if t_all + s_all != total:
        print(f"\nnote: MONITOR saw {t_all + s_all} commands, INFO commandstats {total} "
              "(MONITOR misses what ran before it attached or after it stopped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
