#!/usr/bin/env bash
# Builds the Lambda code package: memchat with its runtime dependencies and
# the `stream` extra (uvicorn, for the streaming functions; no dev/test
# extras), as Linux wheels for the template's runtime and architecture, plus
# run.sh (the export and chat stream functions' handler), into build/lambda/,
# zipped to build/memchat-lambda.zip. `sam build` runs this same script
# (template.yaml: BuildMethod makefile).
#
#   bash infra/build_lambda.sh                 # build/lambda + build/memchat-lambda.zip
#   bash infra/build_lambda.sh --out DIR --no-zip
#   bash infra/build_lambda.sh --arch x86_64   # e.g. to time imports on this machine
#
# Byte-code is compiled by the pip that installs, so the script looks for a
# Python of the runtime's version (python3.12, or pyenv's) and falls back to
# no byte-code (slower cold starts) with a warning.
set -euo pipefail

PYTHON_VERSION="3.12"  # keep in step with template.yaml: Runtime python3.12
ARCH="arm64"           # keep in step with template.yaml: Architectures [arm64]
LAMBDA_LIMIT_BYTES=$((250 * 1024 * 1024))  # unzipped, all layers included

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/build/lambda"
ZIP=1

while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --no-zip) ZIP=0; shift ;;
    --arch) ARCH="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$ARCH" in
  arm64) MACHINE=aarch64 ;;
  x86_64) MACHINE=x86_64 ;;
  *) echo "--arch must be arm64 or x86_64" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

find_python() {
  local candidate prefix
  for candidate in "${PYTHON:-}" "python$PYTHON_VERSION"; do
    if [ -n "$candidate" ] && "$candidate" -c \
        "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$PYTHON_VERSION'.split('.'))))" \
        2>/dev/null; then
      echo "$candidate"; return
    fi
  done
  if command -v pyenv >/dev/null && prefix="$(pyenv prefix "$PYTHON_VERSION" 2>/dev/null)"; then
    echo "$prefix/bin/python$PYTHON_VERSION"; return
  fi
  echo ""
}

PY="$(find_python)"
COMPILE=(--compile)
if [ -z "$PY" ]; then
  PY="python3"
  COMPILE=(--no-compile)
  echo "warning: no Python $PYTHON_VERSION found (set PYTHON=...): building without byte-code;" \
       "every cold start will compile what it imports" >&2
fi
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
PIP=("$PY" -m pip)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 1. memchat as a wheel, built from a clean copy (no stale build/ or egg-info).
mkdir -p "$WORK/src"
cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$WORK/src/"
[ -f "$ROOT/LICENSE" ] && cp "$ROOT/LICENSE" "$WORK/src/"
tar -C "$ROOT" --exclude='__pycache__' --exclude='*.egg-info' -cf - functions | tar -C "$WORK/src" -xf -
"${PIP[@]}" wheel --quiet --no-deps --wheel-dir "$WORK/wheel" "$WORK/src"

# 2. The wheel, its base dependencies and the `stream` extra (uvicorn: the
#    export and chat stream functions serve the app over HTTP to the Lambda
#    Web Adapter),
#    Linux wheels only (no sdists to compile for the wrong machine). The
#    Python 3.12+ runtimes run on Amazon Linux 2023 (glibc 2.34), so
#    manylinux up to 2_34 is fine.
find "$OUT" -mindepth 1 -delete
WHEELS=("$WORK"/wheel/memchat-*.whl)
"${PIP[@]}" install --quiet "${COMPILE[@]}" \
  --target "$OUT" \
  --implementation cp \
  --python-version "$PYTHON_VERSION" \
  --platform "manylinux2014_$MACHINE" \
  --platform "manylinux_2_28_$MACHINE" \
  --platform "manylinux_2_34_$MACHINE" \
  --only-binary=:all: \
  "${WHEELS[0]}[stream]"
# pip only warns about an unknown extra: without uvicorn the streaming
# functions would fail at every cold start, so fail the build instead.
if [ ! -f "$OUT/uvicorn/__init__.py" ]; then
  echo "error: uvicorn is not in the package: pyproject.toml needs the extra" \
       'stream = ["uvicorn>=0.30"]' >&2
  exit 1
fi

# 3. Nothing Lambda runs: console scripts point at this machine's Python.
rm -rf "$OUT/bin"

# 4. The streaming functions' handler (template.yaml: Handler run.sh). The Lambda
#    Web Adapter's wrapper (AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap) executes
#    it; it starts the app's HTTP server, which the adapter then proxies the
#    function URL's requests to. The search path is the one the Python
#    runtime gives a handler: the package, then layers, then the runtime's.
cat > "$OUT/run.sh" <<'RUN_SH'
#!/bin/bash
set -e
cd "$LAMBDA_TASK_ROOT"
export PYTHONPATH="$LAMBDA_TASK_ROOT:/opt/python:$LAMBDA_RUNTIME_DIR${PYTHONPATH:+:$PYTHONPATH}"
exec python -m memchat.handlers.stream
RUN_SH
chmod 0755 "$OUT/run.sh"

UNZIPPED=$(du -sb "$OUT" | cut -f1)
FILES=$(find "$OUT" -type f | wc -l)
echo "built $OUT: $((UNZIPPED / 1024 / 1024)) MB unzipped ($UNZIPPED bytes, $FILES files;" \
     "Lambda's limit: 250 MB), python$PYTHON_VERSION $ARCH, byte-code: ${COMPILE[0]#--}"
if [ "$UNZIPPED" -gt "$LAMBDA_LIMIT_BYTES" ]; then
  echo "error: over Lambda's 250 MB unzipped limit" >&2
  exit 1
fi

# 5. The zip Lambda receives (sam deploy zips ARTIFACTS_DIR the same way).
if [ "$ZIP" = 1 ]; then
  ZIPFILE="$(dirname "$OUT")/memchat-lambda.zip"
  rm -f "$ZIPFILE"
  (cd "$OUT" && zip -qr -X "$ZIPFILE" .)
  ZIPPED=$(stat -c %s "$ZIPFILE")
  echo "zipped $ZIPFILE: $((ZIPPED / 1024 / 1024)) MB ($ZIPPED bytes)"
fi
