#!/bin/sh
# The compose deployment's one-shot `setup` step (the image's /bin/sh): on the first start,
# a cluster CA, a certificate for every node and client, server certificates for the kernel
# nodes' port and the payment rail, ed25519 keys for the token issuer and each kernel node,
# then each kernel's configuration. The CA and its key stay in the `ca`
# volume (mounted here only); what the services need is copied, keys mode 0600, to the `tls`
# volume that they mount read-only. Later starts find the `ready` marker and do nothing.
#
# Environment: TALLY_COMPOSE_NODES (3), TALLY_COMPOSE_KERNELS (2), TALLY_CLUSTER (tally-compose).
set -eu

nodes="${TALLY_COMPOSE_NODES:-3}"
kernels="${TALLY_COMPOSE_KERNELS:-2}"
cluster="${TALLY_CLUSTER:-tally-compose}"
ca=/var/lib/tally/ca
out=/etc/tally/tls

if [ -e "$out/ready" ]; then
  echo "setup: certificates and keys already in place"
  exit 0
fi
# No marker: nothing has used these files yet (every service waits for this step), so a
# half-finished earlier attempt is started over.
rm -rf "$ca" "$out"/*
umask 077

tally-node certs --dir "$ca" ca --cluster "$cluster"
i=1
while [ "$i" -le "$nodes" ]; do
  tally-node certs --dir "$ca" node --id "$i" --host "node-$i"
  i=$((i + 1))
done
tally-node certs --dir "$ca" client --name operator --role operator
tally-node certs --dir "$ca" client --name reader --role reader
# Kernels may touch every issuer's families here; in production name each issuer's key
# (--namespace <hex public key>).
tally-node certs --dir "$ca" client --name kernel --role kernel --namespace '*'
# What calls the kernels' tool-call service (the demo's driver).
tally-node certs --dir "$ca" client --name agent --role agent
# Server certificates naming tally-kernel and tally-rail, the names their callers verify
# (`tally-node certs` issues node and client certificates only).
tally-demo server-cert --dir "$ca" --name kernel-server --for kernel
tally-demo server-cert --dir "$ca" --name rail --for rail

# `tally-kernel keygen --out F` writes the seed (0600) and prints "public_key: <base64>".
public_key() {
  tally-kernel keygen --out "$1" | while read -r label value; do
    if [ "$label" = "public_key:" ]; then echo "$value"; fi
  done
}
issuer=$(public_key "$ca/issuer.seed")
i=1
while [ "$i" -le "$kernels" ]; do
  public_key "$ca/kernel-$i.seed" >"$ca/kernel-$i.pub"
  i=$((i + 1))
done

copy() { cat "$ca/$1" >"$out/$1"; }
copy ca.pem
i=1
while [ "$i" -le "$nodes" ]; do
  copy "node-$i.pem"
  copy "node-$i.key"
  i=$((i + 1))
done
for name in operator reader kernel agent kernel-server rail; do
  copy "$name.pem"
  copy "$name.key"
done
# The demo's driver issues tokens with this key; in production the issuer is elsewhere.
copy issuer.seed

endpoints=""
i=1
while [ "$i" -le "$nodes" ]; do
  endpoints="$endpoints${endpoints:+, }\"node-$i:7401\""
  i=$((i + 1))
done
i=1
while [ "$i" -le "$kernels" ]; do
  copy "kernel-$i.seed"
  peers=""
  j=1
  while [ "$j" -le "$kernels" ]; do
    if [ "$j" != "$i" ]; then
      read -r key <"$ca/kernel-$j.pub"
      peers="$peers${peers:+, }\"$key\""
    fi
    j=$((j + 1))
  done
  cat >"$out/kernel-$i.toml" <<EOF
# kernel-$i, written by deploy/compose/setup.sh
listen_addr = "0.0.0.0:7500"
tls_dir = "$out"
server_identity = "kernel-server"
metrics_addr = "0.0.0.0:7502"
key_file = "$out/kernel-$i.seed"
trusted_issuers = ["$issuer"]
trusted_kernel_keys = [$peers]
cluster_endpoints = [$endpoints]
cluster_tls_dir = "$out"
cluster_identity = "kernel"
receipt_log = "/var/lib/tally/receipts.jsonl"

[rail]
kind = "remote"
# Mutual TLS: the rail's certificate names tally-rail; this kernel presents its cluster
# certificate (kernel), which is what the rail admits.
endpoint = "rail:9090"
call_timeout_ms = 5000

[[tool_servers]]
id = "demo-tools"
url = "http://tools:8080/call"
tools = ["compute"]
EOF
  i=$((i + 1))
done

: >"$out/ready"
echo "setup: CA, $nodes node, 4 client and 2 server certificates, issuer and $kernels kernel keys written"
