#!/usr/bin/env bash
# Per session or per frame? One interleaved run that splits the CPU of
# tcp-relay, ws-relay and a gateway (pool off) into a per-session part and a
# per-frame part: two simulators, one answering every response with 1 audio
# delta and one with SPLIT_DELTAS (40), each with its own tcp-relay,
# ws-relay and gateway in front; SPLIT_N_PER_TARGET (1000) sessions per
# target at c=SPLIT_C (100). The 1-delta targets' CPU-s per 1000 sessions
# is (almost all) per-session cost; the difference between a process's two
# figures, divided by SPLIT_DELTAS − 1, is its cost per 16 kB delta.
# Outputs: OUT_DIR/split.{txt,json} (default target/bench/split).
# Knobs (env): SPLIT_N_PER_TARGET SPLIT_C SPLIT_DELTAS BASE_PORT OUT_DIR
# SKIP_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib.sh
. benchmarks/lib.sh

N=${SPLIT_N_PER_TARGET:-1000}
C=${SPLIT_C:-100}
HI=${SPLIT_DELTAS:-40}
BASE_PORT=${BASE_PORT:-18000}
OUT_DIR=${OUT_DIR:-target/bench/split}
bench_setup

targets=()
i=0
for deltas in 1 "$HI"; do
  sim=$((BASE_PORT + 100 + i))
  relay=$((BASE_PORT + 120 + i))
  ws=$((BASE_PORT + 130 + i))
  gw=$((BASE_PORT + 140 + i))
  admin=$((BASE_PORT + 150 + i))
  "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$sim" --keys "$UPSTREAM_KEY" \
    --upgrade-delay-ms 250 --session-delay-ms 7 --inference-delay-ms 200 \
    --audio-deltas "$deltas" --audio-delta-bytes 16384 --delta-interval-ms 10 \
    >"$OUT_DIR/sim-$deltas.log" 2>&1 &
  pids+=("$!")
  wait_port "$sim"
  "$BIN/tcp-relay" "127.0.0.1:$relay" "127.0.0.1:$sim" >"$OUT_DIR/tcp-relay-$deltas.log" 2>&1 &
  pids+=("$!")
  targets+=(--target "tcp-relay-$deltas=ws://127.0.0.1:$relay/v1/realtime@$UPSTREAM_KEY"
    --cpu-pid "tcp-relay-$deltas=$!")
  WS_RELAY_CLIENT_KEY="$CLIENT_KEY" WS_RELAY_UPSTREAM_KEY="$UPSTREAM_KEY" \
    "$BIN/ws-relay" "127.0.0.1:$ws" "127.0.0.1:$sim" >"$OUT_DIR/ws-relay-$deltas.log" 2>&1 &
  pids+=("$!")
  targets+=(--target "ws-relay-$deltas=ws://127.0.0.1:$ws/v1/realtime" --cpu-pid "ws-relay-$deltas=$!")
  gateway_toml "$tmp/gw-$deltas.toml" "$gw" "$admin" "$sim"
  env PATCHBAY_MASTER_KEY="$CLIENT_KEY" BENCH_UPSTREAM_KEY="$UPSTREAM_KEY" REALTIME_POOL_SIZE=0 \
    "$BIN/patchbay-gateway" serve --config "$tmp/gw-$deltas.toml" >"$OUT_DIR/gw-off-$deltas.log" 2>&1 &
  pids+=("$!")
  targets+=(--target "gw-off-$deltas=ws://127.0.0.1:$gw/v1/realtime" --cpu-pid "gw-off-$deltas=$!")
  wait_port "$relay"
  wait_port "$ws"
  wait_port "$gw"
  i=$((i + 1))
done

echo "== $(date -u +%FT%TZ)  $(nproc) cores  $(uname -r)  split: 1 and $HI deltas, $N sessions per target, c=$C"
PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout 900 "$BIN/patchbay-bench" "${targets[@]}" \
  -n $((6 * N)) -c "$C" --out "$OUT_DIR/split.json" | tee "$OUT_DIR/split.txt"
python3 - "$OUT_DIR/split.json" "$HI" <<'PY' | tee -a "$OUT_DIR/split.txt"
import json, sys
doc = json.load(open(sys.argv[1]))
hi = int(sys.argv[2])
cpu = {c["target"]: c.get("cpu_secs_per_1000_sessions") for c in doc.get("cpu", [])}
print(f"\nper session (1 delta) and per 16 kB delta ((CPU at {hi} − at 1) / {hi - 1}):")
print(f"{'process':10s} {'ms/session':>11s} {'µs/delta':>9s} {'session × tcp-relay':>20s} {'delta × tcp-relay':>18s}")
base = None
for name in ("tcp-relay", "ws-relay", "gw-off"):
    lo, high = cpu.get(f"{name}-1"), cpu.get(f"{name}-{hi}")
    if lo is None or high is None:
        print(f"{name:10s} n/a")
        continue
    per_frame = (high - lo) / (hi - 1) * 1000
    base = base or (lo, per_frame)

    def ratio(v, b):
        # Too short a run reads 0 CPU: no ratio.
        return f"{v / b:.3f}" if b > 0 else "n/a"

    print(f"{name:10s} {lo:11.3f} {per_frame:9.1f} {ratio(lo, base[0]):>20s} {ratio(per_frame, base[1]):>18s}")
PY
