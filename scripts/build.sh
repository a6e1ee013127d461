#!/usr/bin/env bash
# Configure and build Halite into a build directory (created if needed).
#   scripts/build.sh [BUILD_DIR] [extra cmake args...]
# Installs missing dependencies first (scripts/install-deps.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja "$@" >/dev/null
ninja -C "$build"
