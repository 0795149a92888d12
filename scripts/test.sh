#!/usr/bin/env bash
# Runs graphloom's whole test suite: unit tests, the integration-test binary
# (sqllogictest files, commit-protocol crash tests, Python/DuckDB interop).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Builds go to a persistent directory outside the clone so later runs are
# incremental; nothing depends on it being warm.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/graphloom-target}"
mkdir -p "$CARGO_TARGET_DIR" 2>/dev/null || export CARGO_TARGET_DIR="$HOME/.cache/graphloom-target"
cargo test --all-targets "$@"
