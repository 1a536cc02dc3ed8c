# A local `tally-node dev` cluster for the measuring scripts (restart-time, restore-peak,
# denial-memory): started in the background, waited for until every node answers `tally
# status`, stopped by its pid. Source it after setting NAME (the script's name, for
# messages), PORT (the dev cluster's base port) and WORK (the script's temp dir, which
# receives dev.log); NODES (the cluster's nodes, 1 to 7) defaults to 3.
# shellcheck shell=bash

PID=
NODES=${NODES:-3}
[[ $NODES =~ ^[1-7]$ ]] || { echo "$NAME: --nodes must be 1..7" >&2; exit 2; }
EPS=$(seq -s, -f "127.0.0.1:%g" $((PORT + 1)) $((PORT + NODES)))

# Stops the cluster if it runs and removes $WORK; the scripts trap it on EXIT.
cleanup() {
  [[ -n $PID ]] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$WORK"
}

# Starts `tally-node dev` on data dir $1 with the binaries in $2 (and any further
# `tally-node dev` options), and waits until every node answers status.
start() {
  local data_dir=$1 bin=$2
  shift 2
  "$bin/tally-node" dev --data-dir "$data_dir" --base-port "$PORT" --nodes "$NODES" "$@" \
    >"$WORK/dev.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 3600); do
    if "$bin/tally" --endpoints "$EPS" --tls-dir "$data_dir/tls" --json status 2>/dev/null | python3 -c '
import json, sys
rows = json.load(sys.stdin)
rows = rows if isinstance(rows, list) else [rows]
ok = len(rows) == int(sys.argv[1]) and all(isinstance(r, dict) and r.get("term") is not None for r in rows)
sys.exit(0 if ok else 1)' "$NODES" 2>/dev/null; then
      return 0
    fi
    kill -0 "$PID" 2>/dev/null || { echo "$NAME: the cluster exited; its log:" >&2; tail -20 "$WORK/dev.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "$NAME: the cluster did not answer within 6 minutes" >&2
  exit 1
}

stop() {
  kill "$PID"
  wait "$PID" 2>/dev/null || true
  PID=
}
