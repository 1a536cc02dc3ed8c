#!/bin/sh
# The compose deployment's one-shot `cluster-init` step (the image's /bin/sh): once node-1
# answers, initialize the cluster through it unless a node already serves (a later start of
# the same cluster elects a leader from its logs by itself), then wait until every node serves,
# so the kernels start against a working cluster. Exits non-zero if node-1 does not answer
# within 120 s, or the nodes do not all serve within 240 s of the start.
#
# Environment: TALLY_COMPOSE_NODES (3), TALLY_REGION (local), TALLY_TLS_DIR, TALLY_IDENTITY
# (an operator certificate: initializing is an Admin call).
set -eu

nodes="${TALLY_COMPOSE_NODES:-3}"
region="${TALLY_REGION:-local}"
tls="${TALLY_TLS_DIR:-/etc/tally/tls}"
identity="${TALLY_IDENTITY:-operator}"

# `tally-node healthcheck` prints "<endpoint>: SERVING" (exit 0), "...: NOT_SERVING" (exit 1,
# the node answers but has no leader), or a connection error (exit 1).
health() {
  tally-node healthcheck --endpoint "$1" --tls-dir "$tls" --identity "$identity" \
    --timeout-ms 2000 2>&1 || true
}

waited=0
until case "$(health node-1:7401)" in *SERVING*) true ;; *) false ;; esac; do
  if [ "$waited" -ge 120 ]; then
    echo "cluster-init: node-1 does not answer after 120 s: $(health node-1:7401)" >&2
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done

serving=0
i=1
while [ "$i" -le "$nodes" ]; do
  case "$(health "node-$i:7401")" in *": SERVING"*) serving=$((serving + 1)) ;; esac
  i=$((i + 1))
done
if [ "$serving" -gt 0 ]; then
  echo "cluster-init: $serving node(s) already serving: the cluster exists"
else
  set --
  i=1
  while [ "$i" -le "$nodes" ]; do
    set -- "$@" --member "$i=node-$i:7401,node-$i:7601,$region"
    i=$((i + 1))
  done
  # Refused by a node that already has a log (a restart still electing): then the wait
  # below decides.
  tally-node init --endpoint node-1:7401 --tls-dir "$tls" --identity "$identity" "$@" ||
    echo "cluster-init: initialize refused (see above); waiting for the nodes to serve"
fi

i=1
while [ "$i" -le "$nodes" ]; do
  until case "$(health "node-$i:7401")" in *": SERVING"*) true ;; *) false ;; esac; do
    if [ "$waited" -ge 240 ]; then
      echo "cluster-init: node-$i is not serving: $(health "node-$i:7401")" >&2
      exit 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  i=$((i + 1))
done
echo "cluster-init: all $nodes nodes serve"
