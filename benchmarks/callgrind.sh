#!/usr/bin/env bash
# Instructions per session and per delta, counted by valgrind's callgrind:
# tcp-relay, ws-relay, metered-relay and a gateway (pool off) each under callgrind, in
# front of two simulators (1 audio delta per response, and CG_DELTAS).
# Counters are zeroed after a warm-up and dumped after CG_N sessions per
# target, so start-up is not counted. Instruction counts do not depend on
# what else the machine is doing, unlike CPU time (the CPU stage's ratios
# move by ±5 % between runs here): a change to the per-session path shows
# up as a difference of a few thousand instructions. What they leave out is
# the kernel and the price of each instruction (cache and TLB misses,
# wake-ups), so they complement the CPU stage, never replace it.
# Outputs: OUT_DIR/callgrind.txt (default target/bench/callgrind), and the
# callgrind files for callgrind_annotate.
# Knobs (env): CG_N (200) CG_C (10) CG_DELTAS (21) BASE_PORT OUT_DIR
# SKIP_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib.sh
. benchmarks/lib.sh

N=${CG_N:-200}
C=${CG_C:-10}
HI=${CG_DELTAS:-21}
BASE_PORT=${BASE_PORT:-18600}
OUT_DIR=${OUT_DIR:-target/bench/callgrind}

for tool in valgrind callgrind_control; do
  command -v "$tool" >/dev/null || { echo "$tool not found (apt-get install valgrind)" >&2; exit 1; }
done
bench_setup
rm -f "$OUT_DIR"/*.cg*

cg() {
  local name=$1
  shift
  valgrind --tool=callgrind --callgrind-out-file="$OUT_DIR/$name.cg" "$@" \
    >"$OUT_DIR/$name.log" 2>"$OUT_DIR/$name.valgrind.log" &
  pids+=("$!")
  cg_pids+=("$!")
}

echo "== $(date -u +%FT%TZ)  $(nproc) cores  $(uname -r)  callgrind: 1 and $HI deltas, $N sessions per target, c=$C" |
  tee "$OUT_DIR/callgrind.txt"
for deltas in 1 "$HI"; do
  cg_pids=()
  sim=$((BASE_PORT + 1))
  "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$sim" --keys "$UPSTREAM_KEY" \
    --upgrade-delay-ms 250 --session-delay-ms 7 --inference-delay-ms 200 \
    --audio-deltas "$deltas" --audio-delta-bytes 16384 --delta-interval-ms 10 \
    >"$OUT_DIR/sim-$deltas.log" 2>&1 &
  pids+=("$!")
  wait_port "$sim"
  cg "tcp-relay-$deltas" "$BIN/tcp-relay" "127.0.0.1:$((BASE_PORT + 2))" "127.0.0.1:$sim"
  WS_RELAY_CLIENT_KEY="$CLIENT_KEY" WS_RELAY_UPSTREAM_KEY="$UPSTREAM_KEY" \
    cg "ws-relay-$deltas" "$BIN/ws-relay" "127.0.0.1:$((BASE_PORT + 3))" "127.0.0.1:$sim"
  WS_RELAY_CLIENT_KEY="$CLIENT_KEY" WS_RELAY_UPSTREAM_KEY="$UPSTREAM_KEY" WS_RELAY_METER=1 \
    cg "metered-relay-$deltas" "$BIN/ws-relay" "127.0.0.1:$((BASE_PORT + 6))" "127.0.0.1:$sim"
  gateway_toml "$tmp/gw.toml" $((BASE_PORT + 4)) $((BASE_PORT + 5)) "$sim"
  PATCHBAY_MASTER_KEY="$CLIENT_KEY" BENCH_UPSTREAM_KEY="$UPSTREAM_KEY" REALTIME_POOL_SIZE=0 \
    cg "gw-off-$deltas" "$BIN/patchbay-gateway" serve --config "$tmp/gw.toml"
  for p in 2 3 4 6; do wait_port $((BASE_PORT + p)); done
  targets=(--target "tcp-relay=ws://127.0.0.1:$((BASE_PORT + 2))/v1/realtime@$UPSTREAM_KEY"
    --target "ws-relay=ws://127.0.0.1:$((BASE_PORT + 3))/v1/realtime"
    --target "metered-relay=ws://127.0.0.1:$((BASE_PORT + 6))/v1/realtime"
    --target "gw-off=ws://127.0.0.1:$((BASE_PORT + 4))/v1/realtime")
  # Warm-up (first connections, lazy statics, the runtime's threads), then
  # count only the measured sessions.
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout 600 "$BIN/patchbay-bench" "${targets[@]}" \
    -n 60 -c "$C" >"$OUT_DIR/warm-$deltas.txt" 2>&1
  for p in "${cg_pids[@]}"; do callgrind_control -z "$p" >/dev/null; done
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout 900 "$BIN/patchbay-bench" "${targets[@]}" \
    -n $((4 * N)) -c "$C" --out "$OUT_DIR/run-$deltas.json" >"$OUT_DIR/run-$deltas.txt" 2>&1
  for p in "${cg_pids[@]}"; do callgrind_control -d "$p" >/dev/null; done
  stop_pids
done

python3 benchmarks/callgrind_report.py "$OUT_DIR" "$N" "$HI" | tee -a "$OUT_DIR/callgrind.txt"
