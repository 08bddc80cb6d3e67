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
# 5. CPU run (issue 15's workload): the four targets in front of a
#    simulator whose every response is CPU_DELTAS audio deltas of
#    CPU_DELTA_BYTES, CPU_DELTA_INTERVAL_MS apart, after CPU_INFERENCE_MS
#    of model time; CPU_N_PER_TARGET sessions per target at CPU_C, pools
#    of CPU_POOL_SIZE, plus a fifth target: ws-relay (a relay that does the
#    two WebSocket handshakes itself, with its own upstream key, and then
#    copies bytes: the least a key-swapping WebSocket gateway can do), and
#    a sixth: metered-relay (ws-relay forwarding whole upstream frames and
#    writing a request-log row from each response.done: the least a
#    metering gateway can do). Its report's CPU table is the cost
#    comparison, against the three floors.
# 5b. CPU run as issue 15 measured it (stage "cpu-issue"): the same
#    workload with exactly the four targets of the issue's own run (direct,
#    tcp-relay, pool-off, pool-on), so each process has as many sessions in
#    flight (c/4) as it had there; the six-target stage gives each c/6,
#    and fewer frames per wake-up cost a gateway more over tcp-relay.
# 5c. Runtime-shape run (stage "cpu-runtime", not in the default STAGES):
#    the same workload with four targets, tcp-relay and the pool-off
#    gateway each on its runtime's default worker threads (one per core) and
#    on one worker thread (TOKIO_WORKER_THREADS=1, [server] worker_threads =
#    1), so the runtime's shape is compared at equal shape on both sides
#    (the CPU table against tcp-relay and against tcp-relay-1w).
# 5d. A/B run (stage "cpu-ab", only when named): the same workload with
#    six targets: direct, tcp-relay, and two gateway binaries (GATEWAY_BIN
#    and AB_BIN, e.g. the plain and the profile-guided build of
#    benchmarks/pgo.sh), each with its pool off and on.
# 5e. Telemetry run (stage "cpu-otel", only when named): the CPU workload
#    with six targets: direct, tcp-relay, and the gateway (GATEWAY_BIN) with
#    its pool off and on, each once with OpenTelemetry off and once
#    exporting to a stand-in collector (benchmarks/otlp_sink.py) at 100 %
#    sampling (OTEL_TRACES_SAMPLER=always_on): the CPU table against
#    pool-off and pool-on is what tracing costs per session.
# 6. Many-sessions run (stage "many", not in the default STAGES): MANY_N
#    sessions at once through one gateway (pool MANY_POOL_SIZE), held open
#    by MANY_MODEL_MS of model time before each one's first audio, one turn
#    each. Its report gives success %, and in the CPU table the gateway's
#    RSS before, at peak and per live session, and CPU-s per 1000 sessions
#    (= per 1000 turns). The gateway holds two sockets per session and its
#    pool's, so MANY_N is capped at what the hard `nofile` limit allows
#    (said so when it is).
# 7. Calls run (stage "calls", only when named): voice calls instead of
#    one-turn sessions. CALLS_N calls at once per target, each for
#    CALLS_SECS, against direct, tcp-relay, the pool-on gateway (and, with
#    AB_BIN, the same from a second binary), interleaved in one run. A
#    call's turn: CALLS_SPEECH_MS of 20 ms appends at real time, commit +
#    response.create, the simulator's answer (CALLS_MODEL_MS of audio in
#    deltas of CALLS_DELTA_MS, at real time, after CALLS_INFERENCE_MS), then
#    CALLS_SILENCE_MS of silence. The simulator stamps frames
#    (--stamp-frames) so each frame's transit is timed both ways. Its report:
#    added per-frame latency against direct and tcp-relay, CPU-s per
#    call-minute (and × tcp-relay), RSS per call. Then the capacity steps:
#    the same run for CALLS_STEP_SECS at each N of CALLS_STEPS (per target),
#    and per target the largest N at which every call completed and its
#    added p99 (both directions, against direct) stayed under
#    CALLS_LIMIT_MS (calls_capacity.py); the steps stop at the first N
#    where no relay target passes.
# 7b. Calls-latency run (stage "calls-latency", only when named): frame
#    latency at LATENCY_N calls on the machine. The calls stage runs every
#    target at once, so its step at N puts N × targets calls on the
#    machine, and at 1000 its load generator's own delays (direct's p99
#    hundreds of ms) swamp what a relay adds. Here the targets take turns
#    (--rotate LATENCY_ROUNDS): each round gives each target LATENCY_N
#    calls alone for LATENCY_SECS, the order shifted each round, and each
#    target's frames are pooled over its rounds; calls_capacity.py then
#    reads the added p99 against direct (calls-latency.txt).
# 8. Idle-calls run (stage "calls-idle", only when named): IDLE_N calls per
#    target against the calls stage's targets and simulator, each one turn
#    of one 20 ms append and the model's answer, then silence to
#    IDLE_SECS; each relay process's VmRSS is read before the calls and
#    again IDLE_READ_SECS after they start (every call quiet by then for
#    longer than the relay's RELEASE_IDLE_AFTER, 30 s: the ramp, 8 s, plus
#    the answer, ~4.3 s, plus 30 s), and the difference divided by IDLE_N
#    is its memory per idle call (calls-idle.txt).
# 9. Translation run (stage "translation", only when named; issue 34):
#    translation sessions instead of conversations. TRANSLATION_N sessions
#    at once per target, each streaming TRANSLATION_SECS of 24 kHz PCM16 in
#    session.input_audio_buffer.append frames of TRANSLATION_CHUNK_MS at
#    real time while reading the simulator's translated audio (a delta of
#    the same length per append), against direct, tcp-relay and a gateway
#    (pool off) whose one route is a translations route priced per minute
#    (TRANSLATION_USD_PER_MINUTE), so it measures the audio of every append;
#    with AB_BIN, also the same gateway from a second binary. Its report:
#    each append's round trip (and added over direct and tcp-relay), CPU-s
#    per session-minute and × tcp-relay, RSS per session.
# 10. Close run (stage "close", only when named; issue 36): how long a
#    client's close() takes, its close frame written until the server has
#    closed the TCP connection (the bench's `close` phase), against direct,
#    tcp-relay and both gateways, interleaved, CLOSE_N_PER_TARGET sessions
#    per target at CLOSE_C, in front of a simulator whose responses last
#    CLOSE_DELTAS × CLOSE_DELTA_INTERVAL_MS. Two benches: each session
#    closes right after its first audio delta, the response still in flight
#    (close-mid-response: the gateway cancels it upstream meanwhile), then
#    after response.done (close-after-done). Read the `close` rows' p95.
# 11. Store run (stage "store", only when named; issue 39's capacity model):
#    how many Redis commands a session costs. A private redis-server on a
#    free port (its counts are this run's alone), the calls stage's
#    simulator, and one gateway (pool on) whose [store] is that Redis, with
#    STORE_KEYS client keys (each with a budget, rpm, tpm and, unless
#    STORE_MAX_SESSIONS=0, a fleet cap, so leases are taken and renewed),
#    all in one team with a budget, on a route with a budget. CONFIG
#    RESETSTAT, then STORE_N calls (spread over the keys) for STORE_SECS,
#    turns at the calls stage's cadence, flushed every STORE_FLUSH_SECS;
#    meanwhile `redis-cli MONITOR` records every command (a script's own
#    commands included, marked `lua`; STORE_MONITOR=0 leaves it out, as its
#    feed costs Redis CPU). Then INFO commandstats and Redis's CPU over the
#    run (less its idle rate, read over 10 s before), and benchmarks/store_commands.py reports commands per
#    session-minute per command and per feature (admission, metering flush,
#    leases, calls, connection), round trips and the commands scripts run
#    apart, and Redis CPU per session-minute (store.txt). STORE_TOPOLOGY=
#    cluster: the same on a Redis Cluster of its own (three primaries, three
#    replicas, `redis+cluster://`), counted over the primaries.
# Every bench reports the CPU of tcp-relay and both gateways over its
# window (`--cpu-pid`: CPU-seconds per 1000 sessions and the ratio to
# tcp-relay); the simulator's is printed after each report.
# Everything started here is stopped on exit. Outputs land in OUT_DIR.
#
# Knobs (env): STAGES (any of "main floor small-frames cpu-issue cpu", default
# all; "cpu-runtime", "cpu-ab", "cpu-otel", "many", "calls", "calls-latency", "calls-idle",
# "translation", "close" and "store" only when named) AB_BIN (cpu-ab's second gateway binary, and
# calls' and translation's optional one)
# CLOSE_N_PER_TARGET CLOSE_C CLOSE_DELTAS CLOSE_DELTA_INTERVAL_MS
# TRANSLATION_N TRANSLATION_SECS TRANSLATION_CHUNK_MS TRANSLATION_USD_PER_MINUTE
# STORE_N STORE_SECS STORE_KEYS STORE_FLUSH_SECS STORE_MAX_SESSIONS STORE_MONITOR
# STORE_TOPOLOGY
# CALLS_N CALLS_SECS CALLS_SPEECH_MS CALLS_MODEL_MS CALLS_SILENCE_MS
# CALLS_DELTA_MS CALLS_INFERENCE_MS CALLS_POOL_SIZE CALLS_STEPS
# CALLS_STEP_SECS CALLS_LIMIT_MS IDLE_N IDLE_SECS IDLE_READ_SECS
# N C SMALL_N SMALL_C SMALL_DELTAS SMALL_DELTA_BYTES POOL_SIZE CPU_N_PER_TARGET
# CPU_C CPU_POOL_SIZE CPU_DELTAS CPU_DELTA_BYTES CPU_DELTA_INTERVAL_MS
# CPU_INFERENCE_MS MANY_N MANY_MODEL_MS MANY_POOL_SIZE BASE_PORT OUT_DIR
# BENCH_THREADS SKIP_BUILD=1 GATEWAY_BIN (the gateways' binary, default the
# release build's; the simulator runs from BIN, BENCH_BIN or target/release).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib.sh
. benchmarks/lib.sh

N=${N:-5000}
C=${C:-500}
SMALL_N=${SMALL_N:-2000}
SMALL_C=${SMALL_C:-20}
SMALL_DELTAS=${SMALL_DELTAS:-50}
# 320 bytes of PCM16 (6.7 ms at 24 kHz) → 428 base64 characters → ~600-byte
# JSON text frames (400 bytes would make ~700).
SMALL_DELTA_BYTES=${SMALL_DELTA_BYTES:-320}
POOL_SIZE=${POOL_SIZE:-500}
STAGES=${STAGES:-main floor small-frames cpu-issue cpu}
CPU_N_PER_TARGET=${CPU_N_PER_TARGET:-2000}
CPU_C=${CPU_C:-100}
CPU_POOL_SIZE=${CPU_POOL_SIZE:-100}
CPU_DELTAS=${CPU_DELTAS:-20}
CPU_DELTA_BYTES=${CPU_DELTA_BYTES:-16384}
CPU_DELTA_INTERVAL_MS=${CPU_DELTA_INTERVAL_MS:-10}
CPU_INFERENCE_MS=${CPU_INFERENCE_MS:-200}
MANY_N=${MANY_N:-10000}
MANY_MODEL_MS=${MANY_MODEL_MS:-30000}
MANY_POOL_SIZE=${MANY_POOL_SIZE:-500}
CALLS_N=${CALLS_N:-500}
CALLS_SECS=${CALLS_SECS:-60}
CALLS_SPEECH_MS=${CALLS_SPEECH_MS:-3000}
CALLS_MODEL_MS=${CALLS_MODEL_MS:-4000}
CALLS_SILENCE_MS=${CALLS_SILENCE_MS:-1000}
# 50 ms of 24 kHz PCM16 per model delta: 2400 bytes, a ~3.3 kB frame.
CALLS_DELTA_MS=${CALLS_DELTA_MS:-50}
CALLS_INFERENCE_MS=${CALLS_INFERENCE_MS:-200}
CALLS_POOL_SIZE=${CALLS_POOL_SIZE:-100}
CALLS_STEPS=${CALLS_STEPS:-250 500 1000}
CALLS_STEP_SECS=${CALLS_STEP_SECS:-20}
CALLS_LIMIT_MS=${CALLS_LIMIT_MS:-5}
LATENCY_N=${LATENCY_N:-1000}
LATENCY_SECS=${LATENCY_SECS:-20}
LATENCY_ROUNDS=${LATENCY_ROUNDS:-3}
IDLE_N=${IDLE_N:-1000}
IDLE_SECS=${IDLE_SECS:-60}
IDLE_READ_SECS=${IDLE_READ_SECS:-50}
CLOSE_N_PER_TARGET=${CLOSE_N_PER_TARGET:-100}
CLOSE_C=${CLOSE_C:-20}
CLOSE_DELTAS=${CLOSE_DELTAS:-50}
CLOSE_DELTA_INTERVAL_MS=${CLOSE_DELTA_INTERVAL_MS:-20}
TRANSLATION_N=${TRANSLATION_N:-100}
TRANSLATION_SECS=${TRANSLATION_SECS:-60}
# 100 ms of 24 kHz PCM16 per append: 4,800 bytes, 6,400 base64 characters.
TRANSLATION_CHUNK_MS=${TRANSLATION_CHUNK_MS:-100}
# gpt-realtime-translate's published rate.
TRANSLATION_USD_PER_MINUTE=${TRANSLATION_USD_PER_MINUTE:-0.034}
STORE_N=${STORE_N:-50}
STORE_SECS=${STORE_SECS:-60}
STORE_KEYS=${STORE_KEYS:-5}
STORE_FLUSH_SECS=${STORE_FLUSH_SECS:-15}
# Per key; 0 = no cap, so no leases.
STORE_MAX_SESSIONS=${STORE_MAX_SESSIONS:-10000}
# 0: no MONITOR (its feed costs Redis CPU): commandstats and Redis CPU only.
STORE_MONITOR=${STORE_MONITOR:-1}
# standalone, or cluster: three primaries and three replicas, the
# gateway on their redis+cluster:// URL (the store's Cluster support).
STORE_TOPOLOGY=${STORE_TOPOLOGY:-standalone}
# Descriptors a process needs besides its sessions' sockets.
FD_SPARE=256
BASE_PORT=${BASE_PORT:-18000}
OUT_DIR=${OUT_DIR:-target/bench}
BENCH_THREADS=${BENCH_THREADS:-1}
# Bound on each bench invocation (it also bounds each session itself).
BENCH_TIMEOUT_SECS=${BENCH_TIMEOUT_SECS:-600}

SIM_PORT=$((BASE_PORT + 100))
GW_OFF_PORT=$((BASE_PORT + 81))
GW_ON_PORT=$((BASE_PORT + 82))
RELAY_PORT=$((BASE_PORT + 83))
WS_RELAY_PORT=$((BASE_PORT + 84))
METERED_RELAY_PORT=$((BASE_PORT + 85))
RELAY_1W_PORT=$((BASE_PORT + 86))
GW_OFF_1W_PORT=$((BASE_PORT + 87))
ADMIN_OFF_1W_PORT=$((BASE_PORT + 93))
GW_OFF_B_PORT=$((BASE_PORT + 88))
GW_ON_B_PORT=$((BASE_PORT + 89))
ADMIN_OFF_B_PORT=$((BASE_PORT + 94))
ADMIN_ON_B_PORT=$((BASE_PORT + 95))
OTLP_PORT=$((BASE_PORT + 96))
ADMIN_OFF_PORT=$((BASE_PORT + 91))
ADMIN_ON_PORT=$((BASE_PORT + 92))
GW_STORE_PORT=$((BASE_PORT + 97))
ADMIN_STORE_PORT=$((BASE_PORT + 98))

bench_setup
# The gateways' binary (the simulator always runs from BIN): e.g. the
# profile-guided build of benchmarks/pgo.sh.
GATEWAY_BIN=${GATEWAY_BIN:-$BIN/patchbay-gateway}
# Sockets: C client legs, as many gateway legs, the pool, the simulator's.
if [ "$(ulimit -n)" -lt $((4 * C + 2 * POOL_SIZE + 1024)) ]; then
  echo "warning: ulimit -n is $(ulimit -n); C=$C may run out of descriptors" >&2
fi

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

# wait_http URL: until an HTTP 200, 30 s at most (wait_port: lib.sh).
wait_http() {
  for _ in $(seq 300); do
    curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "gave up waiting for $1" >&2
  return 1
}

# routes_toml UPSTREAM_URL: the gateway's one route, gpt-realtime; with
# TRANSLATION=1, gpt-realtime-translate at the translations endpoint and its
# per-minute price.
routes_toml() {
  if [ "${TRANSLATION:-0}" = 1 ]; then
    cat <<EOF
[[routes]]
model = "gpt-realtime-translate"
endpoint = "translations"
upstream_url = "$1"
api_key_env = "BENCH_UPSTREAM_KEY"

[[prices]]
model = "gpt-realtime-translate"
usd_per_minute = $TRANSLATION_USD_PER_MINUTE
EOF
  else
    cat <<EOF
[[routes]]
model = "gpt-realtime"
upstream_url = "$1"
api_key_env = "BENCH_UPSTREAM_KEY"
EOF
  fi
}

# gateway NAME PORT ADMIN_PORT POOL UPSTREAM_URL [VAR=VALUE...]: the
# extra variables go to the gateway's environment (TRANSLATION=1 before
# the call: routes_toml).
gateway() {
  local name=$1 port=$2 admin=$3 pool=$4 upstream=$5
  shift 5
  cat >"$tmp/$name.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"

[pool]
max_size = $((POOL_SIZE > 512 ? POOL_SIZE : 512))

[limits]
max_sessions = $((2 * C > 1000 ? 2 * C : 1000))

$(routes_toml "$upstream")
EOF
  start "$name" env PATCHBAY_MASTER_KEY="$CLIENT_KEY" BENCH_UPSTREAM_KEY="$UPSTREAM_KEY" \
    REALTIME_POOL_SIZE="$pool" "$@" "$GATEWAY_BIN" serve --config "$tmp/$name.toml"
}

# cpu_ticks PID: user+system clock ticks used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# bench NAME RELAY ARGS...: runs patchbay-bench with the targets direct,
# pool-off and pool-on (RELAY=1: also tcp-relay, second, and a second ratio
# table against it; RELAY=2: also ws-relay, third, and a third table;
# RELAY=3: also metered-relay, fourth, and a fourth table) and reports the
# CPU each process used meanwhile.
bench() {
  local name=$1 relay=$2
  shift 2
  local with_relay=()
  if [ "$relay" != 0 ]; then
    with_relay=(--target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY"
      --against tcp-relay --cpu-pid "tcp-relay=$PID_relay")
  fi
  local procs=(sim relay gw_off gw_on) before=() p i ticks
  if [ "$relay" -ge 2 ]; then
    with_relay+=(--target "ws-relay=ws://127.0.0.1:$WS_RELAY_PORT/v1/realtime"
      --against ws-relay --cpu-pid "ws-relay=$PID_ws_relay")
    procs+=(ws_relay)
  fi
  if [ "$relay" -ge 3 ]; then
    with_relay+=(--target "metered-relay=ws://127.0.0.1:$METERED_RELAY_PORT/v1/realtime"
      --against metered-relay --cpu-pid "metered-relay=$PID_metered_relay")
    procs+=(metered_relay)
  fi
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
    --cpu-pid "pool-off=$PID_gw_off" --cpu-pid "pool-on=$PID_gw_on" \
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

# stage NAME: whether STAGES names it.
stage() { [[ " $STAGES " == *" $1 "* ]]; }

echo "== $(date -u +%FT%TZ)  $(nproc) cores  $(uname -r)  stages: $STAGES"

if stage main || stage floor; then
  start_stack "main run" --upgrade-delay-ms 250 --session-delay-ms 7
  if stage main; then
    bench main 0 -n "$N" -c "$C"
    echo
    # Let the pool refill from the main run first (a few upstream round trips).
    sleep 2
  fi
  # The same load with a fourth target: a byte-copying TCP relay in front of
  # the simulator, the floor of what any one-hop proxy adds.
  if stage floor; then bench floor 1 -n "$N" -c "$C"; fi
  stop_pids
  echo
fi

if stage small-frames; then
  start_stack "small frames" --upgrade-delay-ms 250 --session-delay-ms 7 \
    --audio-deltas "$SMALL_DELTAS" --audio-delta-bytes "$SMALL_DELTA_BYTES"
  bench small-frames 1 -n "$SMALL_N" -c "$SMALL_C"
  stop_pids
  echo
fi

if stage cpu-issue; then
  POOL_SIZE=$CPU_POOL_SIZE C=$CPU_C
  start_stack "cpu issue" --upgrade-delay-ms 250 --session-delay-ms 7 \
    --inference-delay-ms "$CPU_INFERENCE_MS" --audio-deltas "$CPU_DELTAS" \
    --audio-delta-bytes "$CPU_DELTA_BYTES" --delta-interval-ms "$CPU_DELTA_INTERVAL_MS"
  # Four targets, CPU_N_PER_TARGET sessions each.
  bench cpu-issue 1 -n $((4 * CPU_N_PER_TARGET)) -c "$CPU_C"
  stop_pids
  echo
fi

if stage cpu; then
  POOL_SIZE=$CPU_POOL_SIZE C=$CPU_C
  start_stack "cpu" --upgrade-delay-ms 250 --session-delay-ms 7 \
    --inference-delay-ms "$CPU_INFERENCE_MS" --audio-deltas "$CPU_DELTAS" \
    --audio-delta-bytes "$CPU_DELTA_BYTES" --delta-interval-ms "$CPU_DELTA_INTERVAL_MS"
  start ws-relay env WS_RELAY_CLIENT_KEY="$CLIENT_KEY" WS_RELAY_UPSTREAM_KEY="$UPSTREAM_KEY" \
    "$BIN/ws-relay" "127.0.0.1:$WS_RELAY_PORT" "127.0.0.1:$SIM_PORT"
  wait_port "$WS_RELAY_PORT"
  # ws-relay metering every turn into a row on stdout (to its log file, as
  # the gateways' rows go to theirs).
  start metered-relay env WS_RELAY_CLIENT_KEY="$CLIENT_KEY" WS_RELAY_UPSTREAM_KEY="$UPSTREAM_KEY" \
    WS_RELAY_METER=1 "$BIN/ws-relay" "127.0.0.1:$METERED_RELAY_PORT" "127.0.0.1:$SIM_PORT"
  wait_port "$METERED_RELAY_PORT"
  # Six targets, CPU_N_PER_TARGET sessions each.
  bench cpu 3 -n $((6 * CPU_N_PER_TARGET)) -c "$CPU_C"
  stop_pids
  echo
fi

if stage cpu-runtime; then
  POOL_SIZE=$CPU_POOL_SIZE C=$CPU_C
  STACK=cpu-runtime
  start sim "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$SIM_PORT" --keys "$UPSTREAM_KEY" \
    --upgrade-delay-ms 250 --session-delay-ms 7 --inference-delay-ms "$CPU_INFERENCE_MS" \
    --audio-deltas "$CPU_DELTAS" --audio-delta-bytes "$CPU_DELTA_BYTES" \
    --delta-interval-ms "$CPU_DELTA_INTERVAL_MS"
  wait_port "$SIM_PORT"
  start relay "$BIN/tcp-relay" "127.0.0.1:$RELAY_PORT" "127.0.0.1:$SIM_PORT"
  start relay_1w env TOKIO_WORKER_THREADS=1 \
    "$BIN/tcp-relay" "127.0.0.1:$RELAY_1W_PORT" "127.0.0.1:$SIM_PORT"
  up="ws://127.0.0.1:$SIM_PORT/v1/realtime"
  gateway gw-off "$GW_OFF_PORT" "$ADMIN_OFF_PORT" 0 "$up"
  gateway gw-off-1w "$GW_OFF_1W_PORT" "$ADMIN_OFF_1W_PORT" 0 "$up" \
    PATCHBAY_SERVER_WORKER_THREADS=1
  wait_port "$RELAY_PORT"
  wait_port "$RELAY_1W_PORT"
  wait_http "http://127.0.0.1:$ADMIN_OFF_PORT/readyz"
  wait_http "http://127.0.0.1:$ADMIN_OFF_1W_PORT/readyz"
  echo "== cpu runtime: tcp-relay and the pool-off gateway, each on N and on 1 worker thread"
  # Four targets, CPU_N_PER_TARGET sessions each, as in cpu-issue.
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
    --target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "tcp-relay-1w=ws://127.0.0.1:$RELAY_1W_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "pool-off=ws://127.0.0.1:$GW_OFF_PORT/v1/realtime" \
    --target "pool-off-1w=ws://127.0.0.1:$GW_OFF_1W_PORT/v1/realtime" \
    --against tcp-relay-1w \
    --cpu-pid "tcp-relay=$PID_relay" --cpu-pid "tcp-relay-1w=$PID_relay_1w" \
    --cpu-pid "pool-off=$PID_gw_off" --cpu-pid "pool-off-1w=$PID_gw_off_1w" \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/cpu-runtime.json" \
    -n $((4 * CPU_N_PER_TARGET)) -c "$CPU_C" | tee "$OUT_DIR/cpu-runtime.txt"
  stop_pids
  echo
fi

if stage cpu-ab; then
  # Two gateway binaries side by side (GATEWAY_BIN and AB_BIN, e.g. the plain
  # and the profile-guided build), pool off and on, with tcp-relay and
  # direct: the CPU workload, six targets.
  if [ -z "${AB_BIN:-}" ] || [ ! -x "$AB_BIN" ]; then
    echo "stage cpu-ab needs AB_BIN, a second gateway binary (e.g. target/pgo/release/patchbay-gateway)" >&2
    exit 1
  fi
  POOL_SIZE=$CPU_POOL_SIZE C=$CPU_C
  start_stack "cpu ab" --upgrade-delay-ms 250 --session-delay-ms 7 \
    --inference-delay-ms "$CPU_INFERENCE_MS" --audio-deltas "$CPU_DELTAS" \
    --audio-delta-bytes "$CPU_DELTA_BYTES" --delta-interval-ms "$CPU_DELTA_INTERVAL_MS"
  up="ws://127.0.0.1:$SIM_PORT/v1/realtime"
  GATEWAY_BIN=$AB_BIN gateway gw-off-b "$GW_OFF_B_PORT" "$ADMIN_OFF_B_PORT" 0 "$up"
  GATEWAY_BIN=$AB_BIN gateway gw-on-b "$GW_ON_B_PORT" "$ADMIN_ON_B_PORT" "$POOL_SIZE" "$up"
  wait_http "http://127.0.0.1:$ADMIN_OFF_B_PORT/readyz"
  wait_http "http://127.0.0.1:$ADMIN_ON_B_PORT/readyz"
  echo "== cpu ab: A = $GATEWAY_BIN, B = $AB_BIN"
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
    --target "direct=ws://127.0.0.1:$SIM_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "pool-off=ws://127.0.0.1:$GW_OFF_PORT/v1/realtime" \
    --target "pool-off-b=ws://127.0.0.1:$GW_OFF_B_PORT/v1/realtime" \
    --target "pool-on=ws://127.0.0.1:$GW_ON_PORT/v1/realtime" \
    --target "pool-on-b=ws://127.0.0.1:$GW_ON_B_PORT/v1/realtime" \
    --against tcp-relay --against pool-off --against pool-on \
    --cpu-pid "tcp-relay=$PID_relay" \
    --cpu-pid "pool-off=$PID_gw_off" --cpu-pid "pool-off-b=$PID_gw_off_b" \
    --cpu-pid "pool-on=$PID_gw_on" --cpu-pid "pool-on-b=$PID_gw_on_b" \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/cpu-ab.json" \
    -n $((6 * CPU_N_PER_TARGET)) -c "$CPU_C" | tee "$OUT_DIR/cpu-ab.txt"
  stop_pids
  echo
fi

if stage cpu-otel; then
  # The same gateway binary with OpenTelemetry off and on (100 % sampling,
  # to a stand-in collector), pool off and on, with tcp-relay and direct.
  POOL_SIZE=$CPU_POOL_SIZE C=$CPU_C
  start otlp-sink python3 benchmarks/otlp_sink.py "$OTLP_PORT"
  wait_port "$OTLP_PORT"
  start_stack "cpu otel" --upgrade-delay-ms 250 --session-delay-ms 7 \
    --inference-delay-ms "$CPU_INFERENCE_MS" --audio-deltas "$CPU_DELTAS" \
    --audio-delta-bytes "$CPU_DELTA_BYTES" --delta-interval-ms "$CPU_DELTA_INTERVAL_MS"
  up="ws://127.0.0.1:$SIM_PORT/v1/realtime"
  otel=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$OTLP_PORT" OTEL_TRACES_SAMPLER=always_on)
  gateway gw-off-b "$GW_OFF_B_PORT" "$ADMIN_OFF_B_PORT" 0 "$up" "${otel[@]}"
  gateway gw-on-b "$GW_ON_B_PORT" "$ADMIN_ON_B_PORT" "$POOL_SIZE" "$up" "${otel[@]}"
  wait_http "http://127.0.0.1:$ADMIN_OFF_B_PORT/readyz"
  wait_http "http://127.0.0.1:$ADMIN_ON_B_PORT/readyz"
  echo "== cpu otel: pool-off-otel and pool-on-otel export to 127.0.0.1:$OTLP_PORT, every trace sampled"
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
    --target "direct=ws://127.0.0.1:$SIM_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "pool-off=ws://127.0.0.1:$GW_OFF_PORT/v1/realtime" \
    --target "pool-off-otel=ws://127.0.0.1:$GW_OFF_B_PORT/v1/realtime" \
    --target "pool-on=ws://127.0.0.1:$GW_ON_PORT/v1/realtime" \
    --target "pool-on-otel=ws://127.0.0.1:$GW_ON_B_PORT/v1/realtime" \
    --against tcp-relay --against pool-off --against pool-on \
    --cpu-pid "tcp-relay=$PID_relay" \
    --cpu-pid "pool-off=$PID_gw_off" --cpu-pid "pool-off-otel=$PID_gw_off_b" \
    --cpu-pid "pool-on=$PID_gw_on" --cpu-pid "pool-on-otel=$PID_gw_on_b" \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/cpu-otel.json" \
    -n $((6 * CPU_N_PER_TARGET)) -c "$CPU_C" | tee "$OUT_DIR/cpu-otel.txt"
  {
    echo
    echo "Telemetry dropped (pool-off-otel, pool-on-otel):"
    for admin in "$ADMIN_OFF_B_PORT" "$ADMIN_ON_B_PORT"; do
      curl -fsS "http://127.0.0.1:$admin/metrics" | grep '^patchbay_telemetry_dropped_total' || true
    done
  } | tee -a "$OUT_DIR/cpu-otel.txt"
  stop_pids
  echo
fi

if stage many; then
  hard=$(ulimit -Hn)
  # Two sockets per session, plus the warm pool's (refilled while the
  # sessions live), plus the spare.
  if [ "$hard" != unlimited ] && [ $((2 * MANY_N + MANY_POOL_SIZE + FD_SPARE)) -gt "$hard" ]; then
    capped=$(((hard - MANY_POOL_SIZE - FD_SPARE) / 2))
    echo "note: the hard nofile limit is $hard: the gateway's two sockets per session and its pool of $MANY_POOL_SIZE allow $capped sessions, not $MANY_N" >&2
    MANY_N=$capped
  fi
  STACK=many
  C=$MANY_N POOL_SIZE=$MANY_POOL_SIZE
  start sim "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$SIM_PORT" --keys "$UPSTREAM_KEY" \
    --inference-delay-ms "$MANY_MODEL_MS"
  wait_port "$SIM_PORT"
  gateway gw-on "$GW_ON_PORT" "$ADMIN_ON_PORT" "$MANY_POOL_SIZE" "ws://127.0.0.1:$SIM_PORT/v1/realtime"
  wait_http "http://127.0.0.1:$ADMIN_ON_PORT/readyz"
  echo "== many: $MANY_N sessions at once, ${MANY_MODEL_MS} ms of model time each; gateway ready"
  sim_before=$(cpu_ticks "$PID_sim")
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
    --target "gateway=ws://127.0.0.1:$GW_ON_PORT/v1/realtime" \
    --metrics "gateway=http://127.0.0.1:$ADMIN_ON_PORT/metrics" \
    --cpu-pid "gateway=$PID_gw_on" \
    --timeout-secs $((MANY_MODEL_MS / 1000 + 120)) \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/many.json" -n "$MANY_N" -c "$MANY_N" |
    tee "$OUT_DIR/many.txt"
  awk -v t=$(($(cpu_ticks "$PID_sim") - sim_before)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "simulator CPU during this bench: %.1f s\n", t / hz }' | tee -a "$OUT_DIR/many.txt"
  stop_pids
  echo
fi

# calls_stack NAME: the simulator of the calls stages, tcp-relay and the
# pool-on gateway (and with AB_BIN the same from that binary), ready;
# sets `targets` and `ab` (the bench's arguments for pool-on-b).
calls_stack() {
  ab=()
  targets=(direct tcp-relay pool-on)
  if [ -n "${AB_BIN:-}" ]; then
    [ -x "$AB_BIN" ] || { echo "AB_BIN=$AB_BIN is not an executable" >&2; exit 1; }
    targets+=(pool-on-b)
  fi
  start_stack "$1" --stamp-frames --inference-delay-ms "$CALLS_INFERENCE_MS" \
    --audio-deltas $((CALLS_MODEL_MS / CALLS_DELTA_MS)) \
    --audio-delta-bytes $((24000 * 2 * CALLS_DELTA_MS / 1000)) \
    --delta-interval-ms "$CALLS_DELTA_MS"
  if [ -n "${AB_BIN:-}" ]; then
    GATEWAY_BIN=$AB_BIN gateway gw-on-b "$GW_ON_B_PORT" "$ADMIN_ON_B_PORT" "$POOL_SIZE" \
      "ws://127.0.0.1:$SIM_PORT/v1/realtime"
    wait_http "http://127.0.0.1:$ADMIN_ON_B_PORT/readyz"
    ab=(--target "pool-on-b=ws://127.0.0.1:$GW_ON_B_PORT/v1/realtime" --cpu-pid "pool-on-b=$PID_gw_on_b"
      --against pool-on)
    echo "== $1: A = $GATEWAY_BIN, B = $AB_BIN"
  fi
}

# rss_kib PID: VmRSS now, in KiB.
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

if stage calls-idle; then
  POOL_SIZE=$CALLS_POOL_SIZE C=$IDLE_N
  calls_stack "calls idle"
  procs=(relay gw_on)
  names=(tcp-relay pool-on)
  if [ ${#ab[@]} -gt 0 ]; then procs+=(gw_on_b); names+=(pool-on-b); fi
  before=()
  for p in "${procs[@]}"; do
    i="PID_$p"
    before+=("$(rss_kib "${!i}")")
  done
  echo "== calls idle: $IDLE_N calls per target × ${#targets[@]} targets, one turn each, then idle to ${IDLE_SECS} s; RSS read at ${IDLE_READ_SECS} s"
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
    --target "direct=ws://127.0.0.1:$SIM_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "pool-on=ws://127.0.0.1:$GW_ON_PORT/v1/realtime" \
    "${ab[@]}" --against tcp-relay \
    --cpu-pid "tcp-relay=$PID_relay" --cpu-pid "pool-on=$PID_gw_on" \
    --calls "$IDLE_N" --call-secs "$IDLE_SECS" --speech-ms 20 \
    --silence-ms $((IDLE_SECS * 1000)) \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/calls-idle.json" >"$OUT_DIR/calls-idle-bench.txt" 2>&1 &
  bench_pid=$!
  sleep "$IDLE_READ_SECS"
  {
    echo "RSS per idle call ($IDLE_N calls per target, read ${IDLE_READ_SECS} s into the run):"
    for i in "${!procs[@]}"; do
      p="PID_${procs[$i]}"
      awk -v n="${names[$i]}" -v b="${before[$i]}" -v a="$(rss_kib "${!p}")" -v c="$IDLE_N" \
        'BEGIN { printf "  %-10s %8d → %8d KiB  %6.1f KiB per idle call\n", n, b, a, (a - b) / c }'
    done
  } | tee "$OUT_DIR/calls-idle.txt"
  wait "$bench_pid" || echo "warning: the idle calls' bench failed (see $OUT_DIR/calls-idle-bench.txt)" >&2
  stop_pids
  echo
fi

if stage calls; then
  max_n=$CALLS_N
  for n in $CALLS_STEPS; do [ "$n" -gt "$max_n" ] && max_n=$n; done
  POOL_SIZE=$CALLS_POOL_SIZE C=$max_n
  calls_stack "calls"
  hard=$(ulimit -Hn)
  # The bench and the simulator hold a socket per call of every target.
  if [ "$hard" != unlimited ] && [ $((${#targets[@]} * max_n + FD_SPARE)) -gt "$hard" ]; then
    echo "warning: the hard nofile limit $hard is below ${#targets[@]} targets × $max_n calls" >&2
  fi
  # calls_bench NAME N SECS: the calls mode against every target, and the
  # simulator's CPU meanwhile.
  calls_bench() {
    local sim_before
    sim_before=$(cpu_ticks "$PID_sim")
    PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
      --target "direct=ws://127.0.0.1:$SIM_PORT/v1/realtime@$UPSTREAM_KEY" \
      --target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY" \
      --target "pool-on=ws://127.0.0.1:$GW_ON_PORT/v1/realtime" \
      "${ab[@]}" --against tcp-relay \
      --cpu-pid "tcp-relay=$PID_relay" --cpu-pid "pool-on=$PID_gw_on" \
      --calls "$2" --call-secs "$3" --speech-ms "$CALLS_SPEECH_MS" \
      --silence-ms "$CALLS_SILENCE_MS" \
      --threads "$BENCH_THREADS" --out "$OUT_DIR/$1.json" | tee "$OUT_DIR/$1.txt"
    awk -v t=$(($(cpu_ticks "$PID_sim") - sim_before)) -v hz="$(getconf CLK_TCK)" \
      'BEGIN { printf "simulator CPU during this bench: %.1f s\n", t / hz }' | tee -a "$OUT_DIR/$1.txt"
  }
  echo "== calls: $CALLS_N calls per target × ${#targets[@]} targets, ${CALLS_SECS} s each"
  calls_bench calls "$CALLS_N" "$CALLS_SECS"
  steps=()
  for n in $CALLS_STEPS; do
    echo
    echo "== calls capacity step: $n calls per target, ${CALLS_STEP_SECS} s each"
    calls_bench "calls-step-$n" "$n" "$CALLS_STEP_SECS" >/dev/null
    steps+=("$OUT_DIR/calls-step-$n.json")
    python3 benchmarks/calls_capacity.py --limit-ms "$CALLS_LIMIT_MS" --quiet "$OUT_DIR/calls-step-$n.json" ||
      break
  done
  if [ ${#steps[@]} -gt 0 ]; then
    python3 benchmarks/calls_capacity.py --limit-ms "$CALLS_LIMIT_MS" "${steps[@]}" |
      tee "$OUT_DIR/calls-capacity.txt"
  fi
  stop_pids
  echo
fi

if stage calls-latency; then
  POOL_SIZE=$CALLS_POOL_SIZE C=$LATENCY_N
  calls_stack "calls latency"
  sim_before=$(cpu_ticks "$PID_sim")
  echo "== calls latency: $LATENCY_N calls, one target at a time, ${LATENCY_SECS} s each, $LATENCY_ROUNDS rounds of ${#targets[@]} targets"
  # Each target's turn: the ramp, the calls, the last turn and the close.
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout $((BENCH_TIMEOUT_SECS + LATENCY_ROUNDS * ${#targets[@]} * (LATENCY_SECS + 30))) \
    "$BIN/patchbay-bench" \
    --target "direct=ws://127.0.0.1:$SIM_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime@$UPSTREAM_KEY" \
    --target "pool-on=ws://127.0.0.1:$GW_ON_PORT/v1/realtime" \
    "${ab[@]}" --against tcp-relay \
    --cpu-pid "tcp-relay=$PID_relay" --cpu-pid "pool-on=$PID_gw_on" \
    --calls "$LATENCY_N" --rotate "$LATENCY_ROUNDS" --call-secs "$LATENCY_SECS" \
    --speech-ms "$CALLS_SPEECH_MS" --silence-ms "$CALLS_SILENCE_MS" \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/calls-latency.json" | tee "$OUT_DIR/calls-latency.txt"
  awk -v t=$(($(cpu_ticks "$PID_sim") - sim_before)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "simulator CPU during this bench: %.1f s\n", t / hz }' | tee -a "$OUT_DIR/calls-latency.txt"
  python3 benchmarks/calls_capacity.py --limit-ms 1 "$OUT_DIR/calls-latency.json" |
    tee -a "$OUT_DIR/calls-latency.txt"
  stop_pids
  echo
fi

if stage translation; then
  POOL_SIZE=0 C=$TRANSLATION_N
  STACK=translation
  start sim "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$SIM_PORT" --keys "$UPSTREAM_KEY"
  wait_port "$SIM_PORT"
  start relay "$BIN/tcp-relay" "127.0.0.1:$RELAY_PORT" "127.0.0.1:$SIM_PORT"
  up="ws://127.0.0.1:$SIM_PORT/v1/realtime/translations"
  TRANSLATION=1 gateway gw-off "$GW_OFF_PORT" "$ADMIN_OFF_PORT" 0 "$up"
  ab=()
  if [ -n "${AB_BIN:-}" ]; then
    [ -x "$AB_BIN" ] || { echo "AB_BIN=$AB_BIN is not an executable" >&2; exit 1; }
    TRANSLATION=1 GATEWAY_BIN=$AB_BIN gateway gw-off-b "$GW_OFF_B_PORT" "$ADMIN_OFF_B_PORT" 0 "$up"
    wait_http "http://127.0.0.1:$ADMIN_OFF_B_PORT/readyz"
    ab=(--target "gateway-b=ws://127.0.0.1:$GW_OFF_B_PORT/v1/realtime/translations"
      --cpu-pid "gateway-b=$PID_gw_off_b" --against gateway)
    echo "== translation: A = $GATEWAY_BIN, B = $AB_BIN"
  fi
  wait_port "$RELAY_PORT"
  wait_http "http://127.0.0.1:$ADMIN_OFF_PORT/readyz"
  echo "== translation: $TRANSLATION_N sessions per target, ${TRANSLATION_SECS} s of audio each in ${TRANSLATION_CHUNK_MS} ms appends"
  sim_before=$(cpu_ticks "$PID_sim")
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" \
    --target "direct=$up@$UPSTREAM_KEY" \
    --target "tcp-relay=ws://127.0.0.1:$RELAY_PORT/v1/realtime/translations@$UPSTREAM_KEY" \
    --target "gateway=ws://127.0.0.1:$GW_OFF_PORT/v1/realtime/translations" \
    "${ab[@]}" --against tcp-relay \
    --cpu-pid "tcp-relay=$PID_relay" --cpu-pid "gateway=$PID_gw_off" \
    --calls "$TRANSLATION_N" --translation --call-secs "$TRANSLATION_SECS" \
    --chunk-ms "$TRANSLATION_CHUNK_MS" \
    --threads "$BENCH_THREADS" --out "$OUT_DIR/translation.json" | tee "$OUT_DIR/translation.txt"
  awk -v t=$(($(cpu_ticks "$PID_sim") - sim_before)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "simulator CPU during this bench: %.1f s\n", t / hz }' | tee -a "$OUT_DIR/translation.txt"
  stop_pids
  echo
fi

if stage close; then
  POOL_SIZE=$CLOSE_C C=$CLOSE_C
  start_stack "close" --audio-deltas "$CLOSE_DELTAS" --audio-delta-bytes 320 \
    --delta-interval-ms "$CLOSE_DELTA_INTERVAL_MS"
  # Four targets, CLOSE_N_PER_TARGET sessions each, in both benches.
  bench close-mid-response 1 -n $((4 * CLOSE_N_PER_TARGET)) -c "$CLOSE_C" --close-at first-audio
  echo
  bench close-after-done 1 -n $((4 * CLOSE_N_PER_TARGET)) -c "$CLOSE_C"
  stop_pids
  echo
fi

if stage store; then
  STACK=store
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    { echo "the store stage needs redis-server and redis-cli" >&2; exit 1; }
  # Ports nothing listens on, so the counts are this run's alone.
  free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  mkdir -p "$tmp/redis"
  # store_ports: the data nodes whose counts add up (the standalone server,
  # or the cluster's primaries; replicas only replay their writes).
  store_ports=()
  if [ "$STORE_TOPOLOGY" = cluster ]; then
    seeds=()
    for i in 1 2 3 4 5 6; do
      p=$(free_port)
      start "redis-$i" redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
        --cluster-port "$(free_port)" --cluster-config-file "$tmp/redis/nodes-$p.conf" \
        --repl-diskless-sync-delay 0 --save "" --appendonly no --dir "$tmp/redis"
      wait_port "$p"
      seeds+=("127.0.0.1:$p")
    done
    redis-cli --cluster create "${seeds[@]}" --cluster-replicas 1 --cluster-yes \
      >"$OUT_DIR/store-cluster-create.log" 2>&1
    first=${seeds[0]##*:}
    for _ in $(seq 300); do
      redis-cli -p "$first" CLUSTER INFO | grep -q '^cluster_state:ok' && break
      sleep 0.1
    done
    mapfile -t store_ports < <(redis-cli -p "$first" CLUSTER NODES |
      awk '$3 ~ /master/ && NF > 8 {split($2, a, "@"); n = split(a[1], b, ":"); print b[n]}')
    [ "${#store_ports[@]}" = 3 ] || { echo "the cluster did not form (see $OUT_DIR/store-cluster-create.log)" >&2; exit 1; }
    store_url="redis+cluster://$(IFS=,; echo "${seeds[*]}")"
  else
    p=$(free_port)
    start redis redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp/redis"
    wait_port "$p"
    store_ports=("$p")
    store_url="redis://127.0.0.1:$p"
  fi
  start sim "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$SIM_PORT" --keys "$UPSTREAM_KEY" \
    --stamp-frames --inference-delay-ms "$CALLS_INFERENCE_MS" \
    --audio-deltas $((CALLS_MODEL_MS / CALLS_DELTA_MS)) \
    --audio-delta-bytes $((24000 * 2 * CALLS_DELTA_MS / 1000)) --delta-interval-ms "$CALLS_DELTA_MS"
  wait_port "$SIM_PORT"
  # STORE_KEYS keys in one team: key, team and route budgets are charged.
  store_targets=()
  cap=""
  [ "$STORE_MAX_SESSIONS" != 0 ] && cap="max_sessions = $STORE_MAX_SESSIONS"
  : >"$tmp/store-keys.toml"
  for k in $(seq "$STORE_KEYS"); do
    key="pb-bench-store-$k"
    cat >>"$tmp/store-keys.toml" <<EOF
[[keys]]
id = "bench-$k"
sha256 = "$(printf %s "$key" | sha256sum | cut -d' ' -f1)"
team = "bench"
budget_usd = 1000000.0
rpm = 100000
tpm = 1000000000
$cap

EOF
    store_targets+=(--target "key-$k=ws://127.0.0.1:$GW_STORE_PORT/v1/realtime@$key")
  done
  cat >>"$tmp/store-keys.toml" <<EOF
[[teams]]
id = "bench"
budget_usd = 1000000.0
EOF
  cat >"$tmp/gw-store.toml" <<EOF
[server]
listen = "127.0.0.1:$GW_STORE_PORT"
admin_listen = "127.0.0.1:$ADMIN_STORE_PORT"

[pool]
max_size = 512

[limits]
max_sessions = $((2 * STORE_N > 1000 ? 2 * STORE_N : 1000))

[metering]
flush_secs = $STORE_FLUSH_SECS

[store]
redis_url_env = "BENCH_REDIS_URL"

[keys]
file = "$tmp/store-keys.toml"

[[routes]]
model = "gpt-realtime"
upstream_url = "ws://127.0.0.1:$SIM_PORT/v1/realtime"
api_key_env = "BENCH_UPSTREAM_KEY"
budget_usd = 1000000.0

[[prices]]
model = "gpt-realtime"
text_input = 4.0
cached_text_input = 0.4
audio_input = 32.0
cached_audio_input = 0.4
text_output = 16.0
audio_output = 64.0
EOF
  start gw-store env BENCH_UPSTREAM_KEY="$UPSTREAM_KEY" BENCH_REDIS_URL="$store_url" \
    REALTIME_POOL_SIZE="$CALLS_POOL_SIZE" "$GATEWAY_BIN" serve --config "$tmp/gw-store.toml"
  wait_http "http://127.0.0.1:$ADMIN_STORE_PORT/readyz" ||
    { tail -3 "$OUT_DIR/store-gw-store.log" >&2; exit 1; }
  per_key=$(((STORE_N + STORE_KEYS - 1) / STORE_KEYS))
  echo "== store: $((per_key * STORE_KEYS)) calls over $STORE_KEYS keys for ${STORE_SECS} s, flush every ${STORE_FLUSH_SECS} s, max_sessions $STORE_MAX_SESSIONS; $STORE_TOPOLOGY Redis, counted on ${store_ports[*]}"
  monitor_logs=()
  for p in "${store_ports[@]}"; do
    redis-cli -p "$p" CONFIG RESETSTAT >/dev/null
    if [ "$STORE_MONITOR" = 1 ]; then
      start "monitor-$p" redis-cli -p "$p" MONITOR
      monitor_logs+=("$OUT_DIR/store-monitor-$p.log")
    fi
  done
  redis_cpu() {
    for p in "${store_ports[@]}"; do redis-cli -p "$p" INFO cpu; done |
      awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}'
  }
  # Redis's own idle CPU (its timers; the gateway's idle traffic), per
  # second, taken off the run's.
  idle_before=$(redis_cpu)
  sleep 10
  idle_rate=$(awk -v a="$(redis_cpu)" -v b="$idle_before" 'BEGIN {print (a - b) / 10}')
  cpu_before=$(redis_cpu)
  started=$(date +%s%N)
  timeout "$BENCH_TIMEOUT_SECS" "$BIN/patchbay-bench" "${store_targets[@]}" \
    --calls "$per_key" --call-secs "$STORE_SECS" --speech-ms "$CALLS_SPEECH_MS" \
    --silence-ms "$CALLS_SILENCE_MS" --threads "$BENCH_THREADS" --out "$OUT_DIR/store-bench.json" \
    >"$OUT_DIR/store-bench.txt" 2>&1 || echo "warning: the store bench failed (see $OUT_DIR/store-bench.txt)" >&2
  # The last sessions' final flushes and lease removals.
  sleep 3
  wall_ms=$((($(date +%s%N) - started) / 1000000))
  cpu_after=$(redis_cpu)
  for p in "${store_ports[@]}"; do redis-cli -p "$p" INFO commandstats; done >"$OUT_DIR/store-commandstats.txt"
  curl -fsS "http://127.0.0.1:$ADMIN_STORE_PORT/metrics" >"$OUT_DIR/store-metrics.txt" || true
  stop_pids
  python3 benchmarks/store_commands.py --sessions "$((per_key * STORE_KEYS))" --secs "$STORE_SECS" \
    --wall-ms "$wall_ms" --metrics "$OUT_DIR/store-metrics.txt" \
    --redis-cpu-secs "$(awk -v a="$cpu_after" -v b="$cpu_before" -v i="$idle_rate" -v w="$wall_ms" \
      'BEGIN {print a - b - i * w / 1000}')" \
    "$OUT_DIR/store-commandstats.txt" "${monitor_logs[@]}" | tee "$OUT_DIR/store.txt"
  echo
fi

echo "reports and samples: $OUT_DIR/<stage>.{txt,json}; process logs: $OUT_DIR/<stack>-*.log"
