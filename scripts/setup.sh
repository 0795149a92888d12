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

# Python readers used by the interoperability test (deltalake, DuckDB).
if ! python3 -c "import deltalake, duckdb, pyarrow" >/dev/null 2>&1; then
  echo "setup: installing Python packages from tests/interop/requirements.txt" >&2
  python3 -m pip install --quiet --disable-pip-version-check -r tests/interop/requirements.txt
fi
