#!/usr/bin/env bash
# The quick start: builds graphloom, loads the example facts into a fresh
# graph under ./out/procurement and runs every worked query in sql/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/graphloom-target}"
mkdir -p "$CARGO_TARGET_DIR" 2>/dev/null || export CARGO_TARGET_DIR="$HOME/.cache/graphloom-target"
cargo build --quiet
bin="$CARGO_TARGET_DIR/debug/graphloom"

graph=./out/procurement
rm -rf "$graph"
echo "== graphloom ontology check pipelines/procurement.toml"
"$bin" ontology check pipelines/procurement.toml
echo
echo "== graphloom add pipelines/procurement.toml pipelines/facts/procurement.jsonl"
"$bin" add pipelines/procurement.toml pipelines/facts/procurement.jsonl
for query in sql/*.sql; do
  echo
  echo "== graphloom sql --graph $graph --file $query"
  sed -n 's/^-- //p' "$query" | head -1
  "$bin" sql --graph "$graph" --file "$query"
done
echo
echo "== graphloom status --graph $graph"
"$bin" status --graph "$graph"
