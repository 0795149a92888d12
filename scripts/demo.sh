#!/usr/bin/env bash
# The quick start: builds graphloom, sets up and starts the local model
# server, runs pipelines/procurement.toml over the example corpus, runs the
# worked queries in sql/, scores the graph against the gold file, and stops
# the server. Re-running it is quick: committed episodes are skipped.
#
# GRAPHLOOM_DEMO_MODEL=0.5b uses the smaller model (less precise);
# GRAPHLOOM_DEMO_LIMIT=N processes only the N oldest new episodes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/graphloom-target}"
mkdir -p "$CARGO_TARGET_DIR" 2>/dev/null || export CARGO_TARGET_DIR="$HOME/.cache/graphloom-target"
cargo build --quiet
bin="$CARGO_TARGET_DIR/debug/graphloom"
model="${GRAPHLOOM_DEMO_MODEL:-1.5b}"

scripts/local-llm.sh setup --model "$model"
if ! scripts/local-llm.sh status >/dev/null 2>&1; then
  # Two threads: nothing else runs during the demo.
  scripts/local-llm.sh start --model "$model" --threads 2
  trap 'scripts/local-llm.sh stop' EXIT
fi

pipeline=pipelines/procurement.toml
limit=()
[ -n "${GRAPHLOOM_DEMO_LIMIT:-}" ] && limit=(--limit "$GRAPHLOOM_DEMO_LIMIT")
echo "== graphloom ontology check $pipeline"
"$bin" ontology check "$pipeline"
echo
echo "== graphloom run $pipeline --dry-run"
"$bin" run "$pipeline" --dry-run "${limit[@]}"
echo
echo "== graphloom run $pipeline"
"$bin" run "$pipeline" "${limit[@]}"
for query in sql/*.sql; do
  echo
  echo "== graphloom sql --pipeline $pipeline --file $query"
  sed -n 's/^-- //p' "$query" | head -1
  "$bin" sql --pipeline "$pipeline" --file "$query"
done
echo
echo "== graphloom eval --pipeline $pipeline --gold pipelines/gold/procurement.json"
"$bin" eval --pipeline "$pipeline" --gold pipelines/gold/procurement.json
echo
echo "== graphloom status --pipeline $pipeline"
"$bin" status --pipeline "$pipeline"
