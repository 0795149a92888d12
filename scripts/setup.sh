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
