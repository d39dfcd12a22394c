#!/usr/bin/env bash
# Builds the Lambda code package: memchat with its runtime dependencies, the
# `stream` extra (uvicorn, for the streaming functions) and aws-xray-sdk (so
# that EnableTracing=Active works without another build; no dev/test extras),
# as Linux wheels for the template's runtime and architecture, at the
# versions pinned in infra/lambda-constraints.txt, byte-compiled for the
# runtime's Python, plus run.sh (the export and chat stream functions'
# handler), into build/lambda/, zipped to build/memchat-lambda.zip the way
# `sam deploy` zips it. `sam build` runs this same script (template.yaml:
# BuildMethod makefile; the Makefile).
#
#   bash infra/build_lambda.sh                 # build/lambda + build/memchat-lambda.zip
#   bash infra/build_lambda.sh --out DIR --no-zip
#   bash infra/build_lambda.sh --arch x86_64   # e.g. to time imports on this machine
#   bash infra/build_lambda.sh --update-constraints   # re-resolve the pins (see below)
#   bash infra/build_lambda.sh --reuse DIR ... # copy DIR's package if built from the same inputs
#
# Needs bash, a Python 3 with pip (python3.12, the runtime's version, for the
# byte-code: PYTHON=..., python3.12 on PATH, or pyenv's 3.12) and PyPI; no
# Docker, no GNU-only tools (sizes, hashes and the zip are done in Python),
# so it runs on Linux, macOS and WSL alike.
#
# Byte-code: compiled with `compileall --invalidation-mode unchecked-hash`,
# which Python loads without comparing it with the source. Timestamp-checked
# .pyc files (what pip writes) never match in Lambda: `sam deploy` zips every
# file with the date 1980-01-01, so each cold start would find them stale and
# compile every module it imports again (tests/release/test_package.py).
# Without a Python of the runtime's version the package has no byte-code (a
# .pyc is only valid for the Python that wrote it) and the script says so.
#
# Versions: pyproject.toml keeps ranges; the deployed package installs the
# exact versions in infra/lambda-constraints.txt (pip -c), and the build
# fails if it would ship a distribution that file does not pin. After a
# dependency change, `--update-constraints` resolves the newest versions the
# ranges allow for the runtime and rewrites the file (review the diff).
set -euo pipefail

PYTHON_VERSION="3.12"  # keep in step with template.yaml: Runtime python3.12
ARCH="arm64"           # keep in step with template.yaml: Architectures [arm64]
LAMBDA_LIMIT_BYTES=$((250 * 1024 * 1024))  # unzipped, all layers included

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/build/lambda"
CONSTRAINTS="$ROOT/infra/lambda-constraints.txt"
# Installed beside memchat[stream], without their dependencies: Powertools
# Tracer's X-Ray SDK (EnableTracing=Active). Its other dependency, botocore,
# is the runtime's (as boto3 is): a copy in the package would shadow it.
TRACER_REQUIREMENTS=(aws-xray-sdk wrapt)
ZIP=1
UPDATE_CONSTRAINTS=0
REUSE=""

while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --no-zip) ZIP=0; shift ;;
    --arch) ARCH="$2"; shift 2 ;;
    --update-constraints) UPDATE_CONSTRAINTS=1; shift ;;
    --reuse) REUSE="$2"; shift 2 ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
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
  if command -v pyenv >/dev/null && prefix="$(pyenv prefix "$PYTHON_VERSION" 2>/dev/null)" \
      && [ -x "$prefix/bin/python$PYTHON_VERSION" ]; then
    echo "$prefix/bin/python$PYTHON_VERSION"; return
  fi
  echo ""
}

PY="$(find_python)"
BYTECODE="unchecked-hash"
if [ -z "$PY" ]; then
  PY="python3"
  BYTECODE="none"
  echo "warning: no Python $PYTHON_VERSION found (set PYTHON=/path/to/python$PYTHON_VERSION):" \
       "building WITHOUT byte-code; every cold start will compile each module it imports" >&2
fi
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
PIP=("$PY" -m pip)

# --reuse DIR: a package built from exactly these inputs (this script, the
# pins, pyproject.toml, README.md, functions/, architecture and byte-code)
# is copied instead of built again. `sam build` builds one package per
# function (six identical ones); the Makefile passes --reuse so that only
# the first is built.
inputs_key() {
  "$PY" - "$ROOT" "$ARCH" "$BYTECODE" <<'PYTHON'
import hashlib, os, sys
root, *settings = sys.argv[1:]
digest = hashlib.sha256("\0".join(settings).encode())
paths = ["infra/build_lambda.sh", "infra/lambda-constraints.txt", "pyproject.toml", "README.md"]
for top, dirs, files in os.walk(os.path.join(root, "functions")):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info"))
    paths += sorted(os.path.relpath(os.path.join(top, f), root) for f in files if not f.endswith(".pyc"))
for path in paths:
    full = os.path.join(root, path)
    if os.path.exists(full):
        digest.update(path.encode() + b"\0")
        with open(full, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
print(digest.hexdigest()[:20])
PYTHON
}
copy_tree() {  # copy_tree FROM TO: TO's contents become FROM's
  find "$2" -mindepth 1 -delete
  (cd "$1" && tar -cf - .) | (cd "$2" && tar -xf -)
}
if [ -n "$REUSE" ] && [ "$UPDATE_CONSTRAINTS" = 0 ]; then
  mkdir -p "$REUSE"
  REUSE="$(cd "$REUSE" && pwd)"
  KEY="$(inputs_key)"
  if [ -f "$REUSE/$KEY/.complete" ]; then
    copy_tree "$REUSE/$KEY/package" "$OUT"
    echo "reused the package built from the same inputs ($REUSE/$KEY) for $OUT"
    exit 0
  fi
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 1. memchat as a wheel, built from a clean copy (no stale build/ or egg-info).
mkdir -p "$WORK/src"
cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$WORK/src/"
if [ -f "$ROOT/LICENSE" ]; then cp "$ROOT/LICENSE" "$WORK/src/"; fi
tar -C "$ROOT" --exclude='__pycache__' --exclude='*.egg-info' -cf - functions | tar -C "$WORK/src" -xf -
"${PIP[@]}" wheel --quiet --no-deps --wheel-dir "$WORK/wheel" "$WORK/src"

# 2. The wheel, its base dependencies, the `stream` extra (uvicorn: the
#    export and chat stream functions serve the app over HTTP to the Lambda
#    Web Adapter), then the X-Ray SDK, at the pinned versions, Linux wheels
#    only (no sdists to compile for the wrong machine). The Python 3.12+
#    runtimes run on Amazon Linux 2023 (glibc 2.34), so manylinux up to 2_34
#    is fine. No byte-code yet (step 4).
find "$OUT" -mindepth 1 -delete
WHEELS=("$WORK"/wheel/memchat-*.whl)
# Linux wheels for the runtime's Python and architecture, into the package.
WHEEL_TARGET=(--target "$OUT" --implementation cp --python-version "$PYTHON_VERSION"
  --platform "manylinux2014_$MACHINE" --platform "manylinux_2_28_$MACHINE"
  --platform "manylinux_2_34_$MACHINE" --only-binary=:all:)
PINS=(-c "$CONSTRAINTS")
if [ "$UPDATE_CONSTRAINTS" = 1 ]; then PINS=(); fi
"${PIP[@]}" install --quiet --no-compile "${PINS[@]}" \
  "${WHEEL_TARGET[@]}" \
  "${WHEELS[0]}[stream]"
"${PIP[@]}" install --quiet --no-compile --no-deps "${PINS[@]}" \
  "${WHEEL_TARGET[@]}" \
  "${TRACER_REQUIREMENTS[@]}"
# pip only warns about an unknown extra: without uvicorn the streaming
# functions would fail at every cold start, so fail the build instead.
if [ ! -f "$OUT/uvicorn/__init__.py" ]; then
  echo "error: uvicorn is not in the package: pyproject.toml needs the extra" \
       'stream = ["uvicorn>=0.30"]' >&2
  exit 1
fi

# 3. Every distribution shipped is pinned (or, with --update-constraints,
#    the pins are rewritten from what was just resolved).
"$PY" - "$OUT" "$CONSTRAINTS" "$UPDATE_CONSTRAINTS" <<'PYTHON'
import os, re, sys
out, constraints, update = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()
installed = {}
for entry in os.listdir(out):
    if entry.endswith(".dist-info"):
        fields = {}
        with open(os.path.join(out, entry, "METADATA"), encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key, value.strip())
        installed[canonical(fields["Name"])] = fields["Version"]
installed.pop("memchat", None)
header = ["# The deployed package's exact versions (infra/build_lambda.sh; ranges: pyproject.toml).\n"]
pins = {}
with open(constraints, encoding="utf-8") if os.path.exists(constraints) else open(os.devnull) as f:
    if os.path.exists(constraints):
        header = []
    for line in f:
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if match:
            pins[canonical(match.group(1))] = match.group(2)
        elif not pins:
            header.append(line)
if update:
    with open(constraints, "w", encoding="utf-8") as f:
        f.writelines(header)
        f.writelines(f"{name}=={version}\n" for name, version in sorted(installed.items()))
    print(f"wrote {len(installed)} pins to {constraints}")
    sys.exit(0)
unpinned = sorted(f"{n}=={v}" for n, v in installed.items() if pins.get(n) != v)
if unpinned:
    print("error: the package would ship versions infra/lambda-constraints.txt does not pin:",
          ", ".join(unpinned), "- run: bash infra/build_lambda.sh --update-constraints",
          file=sys.stderr)
    sys.exit(1)
PYTHON

# 4. Nothing Lambda runs: console scripts point at this machine's Python.
rm -rf "${OUT:?}/bin"

# 5. The streaming functions' handler (template.yaml: Handler run.sh). The Lambda
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

# 6. Byte-code the runtime can use as it is: hash-based and never checked
#    against the source, so the zip's fixed timestamps do not matter.
if [ "$BYTECODE" = "unchecked-hash" ]; then
  "$PY" -m compileall -f -q -j 0 --invalidation-mode unchecked-hash "$OUT" >/dev/null
fi

# 7. Sizes (in Python: `du -b`/`stat -c` are GNU-only), and the zip Lambda
#    receives, made as `sam deploy` makes it (every entry dated 1980-01-01,
#    the file's mode kept).
"$PY" - "$OUT" "$ZIP" "$LAMBDA_LIMIT_BYTES" "python$PYTHON_VERSION $ARCH, byte-code: $BYTECODE" <<'PYTHON'
import os, sys, zipfile
out, zip_it, limit, what = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
files = []
for top, dirs, names in os.walk(out):
    dirs.sort()
    files += [os.path.join(top, name) for name in sorted(names)]
size = sum(os.lstat(path).st_size for path in files)
print(f"built {out}: {size // 2**20} MB unzipped ({size} bytes, {len(files)} files;"
      f" Lambda's limit: 250 MB), {what}")
if size > limit:
    sys.exit("error: over Lambda's 250 MB unzipped limit")
if zip_it:
    target = os.path.join(os.path.dirname(out), "memchat-lambda.zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            info = zipfile.ZipInfo(os.path.relpath(path, out))  # date_time: 1980-01-01
            info.create_system = 3
            info.external_attr = os.stat(path).st_mode << 16
            with open(path, "rb") as f:
                archive.writestr(info, f.read(), zipfile.ZIP_DEFLATED)
    zipped = os.path.getsize(target)
    print(f"zipped {target}: {zipped // 2**20} MB ({zipped} bytes)")
PYTHON

# 8. Kept for the next --reuse with the same inputs (only the latest).
if [ -n "$REUSE" ] && [ "$UPDATE_CONSTRAINTS" = 0 ]; then
  STAGE="$REUSE/.$KEY.$$"
  rm -rf "$STAGE"
  mkdir -p "$STAGE/package"
  copy_tree "$OUT" "$STAGE/package"
  touch "$STAGE/.complete"
  for old in "$REUSE"/*; do
    if [ -e "$old" ] && [ "$old" != "$REUSE/$KEY" ]; then rm -rf "$old"; fi
  done
  # Atomic; a concurrent build (sam build --parallel) may have kept the same one first.
  "$PY" -c 'import os, sys; os.rename(sys.argv[1], sys.argv[2])' "$STAGE" "$REUSE/$KEY" \
    2>/dev/null || rm -rf "$STAGE"
fi
