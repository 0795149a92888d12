#!/usr/bin/env bash
# Installs what building and testing graphloom needs on a Debian 12 machine
# that has the Rust toolchain and Python 3 with pip. Idempotent and quick
# when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# mold: the linker .cargo/config.toml asks for (links are several times
# faster than with ld.bfd for DataFusion-sized binaries).
if ! command -v mold >/dev/null 2>&1; then
  echo "setup: installing mold" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mold >/dev/null
fi

# Python packages of the interop tests: the readers (deltalake, DuckDB), a
# local S3 server (moto) and the Azurite container helper
# (azure-storage-blob). Installed unless every pinned version is there.
if ! python3 - tests/interop/requirements.txt >/dev/null 2>&1 <<'PY'
import re, sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^]]*\])?==(\S+)", line)
    if m and version(m.group(1)) != m.group(3):
        sys.exit(1)
version("flask"), version("flask-cors")  # what moto's [server] extra adds
import deltalake, duckdb, pyarrow  # noqa: E401,F401  (what the tests probe)
PY
then
  echo "setup: installing Python packages from tests/interop/requirements.txt" >&2
  python3 -m pip install --quiet --disable-pip-version-check -r tests/interop/requirements.txt
fi

# Azurite, the Azure Blob Storage emulator, for graphs on az:// URLs, pinned
# to 3.35.0: it runs on the machine's Node.js 20 (3.37 needs Node.js 22).
# Tests run $AZURITE_DIR/node_modules/.bin/azurite-blob.
AZURITE_VERSION=3.35.0
AZURITE_DIR=/var/cache/graphloom-tools/azurite
if [ ! -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ] ||
   ! grep -q "\"version\": \"$AZURITE_VERSION\"" "$AZURITE_DIR/node_modules/azurite/package.json" 2>/dev/null; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup: error: npm is needed to install azurite@$AZURITE_VERSION into $AZURITE_DIR (install Node.js and npm, e.g. apt-get install nodejs npm)" >&2
    exit 1
  fi
  echo "setup: installing azurite@$AZURITE_VERSION into $AZURITE_DIR" >&2
  mkdir -p "$AZURITE_DIR"
  npm install --prefix "$AZURITE_DIR" --save-exact --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >/dev/null
fi

# GraphRAG (the `graphrag` PyPI package) in its own virtualenv, for the test
# that loads `graphloom export graphrag` with GraphRAG's own readers and
# context builders: it pins its own pandas/pyarrow, which must not move the
# interop tests' versions.
GRAPHRAG_VERSION=3.3.0
GRAPHRAG_VENV=/var/cache/graphloom-tools/graphrag-venv
if ! "$GRAPHRAG_VENV/bin/python" -c "from importlib.metadata import version; import sys; sys.exit(version('graphrag') != '$GRAPHRAG_VERSION')" 2>/dev/null; then
  echo "setup: installing graphrag==$GRAPHRAG_VERSION into $GRAPHRAG_VENV" >&2
  python3 -m venv "$GRAPHRAG_VENV"
  "$GRAPHRAG_VENV/bin/pip" install --quiet --disable-pip-version-check "graphrag==$GRAPHRAG_VERSION"
fi

# Headless Chromium (Debian's package) and playwright-core to drive it, for
# the tests that open `graphloom view` and `graphloom report` pages
# (tests/browser/check_page.mjs). playwright-core is pinned and never
# downloads a browser of its own.
if ! command -v chromium >/dev/null 2>&1; then
  echo "setup: installing chromium" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
PLAYWRIGHT_VERSION=1.64.1
PLAYWRIGHT_DIR=/var/cache/graphloom-tools/playwright
if ! grep -q "\"version\": \"$PLAYWRIGHT_VERSION\"" "$PLAYWRIGHT_DIR/node_modules/playwright-core/package.json" 2>/dev/null; then
  echo "setup: installing playwright-core@$PLAYWRIGHT_VERSION into $PLAYWRIGHT_DIR" >&2
  mkdir -p "$PLAYWRIGHT_DIR"
  npm install --prefix "$PLAYWRIGHT_DIR" --save-exact --no-audit --no-fund --loglevel=error "playwright-core@$PLAYWRIGHT_VERSION" >/dev/null
fi
