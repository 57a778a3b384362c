#!/usr/bin/env bash
# A Flower deployment on localhost: one SuperLink and N SuperNodes as processes (SuperNode k is
# client k: --node-config "partition-id=k"), for tests/test_flower_local.py and the README.
#   tests/flower_local.sh start STATE [N]     start them (logs and pids under STATE)
#   tests/flower_local.sh run STATE APP CFG   flwr run APP on them, CFG = its --run-config
#   tests/flower_local.sh stop STATE          stop what start started
# Ports: the SuperLink on 127.0.0.1:$FLOWER_PORT (default 18000), SuperNode k's ClientApp API
# on $FLOWER_PORT + 100 + k. flwr's own state (its CLI config) lives in STATE/flwr_home.
set -euo pipefail
cmd=${1:?start, run or stop}; state=${2:?state folder}
port=${FLOWER_PORT:-18000}
export FLWR_HOME="$state/flwr_home"

wait_for_port() {  # host:port that must accept connections within 60 s
  for _ in $(seq 120); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "nothing listens on 127.0.0.1:$1" >&2; return 1
}

case "$cmd" in
start)
  nodes=${3:-2}
  mkdir -p "$state" "$FLWR_HOME"
  flower-superlink --insecure --host 127.0.0.1 --port "$port" \
    --disable-runtime-dependency-installation >"$state/superlink.log" 2>&1 &
  echo $! >"$state/superlink.pid"
  wait_for_port "$port"
  for k in $(seq 0 $((nodes - 1))); do
    flower-supernode --insecure --superlink "127.0.0.1:$port" --port $((port + 100 + k)) \
      --node-config "partition-id=$k num-partitions=$nodes" >"$state/supernode$k.log" 2>&1 &
    echo $! >"$state/supernode$k.pid"
  done
  cat >"$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "localhost"

[superlink.localhost]
address = "127.0.0.1:$port"
insecure = true
TOML
  ;;
run)
  app=${3:?app folder}; cfg=${4:?run config}
  flwr run "$app" localhost --run-config "$cfg" --stream
  ;;
stop)  # each started process and the helpers it spawned (SuperExec, app processes)
  pids=""
  for f in "$state"/supernode*.pid "$state"/superlink.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); rm -f "$f"
    pids="$pids $pid $(pgrep -P "$pid" | tr '\n' ' ')"
  done
  [ -n "${pids// /}" ] || exit 0
  kill $pids 2>/dev/null || true
  for _ in $(seq 20); do
    alive=""; for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -z "$alive" ] && exit 0
    sleep 0.5
  done
  kill -9 $alive 2>/dev/null || true
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
