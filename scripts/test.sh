#!/usr/bin/env bash
# Runs graphloom's whole test suite: unit tests and the integration-test
# binary (sqllogictest files, commit-protocol crash tests, the LLM client
# against the faithful test server, Python/DuckDB interop, and real
# structured calls to the local model server).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Builds go to a persistent directory outside the clone so later runs are
# incremental; nothing depends on it being warm.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/graphloom-target}"
mkdir -p "$CARGO_TARGET_DIR" 2>/dev/null || export CARGO_TARGET_DIR="$HOME/.cache/graphloom-target"

# The local model server (llama.cpp + Qwen2.5-Coder-0.5B) for the tests that
# make real LLM calls. GRAPHLOOM_SKIP_LOCAL_LLM=1 skips them.
if [ "${GRAPHLOOM_SKIP_LOCAL_LLM:-0}" != 1 ]; then
  scripts/local-llm.sh setup
  if ! scripts/local-llm.sh status >/dev/null 2>&1; then
    scripts/local-llm.sh start
    trap 'scripts/local-llm.sh stop' EXIT
  fi
  eval "$(scripts/local-llm.sh env)"
fi
cargo test --all-targets --features testkit "$@"
