#!/bin/sh
# First start: a new cluster in $PGDATA owned by POSTGRES_USER (password
# POSTGRES_PASSWORD, scram-sha-256 over TCP) with database POSTGRES_DB. Then runs the
# command (`postgres -c …`).
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" \
        --auth-local=peer --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    # pg_hba from initdb admits loopback only; this image serves other hosts too.
    printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
exec "$@"
