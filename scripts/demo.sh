#!/usr/bin/env bash
# The quick start: builds graphloom, sets up and starts the local model
# server, runs pipelines/procurement.toml over a first slice of the example
# corpus (its 16 ERP records: purchase orders and vendors, enough for the
# worked queries), runs the worked queries in sql/, scores the graph against
# the gold file, and stops the server. `scripts/demo.sh --all` goes on with
# the whole corpus (67 episodes); committed episodes are skipped, so
# re-running either is quick.
#
# GRAPHLOOM_DEMO_MODEL=0.5b uses the smaller model (less precise);
# GRAPHLOOM_DEMO_LIMIT=N processes only the N oldest new episodes.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
case "${1:-}" in
  --all) all=1 ;;
  "") ;;
  *) echo "usage: scripts/demo.sh [--all]" >&2; exit 2 ;;
esac
# Only what the demo needs: the linker .cargo/config.toml names, the binary
# and the local model. The test-only tools (moto, Azurite, GraphRAG,
# Chromium) are scripts/test.sh's business (scripts/setup.sh).
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v mold >/dev/null 2>&1; then
  echo "demo: installing mold (the linker .cargo/config.toml names)" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mold >/dev/null
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/graphloom-target}"
mkdir -p "$CARGO_TARGET_DIR" 2>/dev/null || export CARGO_TARGET_DIR="$HOME/.cache/graphloom-target"
bin="$CARGO_TARGET_DIR/debug/graphloom"
model="${GRAPHLOOM_DEMO_MODEL:-1.5b}"

# The build and the model setup (llama.cpp's build, the model download) run
# side by side: on a fresh machine each takes minutes.
build_log="$CARGO_TARGET_DIR/demo-build.log"
echo "demo: building graphloom in the background (log: $build_log)" >&2
cargo build --quiet >"$build_log" 2>&1 &
build_pid=$!
# Ctrl-C or a failed setup stops the build too.
trap 'kill "$build_pid" 2>/dev/null || true' EXIT
llm_ok=0
scripts/local-llm.sh setup --model "$model" || llm_ok=$?
build_ok=0
wait "$build_pid" || build_ok=$?
trap - EXIT
if [ "$build_ok" != 0 ]; then
  tail -n 40 "$build_log" >&2
  echo "demo: error: cargo build failed (exit $build_ok); full log: $build_log" >&2
fi
if [ "$llm_ok" != 0 ]; then
  echo "demo: error: scripts/local-llm.sh setup --model $model failed (exit $llm_ok); see its messages above" >&2
fi
[ "$build_ok" = 0 ] && [ "$llm_ok" = 0 ] || exit 1
cat "$build_log" >&2

if ! scripts/local-llm.sh status >/dev/null 2>&1; then
  # Two threads: nothing else runs during the demo. Sixteen slots: the
  # pipeline keeps sixteen calls in flight, decoded together as one
  # batch; on two cores llama.cpp writes ~42 tokens/s in total across 16
  # slots against ~28 across 4 (docs/quality.md, "Example pipeline
  # settings").
  scripts/local-llm.sh start --model "$model" --threads 2 --parallel 16
  trap 'scripts/local-llm.sh stop --chat' EXIT
fi

pipeline=pipelines/procurement.toml
limit=()
[ -n "${GRAPHLOOM_DEMO_LIMIT:-}" ] && limit=(--limit "$GRAPHLOOM_DEMO_LIMIT")
slice=()
[ "$all" = 1 ] || slice=(--source file://./pipelines/data/procurement/erp.jsonl)
echo "== graphloom ontology check $pipeline"
"$bin" ontology check "$pipeline"
echo
echo "== graphloom run $pipeline --dry-run"
"$bin" run "$pipeline" --dry-run "${slice[@]}" "${limit[@]}"
echo
echo "== graphloom run $pipeline ${slice[*]}"
"$bin" run "$pipeline" "${slice[@]}" "${limit[@]}"
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
echo
echo "== graphloom view / report (open the HTML files in a browser)"
"$bin" view --pipeline "$pipeline" --out out/procurement-view.html
"$bin" report --pipeline "$pipeline" --gold pipelines/gold/procurement.json --out out/procurement-report.html
if [ "$all" = 0 ]; then
  echo
  echo "That was the first slice (the ERP records). scripts/demo.sh --all goes on"
  echo "with the other 51 episodes (mail, chat, contract text); see the README for"
  echo "how long that takes."
fi
