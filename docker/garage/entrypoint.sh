#!/bin/sh
# Single-node Garage. Writes $GARAGE_CONFIG_FILE from the environment, then:
#   server      runs the node (exec, so it gets the stop signal)
#   init        one-shot and idempotent, run next to a node that shares its volume:
#               waits for it, gives it a one-node layout, imports the key
#               GARAGE_KEY_ID / GARAGE_KEY_SECRET, creates GARAGE_BUCKETS (comma-
#               separated) and allows the key on them
#   <other>     any garage command, e.g. `status`
# Environment: GARAGE_RPC_SECRET (64 hex chars, required), GARAGE_BIND (0.0.0.0),
# GARAGE_S3_PORT (3900), GARAGE_RPC_PORT (3901), GARAGE_ADMIN_PORT (3903),
# GARAGE_REGION (garage).
set -eu

: "${GARAGE_RPC_SECRET:?set GARAGE_RPC_SECRET to 64 hex characters (openssl rand -hex 32)}"
: "${GARAGE_CONFIG_FILE:=/var/lib/garage/garage.toml}"
export GARAGE_CONFIG_FILE
bind="${GARAGE_BIND:-0.0.0.0}"
rpc_port="${GARAGE_RPC_PORT:-3901}"

mkdir -p /var/lib/garage/meta /var/lib/garage/data
# The secrets stay in the environment (GARAGE_RPC_SECRET is read by garage itself).
cat >"$GARAGE_CONFIG_FILE.tmp" <<TOML
metadata_dir = "/var/lib/garage/meta"
data_dir = "/var/lib/garage/data"
db_engine = "lmdb"
replication_factor = 1

rpc_bind_addr = "$bind:$rpc_port"
rpc_public_addr = "127.0.0.1:$rpc_port"

[s3_api]
s3_region = "${GARAGE_REGION:-garage}"
api_bind_addr = "$bind:${GARAGE_S3_PORT:-3900}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "$bind:${GARAGE_ADMIN_PORT:-3903}"
TOML
mv "$GARAGE_CONFIG_FILE.tmp" "$GARAGE_CONFIG_FILE"

# Retries "$@" once a second for up to $1 seconds.
retry() {
    tries="$1"
    shift
    until "$@" >/dev/null 2>&1; do
        tries=$((tries - 1))
        if [ "$tries" -le 0 ]; then
            echo "garage-init: gave up on: $*" >&2
            "$@"
            return 1
        fi
        sleep 1
    done
}

init() {
    : "${GARAGE_KEY_ID:?set GARAGE_KEY_ID (GK + 24 hex characters)}"
    : "${GARAGE_KEY_SECRET:?set GARAGE_KEY_SECRET (64 hex characters)}"
    : "${GARAGE_BUCKETS:?set GARAGE_BUCKETS (comma-separated bucket names)}"
    retry 60 garage status
    if garage layout show | grep -q '^Current cluster layout version: 0$'; then
        node="$(garage node id -q)"
        garage layout assign -z dc1 -c "${GARAGE_CAPACITY:-1G}" "${node%%@*}" >/dev/null
        garage layout apply --version 1 >/dev/null
    fi
    retry 60 garage health
    garage key info "$GARAGE_KEY_ID" >/dev/null 2>&1 ||
        garage key import --yes -n stategate "$GARAGE_KEY_ID" "$GARAGE_KEY_SECRET" >/dev/null
    for bucket in $(echo "$GARAGE_BUCKETS" | tr ',' ' '); do
        garage bucket info "$bucket" >/dev/null 2>&1 || garage bucket create "$bucket" >/dev/null
        garage bucket allow --read --write --owner "$bucket" --key "$GARAGE_KEY_ID" >/dev/null
    done
    echo "garage-init: layout, key and buckets ($GARAGE_BUCKETS) ready"
}

case "${1:-server}" in
server) exec garage server ;;
init) init ;;
*) exec garage "$@" ;;
esac
