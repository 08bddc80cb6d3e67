#!/usr/bin/env bash
# Where each process's CPU goes, kernel included, on the CPU stage's
# workload: tcp-relay, metered-relay and a gateway (pool off) side by side
# in one interleaved run, each watched by Linux `perf` (software events and
# tracepoints, which work on this VM where the hardware counters do not).
#   1. perf stat: task-clock, context switches, migrations, page faults and
#      the syscalls that matter, per session.
#   2. perf record -e cpu-clock: samples per session, split into kernel,
#      runtime (tokio, mio), allocator, libc, the process's own code and the
#      rest (profile_split.py), and each process's top user-space symbols.
# Unlike callgrind.sh this sees the kernel and what instructions cost; it
# samples at PROFILE_HZ, so a class needs tens of samples to mean anything.
# Outputs: OUT_DIR/profile.txt (default target/bench/profile), perf data files.
# Knobs (env): PROFILE_N (1000 sessions per target) PROFILE_C (60)
# PROFILE_HZ (1999) BASE_PORT OUT_DIR SKIP_BUILD=1. Needs perf (linux-perf).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib.sh
. benchmarks/lib.sh

N=${PROFILE_N:-1000}
C=${PROFILE_C:-60}
HZ=${PROFILE_HZ:-1999}
BASE_PORT=${BASE_PORT:-18700}
OUT_DIR=${OUT_DIR:-target/bench/profile}

command -v perf >/dev/null || { echo "perf not found (apt-get install linux-perf)" >&2; exit 1; }
bench_setup
REPORT=$OUT_DIR/profile.txt

sim=$((BASE_PORT + 1))
"$BIN/patchbay-gateway" sim --listen "127.0.0.1:$sim" --keys "$UPSTREAM_KEY" \
  --upgrade-delay-ms 250 --session-delay-ms 7 --inference-delay-ms 200 \
  --audio-deltas 20 --audio-delta-bytes 16384 --delta-interval-ms 10 \
  >"$OUT_DIR/sim.log" 2>&1 &
pids+=("$!")
wait_port "$sim"
"$BIN/tcp-relay" "127.0.0.1:$((BASE_PORT + 2))" "127.0.0.1:$sim" >"$OUT_DIR/tcp-relay.log" 2>&1 &
pids+=("$!")
PID_tcp_relay=$!
WS_RELAY_CLIENT_KEY="$CLIENT_KEY" WS_RELAY_UPSTREAM_KEY="$UPSTREAM_KEY" WS_RELAY_METER=1 \
  "$BIN/ws-relay" "127.0.0.1:$((BASE_PORT + 3))" "127.0.0.1:$sim" >"$OUT_DIR/metered-relay.log" 2>&1 &
pids+=("$!")
PID_metered_relay=$!
gateway_toml "$tmp/gw.toml" $((BASE_PORT + 4)) $((BASE_PORT + 5)) "$sim"
PATCHBAY_MASTER_KEY="$CLIENT_KEY" BENCH_UPSTREAM_KEY="$UPSTREAM_KEY" REALTIME_POOL_SIZE=0 \
  "$BIN/patchbay-gateway" serve --config "$tmp/gw.toml" >"$OUT_DIR/gateway.log" 2>&1 &
pids+=("$!")
PID_gateway=$!
for p in 2 3 4; do wait_port $((BASE_PORT + p)); done
names=(tcp-relay metered-relay gateway)
targets=(--target "tcp-relay=ws://127.0.0.1:$((BASE_PORT + 2))/v1/realtime@$UPSTREAM_KEY"
  --target "metered-relay=ws://127.0.0.1:$((BASE_PORT + 3))/v1/realtime"
  --target "gateway=ws://127.0.0.1:$((BASE_PORT + 4))/v1/realtime")
cpus=(--cpu-pid "tcp-relay=$PID_tcp_relay" --cpu-pid "metered-relay=$PID_metered_relay"
  --cpu-pid "gateway=$PID_gateway")

run_bench() {
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout 900 "$BIN/patchbay-bench" "${targets[@]}" "$@"
}

# observe KIND: one perf per process for a measured run of N sessions per target.
observe() {
  local kind=$1 name pid perf_pids=()
  for name in "${names[@]}"; do
    pid="PID_${name//-/_}"
    if [ "$kind" = stat ]; then
      perf stat -x, -o "$OUT_DIR/stat-$name.csv" -p "${!pid}" -e "task-clock,context-switches,\
cpu-migrations,page-faults,raw_syscalls:sys_enter,syscalls:sys_enter_recvfrom,\
syscalls:sys_enter_read,syscalls:sys_enter_sendto,syscalls:sys_enter_write,\
syscalls:sys_enter_writev,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex" &
    else
      perf record -q -e cpu-clock -F "$HZ" -p "${!pid}" -o "$OUT_DIR/record-$name.data" &
    fi
    perf_pids+=("$!")
  done
  sleep 0.5
  run_bench "${cpus[@]}" -n $((3 * N)) -c "$C" >"$OUT_DIR/bench-$kind.txt"
  kill -INT "${perf_pids[@]}"
  wait "${perf_pids[@]}" 2>/dev/null || true
}

{
  echo "== $(date -u +%FT%TZ)  $(nproc) cores  $(uname -r)  perf: $N sessions per target, c=$C, 20 deltas of 16 kB"
  echo
} | tee "$REPORT"
# Warm-up: first connections, lazy statics, the runtimes' threads.
run_bench -n 150 -c 30 >/dev/null
observe stat
observe record
{
  echo "perf stat, per session (first run):"
  grep -A5 '^process CPU' "$OUT_DIR/bench-stat.txt" | tail -4
  echo
  python3 benchmarks/profile_split.py stat "$N" "$OUT_DIR" "${names[@]}"
  echo
  echo "perf record (cpu-clock at $HZ Hz), samples per session (second run):"
  grep -A5 '^process CPU' "$OUT_DIR/bench-record.txt" | tail -4
  echo
  python3 benchmarks/profile_split.py record "$N" "$OUT_DIR" "${names[@]}"
} | tee -a "$REPORT"
