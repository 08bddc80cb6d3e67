#!/usr/bin/env bash
# Direct vs gateway (pool off, pool on), interleaved in one run, on 127.0.0.1.
#
# 1. Builds the release binaries.
# 2. Main run: one simulator with OpenAI-like setup times (upgrade 250 ms,
#    session.created 7 ms) and two gateways in front of it (pool off, pool
#    on), then patchbay-bench with targets direct / pool-off / pool-on at
#    N sessions, C concurrent.
# 3. Floor run: the same load with a fourth target, tcp-relay (a
#    byte-copying TCP relay in front of the simulator: the least any one-hop
#    proxy adds), and the p50s also against it.
# 4. Small-frames run: the four targets in front of a simulator that
#    answers each response.create with SMALL_DELTAS ~600-byte audio deltas,
#    at a lower concurrency, to compare turn time through the gateway with
#    direct and with the relay.
# Everything started here is stopped on exit. Outputs land in OUT_DIR.
#
# Knobs (env): N C SMALL_N SMALL_C SMALL_DELTAS SMALL_DELTA_BYTES POOL_SIZE
# BASE_PORT OUT_DIR BENCH_THREADS SKIP_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-5000}
C=${C:-500}
SMALL_N=${SMALL_N:-2000}
SMALL_C=${SMALL_C:-20}
SMALL_DELTAS=${SMALL_DELTAS:-50}
# 320 bytes of PCM16 (6.7 ms at 24 kHz) → 428 base64 characters → ~600-byte
# JSON text frames (400 bytes would make ~700).
SMALL_DELTA_BYTES=${SMALL_DELTA_BYTES:-320}
POOL_SIZE=${POOL_SIZE:-500}
BASE_PORT=${BASE_PORT:-18000}
OUT_DIR=${OUT_DIR:-target/bench}
BENCH_THREADS=${BENCH_THREADS:-1}
# Bound on each bench invocation (it also bounds each session itself).
BENCH_TIMEOUT_SECS=${BENCH_TIMEOUT_SECS:-600}

SIM_PORT=$((BASE_PORT + 100))
GW_OFF_PORT=$((BASE_PORT + 81))
GW_ON_PORT=$((BASE_PORT + 82))
RELAY_PORT=$((BASE_PORT + 83))
ADMIN_OFF_PORT=$((BASE_PORT + 91))
ADMIN_ON_PORT=$((BASE_PORT + 92))

# Not secrets: the simulator accepts this key, the gateways this client key.
UPSTREAM_KEY=sk-sim-bench
CLIENT_KEY=pb-bench-key

# Sockets: C client legs, as many gateway legs, the pool, the simulator's.
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt $((4 * C + 2 * POOL_SIZE + 1024)) ]; then
  echo "warning: ulimit -n is $(ulimit -n); C=$C may run out of descriptors" >&2
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release -q -p patchbay-gateway -p patchbay-bench
fi
BIN=$PWD/target/release
mkdir -p "$OUT_DIR"

tmp=$(mktemp -d)
pids=()
stop_all() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    # Gateways drain on SIGTERM; give them a bounded moment, then insist.
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
}
cleanup() {
  stop_all
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: runs CMD in the background, logging to
# OUT_DIR/STACK-NAME.log.
STACK=setup
start() {
  local name=$1
  shift
  "$@" >"$OUT_DIR/$STACK-$name.log" 2>&1 &
  pids+=("$!")
  eval "PID_${name//-/_}=$!"
}

# wait_for URL_OR_PORT: until an HTTP 200 (or an open TCP port), 30 s at most.
wait_http() {
  for _ in $(seq 300); do
    curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "gave up waiting for $1" >&2
  return 1
}
wait_port() {
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "gave up waiting for port $1" >&2
  return 1
}

# gateway NAME PORT ADMIN_PORT POOL UPSTREAM_URL
gateway() {
  local name=$1 port=$2 admin=$3 pool=$4 upstream=$5
  cat >"$tmp/$name.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"

[pool]
max_size = $((POOL_SIZE > 512 ? POOL_SIZE : 512))

[limits]
max_sessions = $((2 * C > 1000 ? 2 * C : 1000))

[[routes]]
model = "gpt-realtime"
upstream_url = "$upstream"
api_key_env = "BENCH_UPSTREAM_KEY"
EOF
  start "$name" env PATCHBAY_MASTER_KEY="$CLIENT_KEY" BENCH_UPSTREAM_KEY="$UPSTREAM_KEY" \
    REALTIME_POOL_SIZE="$pool" "$BIN/patchbay-gateway" serve --config "$tmp/$name.toml"
}

# cpu_ticks PID: user+system clock ticks used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# bench NAME RELAY ARGS...: runs patchbay-bench with the targets direct,
# pool-off and pool-on (RELAY=1: also tcp-relay, second, and a second ratio
# table against it) and reports the CPU each process used meanwhile.
bench() {
  local name=$1 relay=$2
  shift 2
  local with_relay=()
  if [ "$relay" = 1 ]; then
    with_relay=(--target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY"
      --against tcp-relay)
  fi
  local procs=(sim relay gw_off gw_on) before=() p i ticks
  ticks=$(getconf CLK_TCK)
  for p in "${procs[@]}"; do
    i="PID_$p"
    before+=("$(cpu_ticks "${!i}")")
  done
  local start_ns
  start_ns=$(date +%s%N)
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
    --target "direct=ws://127.0.0.1:$SIM_PORT/v1/realtime@$UPSTREAM_KEY" \
    "${with_relay[@]}" \
    --target "pool-off=ws://127.0.0.1:$GW_OFF_PORT/v1/realtime" \
    --target "pool-on=ws://127.0.0.1:$GW_ON_PORT/v1/realtime" \
    --metrics "pool-off=http://127.0.0.1:$ADMIN_OFF_PORT/metrics" \
    --metrics "pool-on=http://127.0.0.1:$ADMIN_ON_PORT/metrics" \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/$name.json" "$@" | tee "$OUT_DIR/$name.txt"
  local wall_ms=$((($(date +%s%N) - start_ns) / 1000000))
  {
    echo
    echo "CPU of the other processes during this bench (% of one core over ${wall_ms} ms):"
    for i in "${!procs[@]}"; do
      p="PID_${procs[$i]}"
      local used=$(($(cpu_ticks "${!p}") - ${before[$i]}))
      awk -v n="${procs[$i]}" -v t="$used" -v hz="$ticks" -v ms="$wall_ms" \
        'BEGIN { printf "  %-8s %6.1f s  %4.0f %%\n", n, t / hz, 100 * t / hz / (ms / 1000) }'
    done
  } | tee -a "$OUT_DIR/$name.txt"
}

# start_stack NAME SIM_ARGS...: the simulator and both gateways, ready.
start_stack() {
  local name=$1
  shift
  STACK=${name// /-}
  start sim "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$SIM_PORT" --keys "$UPSTREAM_KEY" "$@"
  wait_port "$SIM_PORT"
  local up="ws://127.0.0.1:$SIM_PORT/v1/realtime"
  start relay "$BIN/tcp-relay" "127.0.0.1:$RELAY_PORT" "127.0.0.1:$SIM_PORT"
  wait_port "$RELAY_PORT"
  gateway gw-off "$GW_OFF_PORT" "$ADMIN_OFF_PORT" 0 "$up"
  gateway gw-on "$GW_ON_PORT" "$ADMIN_ON_PORT" "$POOL_SIZE" "$up"
  # /readyz of the pool-on gateway waits for the pool's first fill.
  wait_http "http://127.0.0.1:$ADMIN_OFF_PORT/readyz"
  wait_http "http://127.0.0.1:$ADMIN_ON_PORT/readyz"
  echo "== $name: simulator $* ; gateways ready"
}

echo "== $(date -u +%FT%TZ)  $(nproc) cores  $(uname -r)"

start_stack "main run" --upgrade-delay-ms 250 --session-delay-ms 7
bench main 0 -n "$N" -c "$C"
echo
# The same load with a fourth target: a byte-copying TCP relay in front of
# the simulator, the floor of what any one-hop proxy adds. Let the pool
# refill from the main run first (a few upstream round trips).
sleep 2
bench floor 1 -n "$N" -c "$C"
stop_all

echo
start_stack "small frames" --upgrade-delay-ms 250 --session-delay-ms 7 \
  --audio-deltas "$SMALL_DELTAS" --audio-delta-bytes "$SMALL_DELTA_BYTES"
bench small-frames 1 -n "$SMALL_N" -c "$SMALL_C"

echo
echo "reports and samples: $OUT_DIR/{main,floor,small-frames}.{txt,json}; process logs: $OUT_DIR/{main-run,small-frames}-*.log"
