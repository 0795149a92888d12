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

# The local model servers for the tests that make real LLM calls: the chat
# server (llama.cpp + Qwen2.5-Coder-0.5B) and the embedding server
# (nomic-embed-text-v1.5). GRAPHLOOM_SKIP_LOCAL_LLM=1 skips them. Servers
# that already run are used and left running; the ones started here are
# stopped at exit.
if [ "${GRAPHLOOM_SKIP_LOCAL_LLM:-0}" != 1 ]; then
  scripts/local-llm.sh setup
  scripts/local-llm.sh setup --model nomic-embed
  started_llm=()
  stop_started_llm() {
    local role
    for role in ${started_llm[@]+"${started_llm[@]}"}; do scripts/local-llm.sh stop "$role" || true; done
  }
  trap stop_started_llm EXIT
  if ! scripts/local-llm.sh status >/dev/null 2>&1; then
    scripts/local-llm.sh start
    started_llm+=(--chat)
  fi
  if ! scripts/local-llm.sh status --embed >/dev/null 2>&1; then
    scripts/local-llm.sh start --model nomic-embed
    started_llm+=(--embed)
  fi
  eval "$(scripts/local-llm.sh env)"
fi
# `cluster` adds the Ballista scheduler and executors, which
# tests/it/cluster.rs starts as processes on 127.0.0.1.
cargo test --all-targets --features testkit,cluster "$@"
