#!/usr/bin/env bash
# Fresh machine → running server: installs the one build prerequisite (cmake, for
# pingora) when missing, builds, and runs `stategate serve` on the embedded default
# (127.0.0.1:8080, local store under ~/.local/share/stategate). Extra arguments go to serve.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cmake >/dev/null 2>&1; then
    echo "[serve] installing cmake (needed to build pingora)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake
fi
exec cargo run --release --locked -- serve "$@"
