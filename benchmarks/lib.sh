# Shell helpers sourced by run.sh and split.sh.

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
