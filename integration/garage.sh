#!/usr/bin/env bash
# Single-node Garage on loopback for tests.
#   integration/garage.sh start <dir>   -> starts it, provisions a key + bucket,
#                                          writes <dir>/env (STATEGATE_S3_* lines)
#   integration/garage.sh stop <dir>
#   integration/garage.sh env <dir>     -> prints <dir>/env
# The garage binary is taken from $GARAGE_BIN, PATH, or ~/.cargo/bin/garage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/garage_harness.py" "$@"
