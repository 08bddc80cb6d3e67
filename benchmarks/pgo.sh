#!/usr/bin/env bash
# A profile-guided build of the gateway: instrumented build, a training
# run on 127.0.0.1, profile merge, optimized build.
#
# 1. The plain release build (the simulator and the bench run from it, so
#    only the gateway's own code is profiled).
# 2. The gateway built with `-Cprofile-generate` (target dir
#    target/pgo-gen).
# 3. Training: a simulator and two instrumented gateways (pool off, pool
#    on) in front of it; patchbay-bench runs PGO_N sessions per gateway at
#    c=PGO_C with the simulator's default response (one audio delta), then
#    PGO_SMALL_N at c=PGO_SMALL_C with 50 small deltas (~600-byte frames)
#    per response, then voice calls: PGO_CALLS_N calls per gateway for
#    PGO_CALLS_SECS, turns of 2 s of 40 ms appends, 2 s of model audio in
#    100 ms deltas, 0.5 s of silence (a call's life is mostly small frames
#    at real time, the loop a one-turn session barely runs). The workloads
#    are deliberately not the CPU stages' (20 deltas of 16 kB after 200 ms
#    of model time; calls of 20 ms appends and 50 ms deltas), so what those
#    stages measure is not what the profile was trained on. The gateways
#    are stopped with SIGTERM (a drain), which writes their profiles.
# 4. `llvm-profdata merge` → OUT_DIR/gateway.profdata.
# 5. The gateway built with `-Cprofile-use` (target dir target/pgo):
#    target/pgo/release/patchbay-gateway.
#
# llvm-profdata must read the profiles of rustc's own LLVM: LLVM_PROFDATA if
# set, else rustup's llvm-tools (`rustup component add llvm-tools`), else
# llvm-profdata-<rustc's LLVM major> (Debian: apt-get install llvm-22), else
# llvm-profdata on PATH.
#
# Knobs (env): PGO_N (2000) PGO_C (100) PGO_SMALL_N (500) PGO_SMALL_C (20)
# PGO_CALLS_N (100) PGO_CALLS_SECS (30) BASE_PORT OUT_DIR (target/pgo-data)
# SKIP_BUILD=1 (no plain build: the simulator and the bench from
# BENCH_BIN, default target/release; CI runs them from target/debug with a
# short training, to check that the build works, not to ship it).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/lib.sh
. benchmarks/lib.sh

PGO_N=${PGO_N:-2000}
PGO_C=${PGO_C:-100}
PGO_SMALL_N=${PGO_SMALL_N:-500}
PGO_SMALL_C=${PGO_SMALL_C:-20}
PGO_CALLS_N=${PGO_CALLS_N:-100}
PGO_CALLS_SECS=${PGO_CALLS_SECS:-30}
BASE_PORT=${BASE_PORT:-18000}
OUT_DIR=${OUT_DIR:-target/pgo-data}
OUT_DIR=$(mkdir -p "$OUT_DIR" && cd "$OUT_DIR" && pwd)

llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=${LLVM_PROFDATA:-}
if [ -z "$profdata" ]; then
  for candidate in "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata \
    "llvm-profdata-$llvm_major" llvm-profdata; do
    if command -v "$candidate" >/dev/null 2>&1; then
      profdata=$candidate
      break
    fi
  done
fi
if [ -z "$profdata" ]; then
  echo "no llvm-profdata for LLVM $llvm_major: set LLVM_PROFDATA, or install" \
    "rustup's llvm-tools or llvm-$llvm_major" >&2
  exit 1
fi

bench_setup
raw=$OUT_DIR/raw
rm -rf "$raw"
mkdir -p "$raw"
# Cargo's RUSTFLAGS replace any from config; the workspace sets none.
echo "== instrumented build (target/pgo-gen)"
RUSTFLAGS="-Cprofile-generate=$raw" \
  cargo build --release --locked -q -p patchbay-gateway --target-dir target/pgo-gen
GEN=$PWD/target/pgo-gen/release/patchbay-gateway
# The build's own instrumented build scripts wrote their profiles here.
rm -f "$raw"/*.profraw

sim=$((BASE_PORT + 100))
off=$((BASE_PORT + 81))
on=$((BASE_PORT + 82))

# start_training LABEL POOL SIM_ARGS...: a simulator and two instrumented
# gateways (pool off, pool on with POOL warm sockets).
start_training() {
  local label=$1 pool_on=$2
  shift 2
  "$BIN/patchbay-gateway" sim --listen "127.0.0.1:$sim" --keys "$UPSTREAM_KEY" "$@" \
    >"$OUT_DIR/sim-$label.log" 2>&1 &
  pids+=("$!")
  wait_port "$sim"
  local name port pool
  for name in off on; do
    port=${!name}
    pool=$([ "$name" = on ] && echo "$pool_on" || echo 0)
    gateway_toml "$tmp/gw-$name.toml" "$port" $((port + 10)) "$sim"
    env PATCHBAY_MASTER_KEY="$CLIENT_KEY" BENCH_UPSTREAM_KEY="$UPSTREAM_KEY" \
      REALTIME_POOL_SIZE="$pool" LLVM_PROFILE_FILE="$raw/gateway-%p-%m.profraw" \
      "$GEN" serve --config "$tmp/gw-$name.toml" >"$OUT_DIR/gw-$name-$label.log" 2>&1 &
    pids+=("$!")
    wait_port "$port"
  done
}

# A profile of failing sessions would optimize the error paths: every
# session (call) must have succeeded. check_training LABEL AWK: AWK reads
# the bench's report and fails unless both gateways' rows show success.
check_training() {
  if ! awk "$2" "$OUT_DIR/train-$1.txt"; then
    echo "training ($1): not every session succeeded; see $OUT_DIR/train-$1.txt" >&2
    exit 1
  fi
}

# train LABEL N C SIM_ARGS...: one bench of N one-turn sessions per gateway
# at c=C, everything stopped.
train() {
  local label=$1 n=$2 c=$3
  shift 3
  start_training "$label" "$c" "$@"
  echo "== training ($label): $n sessions per gateway at c=$c, simulator $*"
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout 600 "$BIN/patchbay-bench" \
    --target "pool-off=ws://127.0.0.1:$off/v1/realtime" \
    --target "pool-on=ws://127.0.0.1:$on/v1/realtime" \
    -n $((2 * n)) -c "$c" --out "$OUT_DIR/train-$label.json" >"$OUT_DIR/train-$label.txt" 2>&1
  grep -A3 "ok/sessions" "$OUT_DIR/train-$label.txt"
  stop_pids
  # The table's "ok/sessions" column.
  check_training "$label" '/ok\/sessions/ { t = 1; next } t && NF == 0 { exit }
    t { split($2, a, "/"); if (a[1] != a[2] || a[2] == 0) bad = 1; rows++ }
    END { exit (bad || rows != 2) }'
}

# train_calls LABEL N SECS SIM_ARGS...: N voice calls per gateway at once
# for SECS (patchbay-bench --calls), everything stopped.
train_calls() {
  local label=$1 n=$2 secs=$3
  shift 3
  start_training "$label" "$n" "$@"
  echo "== training ($label): $n calls per gateway for $secs s, simulator $*"
  PATCHBAY_BENCH_KEY="$CLIENT_KEY" timeout $((secs + 120)) "$BIN/patchbay-bench" \
    --target "pool-off=ws://127.0.0.1:$off/v1/realtime" \
    --target "pool-on=ws://127.0.0.1:$on/v1/realtime" \
    --calls "$n" --call-secs "$secs" --speech-ms 2000 --chunk-ms 40 --silence-ms 500 \
    --ramp-secs 2 --out "$OUT_DIR/train-$label.json" >"$OUT_DIR/train-$label.txt" 2>&1
  grep -A4 "^target .*calls .*failed" "$OUT_DIR/train-$label.txt"
  stop_pids
  # The calls table: target, calls, failed, turns.
  check_training "$label" '/^target .*calls .*failed/ { t = 1; getline; next }
    t && NF == 0 { exit }
    t { if ($2 == 0 || $3 != 0 || $4 == 0) bad = 1; rows++ }
    END { exit (bad || rows != 2) }'
}

train default "$PGO_N" "$PGO_C" --upgrade-delay-ms 20 --session-delay-ms 2
train small "$PGO_SMALL_N" "$PGO_SMALL_C" --upgrade-delay-ms 20 --session-delay-ms 2 \
  --audio-deltas 50 --audio-delta-bytes 320
train_calls calls "$PGO_CALLS_N" "$PGO_CALLS_SECS" --stamp-frames --inference-delay-ms 100 \
  --audio-deltas 20 --audio-delta-bytes 4800 --delta-interval-ms 100

shopt -s nullglob
profiles=("$raw"/gateway-*.profraw)
if [ "${#profiles[@]}" -ne 6 ]; then
  echo "expected a profile from each of 6 gateways, found ${#profiles[@]} in $raw" >&2
  exit 1
fi
"$profdata" merge -o "$OUT_DIR/gateway.profdata" "${profiles[@]}"
echo "== merged ${#profiles[@]} profiles into $OUT_DIR/gateway.profdata"

# Named by its content: cargo rebuilds when RUSTFLAGS change, not when the
# file they name does, so a new profile under the same name would leave
# the last build's binary in place.
sum=$(sha256sum "$OUT_DIR/gateway.profdata" | cut -c1-16)
rm -f "$OUT_DIR"/gateway-*.profdata
cp "$OUT_DIR/gateway.profdata" "$OUT_DIR/gateway-$sum.profdata"
echo "== optimized build (target/pgo)"
RUSTFLAGS="-Cprofile-use=$OUT_DIR/gateway-$sum.profdata" \
  cargo build --release --locked -q -p patchbay-gateway --target-dir target/pgo
echo "== $PWD/target/pgo/release/patchbay-gateway"
