# Shell helpers sourced by run.sh, split.sh and callgrind.sh.

# wait_port PORT: until 127.0.0.1:PORT accepts a connection, 30 s at most.
wait_port() {
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "gave up waiting for port $1" >&2
  return 1
}

# stop_pids: SIGTERM to every process in the array `pids`, a bounded wait
# (gateways drain on SIGTERM), then SIGKILL; empties `pids`.
stop_pids() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
}

# bench_setup: how run.sh, split.sh, callgrind.sh and pgo.sh start (after
# OUT_DIR is set): the keys, `ulimit -n` raised to the hard limit, the
# release build (unless SKIP_BUILD=1), BIN (the binaries' directory:
# BENCH_BIN, default target/release), OUT_DIR created, a temp dir `tmp`, an
# empty `pids` array, and traps that stop every process in it and remove
# `tmp` on exit.
bench_setup() {
  # Not secrets: the simulator accepts this key, the gateways and ws-relay this one.
  UPSTREAM_KEY=sk-sim-bench
  CLIENT_KEY=pb-bench-key
  ulimit -n "$(ulimit -Hn)"
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release --locked -q -p patchbay-gateway -p patchbay-bench
  fi
  BIN=${BENCH_BIN:-$PWD/target/release}
  mkdir -p "$OUT_DIR"
  tmp=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
}

bench_cleanup() {
  stop_pids
  rm -rf "$tmp"
}

# gateway_toml FILE PORT ADMIN_PORT SIM_PORT: the smallest gateway config,
# as the CPU scripts use it: one route to the simulator on SIM_PORT, pool and
# limits at their defaults (the pool's size comes from REALTIME_POOL_SIZE).
gateway_toml() {
  cat >"$1" <<EOT
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"

[[routes]]
model = "gpt-realtime"
upstream_url = "ws://127.0.0.1:$4/v1/realtime"
api_key_env = "BENCH_UPSTREAM_KEY"
EOT
}
