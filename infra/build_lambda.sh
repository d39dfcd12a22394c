#!/usr/bin/env bash
# Builds the Lambda code package: memchat with its runtime dependencies, the
# `stream` extra (uvicorn, for the streaming functions), the `mcp` extra (the
# MCP SDK, for POST /mcp; imported only when /mcp is first requested) and
# aws-xray-sdk (so that EnableTracing=Active works without another build; no
# dev/test/cli extras),
# as Linux wheels for the template's runtime and architecture, exactly the
# files locked (version and sha256) in infra/lambda-constraints.txt,
# byte-compiled for the runtime's Python, plus run.sh (the export and chat
# stream functions' handler), into build/lambda/, zipped to
# build/memchat-lambda.zip the way `sam deploy` zips it. `sam build` runs
# this same script (template.yaml: BuildMethod makefile; the Makefile).
#
#   bash infra/build_lambda.sh                 # build/lambda + build/memchat-lambda.zip
#   bash infra/build_lambda.sh --out DIR --no-zip
#   bash infra/build_lambda.sh --arch x86_64   # e.g. to time imports on this machine
#   bash infra/build_lambda.sh --update-constraints   # re-resolve the pins and hashes (below)
#   bash infra/build_lambda.sh --update-hashes # keep the pinned versions, redo the hashes
#   bash infra/build_lambda.sh --lock FILE ... # another lock than infra/lambda-constraints.txt
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
# Versions and hashes: pyproject.toml keeps ranges; the deployed package
# gets exactly the files in the lock, infra/lambda-constraints.txt: every
# dependency pinned with == and the sha256 of each file pip may pick for it
# (CPython 3.12 manylinux wheels, arm64 and x86_64), installed with
# `pip install --require-hashes --no-deps -r`, so pip refuses a file whose
# hash the lock does not list (tampered, or re-uploaded) and any unpinned or
# unhashed requirement. memchat itself, built from this tree, has no hash to
# check: it is installed after them, on its own, with --no-deps --no-index.
# The build then fails unless the lock is exactly memchat[stream,mcp]'s
# dependency closure plus the X-Ray SDK (a dependency it lacks, a version
# outside a range, a pin nothing needs). After a dependency change,
# `--update-constraints` resolves the newest versions the ranges allow, for
# both architectures, and rewrites the lock with the sha256 of every such
# file the index lists for them (sorted: the same index, the same lock);
# to move one package, edit its version in the lock and run
# `--update-hashes`, which keeps the other versions. Both then build from
# the new lock; review its diff.
set -euo pipefail

PYTHON_VERSION="3.12"  # keep in step with template.yaml: Runtime python3.12
ARCH="arm64"           # keep in step with template.yaml: Architectures [arm64]
LAMBDA_LIMIT_BYTES=$((250 * 1024 * 1024))  # unzipped, all layers included

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/build/lambda"
LOCK="$ROOT/infra/lambda-constraints.txt"
# Where --update-* read each version's files and their sha256 (PEP 691/503).
INDEX_URL="${PIP_INDEX_URL:-https://pypi.org/simple}"
# The extras the package ships (pyproject.toml); never `cli`, `dev` or `test`.
EXTRAS="stream,mcp"
# Installed beside memchat[$EXTRAS], without their dependencies: Powertools
# Tracer's X-Ray SDK (EnableTracing=Active). Its other dependency, botocore,
# is the runtime's (as boto3 is): a copy in the package would shadow it.
TRACER_REQUIREMENTS=(aws-xray-sdk wrapt)
ZIP=1
UPDATE=""  # versions (--update-constraints) or hashes (--update-hashes)
REUSE=""

while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --no-zip) ZIP=0; shift ;;
    --arch) ARCH="$2"; shift 2 ;;
    --update-constraints) UPDATE=versions; shift ;;
    --update-hashes) UPDATE=hashes; shift ;;
    --lock) LOCK="$2"; shift 2 ;;
    --reuse) REUSE="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/{/^#/p;}' "$0"; exit 0 ;;
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
LOCK="$(cd "$(dirname "$LOCK")" && pwd)/$(basename "$LOCK")"
if [ "$UPDATE" != versions ] && [ ! -f "$LOCK" ]; then
  echo "no lock file $LOCK (bash infra/build_lambda.sh --update-constraints writes one)" >&2
  exit 2
fi

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
# lock, pyproject.toml, README.md, functions/, architecture and byte-code)
# is copied instead of built again. `sam build` builds one package per
# function (six identical ones); the Makefile passes --reuse so that only
# the first is built.
inputs_key() {
  "$PY" - "$ROOT" "$LOCK" "$ARCH" "$BYTECODE" <<'PYTHON'
import hashlib, os, sys
root, lock, *settings = sys.argv[1:]
digest = hashlib.sha256("\0".join(settings).encode())
with open(lock, "rb") as f:
    digest.update(hashlib.sha256(f.read()).digest())
paths = ["infra/build_lambda.sh", "pyproject.toml", "README.md"]
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
if [ -n "$REUSE" ] && [ -z "$UPDATE" ]; then
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
WHEELS=("$WORK"/wheel/memchat-*.whl)

# pip options for Linux wheels for the runtime's Python on MACHINE, into DIR.
# The Python 3.12+ runtimes run on Amazon Linux 2023 (glibc 2.34), so
# manylinux up to 2_34 is fine; wheels only (no sdists to compile for the
# wrong machine).
wheel_target() {  # wheel_target MACHINE DIR: sets WHEEL_TARGET
  WHEEL_TARGET=(--target "$2" --implementation cp --python-version "$PYTHON_VERSION"
    --platform "manylinux2014_$1" --platform "manylinux_2_28_$1"
    --platform "manylinux_2_34_$1" --only-binary=:all:)
}

# 2. --update-constraints / --update-hashes: the lock written again. pip
#    resolves memchat[stream,mcp] (newest versions the ranges allow, or under the
#    lock's versions) and the X-Ray SDK for both architectures, without
#    installing anything (--dry-run --report); the two must agree. Then each
#    pinned version gets the sha256 of every wheel the index lists for it
#    that pip may pick for CPython 3.12 on manylinux (glibc <= 2.34) arm64 or
#    x86_64, and the file pip picked must be among them. (pip 22.2 or
#    later: --dry-run --report.)
if [ -n "$UPDATE" ]; then
  PINS=()
  if [ "$UPDATE" = hashes ]; then
    # The lock's versions, as constraints (pip takes no hashes there).
    sed -n 's/^\([A-Za-z0-9_.-]*==[^ \\]*\).*/\1/p' "$LOCK" > "$WORK/pins.txt"
    PINS=(-c "$WORK/pins.txt")
  fi
  for machine in aarch64 x86_64; do
    wheel_target "$machine" "$WORK/resolve"
    "${PIP[@]}" install --quiet --dry-run --report "$WORK/report-app-$machine.json" \
      "${PINS[@]}" "${WHEEL_TARGET[@]}" "${WHEELS[0]}[$EXTRAS]"
    "${PIP[@]}" install --quiet --dry-run --no-deps --report "$WORK/report-tracer-$machine.json" \
      "${PINS[@]}" "${WHEEL_TARGET[@]}" "${TRACER_REQUIREMENTS[@]}"
  done
  "$PY" - "$LOCK" "$INDEX_URL" "$PYTHON_VERSION" "$WORK"/report-*.json <<'PYTHON'
import html, json, os, re, ssl, sys, urllib.request
try:  # pip's own copy: what pip itself decides with
    from pip._vendor.packaging.tags import compatible_tags, cpython_tags
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import Version
except ImportError:
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version
lock, index, python_version, *reports = sys.argv[1:]
python = tuple(map(int, python_version.split(".")))
machines = ("aarch64", "x86_64")

resolved = {machine: {} for machine in machines}
picked = {}
for path in reports:
    machine = re.search(r"-(aarch64|x86_64)\.json$", path).group(1)
    with open(path, encoding="utf-8") as f:
        for item in json.load(f)["install"]:
            name = canonicalize_name(item["metadata"]["name"])
            if name == "memchat":
                continue
            version = item["metadata"]["version"]
            resolved[machine][name] = version
            info = item["download_info"]
            digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
            picked.setdefault((name, version), []).append((info["url"], digest))
if resolved["aarch64"] != resolved["x86_64"]:
    differ = sorted(
        f"{n}: {resolved['aarch64'].get(n)} (arm64) / {resolved['x86_64'].get(n)} (x86_64)"
        for n in set(resolved["aarch64"]) | set(resolved["x86_64"])
        if resolved["aarch64"].get(n) != resolved["x86_64"].get(n)
    )
    sys.exit("error: arm64 and x86_64 resolve differently; one lock cannot serve both: "
             + ", ".join(differ))
pins = resolved["x86_64"]

supported = set()
for machine in machines:
    oldest = 5 if machine == "x86_64" else 17  # manylinux1 is glibc 2.5; aarch64 starts at 2.17
    platforms = [f"manylinux_2_{glibc}_{machine}" for glibc in range(34, oldest - 1, -1)]
    platforms += [f"manylinux2014_{machine}"]
    if machine == "x86_64":
        platforms += [f"manylinux2010_{machine}", f"manylinux1_{machine}"]
    supported.update(cpython_tags(python, platforms=platforms))
    supported.update(compatible_tags(python, f"cp{python[0]}{python[1]}", platforms))

context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
def index_files(name):
    """(filename, sha256) of every file the index lists for the project."""
    request = urllib.request.Request(
        f"{index.rstrip('/')}/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.01"},
    )
    with urllib.request.urlopen(request, timeout=120, context=context) as response:
        kind = response.headers.get_content_type()
        body = response.read().decode("utf-8")
    if kind == "application/vnd.pypi.simple.v1+json":  # PEP 691
        files = json.loads(body)["files"]
        return [(f["filename"], f.get("hashes", {}).get("sha256")) for f in files]
    anchor = r'<a\s[^>]*href="[^"#]*#sha256=([0-9a-f]{64})[^"]*"[^>]*>([^<]+)</a>'
    return [(html.unescape(m[2]).strip(), m[1]) for m in re.finditer(anchor, body)]  # PEP 503

locked = {}
for name, version in sorted(pins.items()):
    hashes = set()
    for filename, digest in index_files(name):
        if not filename.endswith(".whl") or not digest:
            continue  # sdists: the build installs wheels only
        try:
            _, wheel_version, _, tags = parse_wheel_filename(filename)
        except ValueError:
            continue
        if wheel_version == Version(version) and tags & supported:
            hashes.add(digest)
    for url, digest in picked[(name, version)]:
        if digest not in hashes:
            sys.exit(f"error: pip picks {url} for {name}=={version}, but {index} lists no"
                     " such file for CPython 3.12 manylinux: check pip's index settings")
    locked[name] = (version, sorted(hashes))

header = []
if os.path.exists(lock):
    with open(lock, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                break
            header.append(line)
if not header:
    header = ["# The deployed package's files (infra/build_lambda.sh; ranges: pyproject.toml).\n"]
lines = header[:]
for name, (version, hashes) in locked.items():
    lines.append(f"{name}=={version} \\\n")
    lines += [f"    --hash=sha256:{digest} \\\n" for digest in hashes[:-1]]
    lines.append(f"    --hash=sha256:{hashes[-1]}\n")
with open(lock + ".tmp", "w", encoding="utf-8") as f:
    f.writelines(lines)
os.replace(lock + ".tmp", lock)
print(f"wrote {len(locked)} pins and {sum(len(h) for _, h in locked.values())} hashes to {lock}")
PYTHON
fi

# 3. The dependencies: exactly the lock's files, each checked against its
#    sha256 (--require-hashes: pip refuses a file whose hash the lock does
#    not list, and any requirement not pinned with == and a hash), and
#    nothing the lock does not name (--no-deps; step 4 checks it is all
#    that is needed). Then memchat itself, the wheel built above from this
#    tree: nothing to check a hash against, so on its own, after them, with
#    no dependencies and no index. No byte-code yet (step 7).
find "$OUT" -mindepth 1 -delete
wheel_target "$MACHINE" "$OUT"
"${PIP[@]}" install --quiet --no-compile --require-hashes --no-deps \
  "${WHEEL_TARGET[@]}" -r "$LOCK"
rm -rf "${OUT:?}/bin"  # console scripts (step 5); memchat's own would clash with them
"${PIP[@]}" install --quiet --no-compile --no-deps --no-index \
  "${WHEEL_TARGET[@]}" "${WHEELS[0]}"
# pip only warns about an unknown extra: without uvicorn the streaming
# functions would fail at every cold start, and without the MCP SDK POST /mcp
# would answer 501, so fail the build instead.
if [ ! -f "$OUT/uvicorn/__init__.py" ]; then
  echo "error: uvicorn is not in the package: pyproject.toml needs the extra" \
       'stream = ["uvicorn>=0.30"]' >&2
  exit 1
fi
if [ ! -f "$OUT/mcp/__init__.py" ]; then
  echo "error: the MCP SDK is not in the package: pyproject.toml needs the extra" \
       'mcp = ["mcp>=2.0"]' >&2
  exit 1
fi

# 4. The lock is exactly what memchat[stream,mcp] needs on this architecture
#    (every Requires-Dist, markers evaluated for the runtime, satisfied by
#    a pinned version) plus the X-Ray SDK, whose own dependencies are not
#    followed (as pip --no-deps: botocore is the runtime's, as boto3 is: a
#    copy in the package would shadow it).
"$PY" - "$OUT" "$LOCK" "$PYTHON_VERSION" "$MACHINE" "$EXTRAS" "${TRACER_REQUIREMENTS[@]}" <<'PYTHON'
import os, sys
from email.parser import HeaderParser
try:  # pip's own copy: what pip itself decides with
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
except ImportError:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
out, lock, python_version, machine, package_extras, *tracer = sys.argv[1:]
package_extras = frozenset(package_extras.split(","))
tracer = {canonicalize_name(name) for name in tracer}
installed = {}
for entry in os.listdir(out):
    if entry.endswith(".dist-info"):
        with open(os.path.join(out, entry, "METADATA"), encoding="utf-8") as f:
            metadata = HeaderParser().parse(f)
        installed[canonicalize_name(metadata["Name"])] = metadata
pins = {}
with open(lock, encoding="utf-8") as f:
    for line in f.read().replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, version = line.split()[0].partition("==")
            pins[canonicalize_name(name)] = version
environment = {
    "python_version": python_version, "python_full_version": f"{python_version}.0",
    "implementation_name": "cpython", "implementation_version": f"{python_version}.0",
    "platform_python_implementation": "CPython", "platform_machine": machine,
    "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
    "platform_release": "", "platform_version": "",
}
errors = []
provided = set(installed["memchat"].get_all("Provides-Extra") or [])
errors += [f"memchat has no `{extra}` extra" for extra in sorted(package_extras - provided)]
needed, todo = set(), [("memchat", package_extras)]
while todo:
    name, extras = todo.pop()
    if (name, extras) in needed:
        continue
    needed.add((name, extras))
    for line in installed[name].get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker and not any(
            requirement.marker.evaluate({**environment, "extra": extra})
            for extra in ("", *sorted(extras))
        ):
            continue
        dependency = canonicalize_name(requirement.name)
        if dependency not in pins:
            errors.append(f"{name} requires {requirement}, which the lock does not pin")
            continue
        if not requirement.specifier.contains(pins[dependency], prereleases=True):
            errors.append(f"{name} requires {requirement}; the lock pins {pins[dependency]}")
        todo.append((dependency, frozenset(requirement.extras)))
needed_names = {name for name, _ in needed} | tracer
errors += [f"the lock does not pin {name}" for name in sorted(tracer - set(pins))]
errors += [f"the lock pins {name}, which nothing in the package requires"
           for name in sorted(set(pins) - needed_names)]
shipped = {name: m["Version"] for name, m in installed.items() if name != "memchat"}
if shipped != pins:  # pip installed something else than the lock says: never expected
    errors.append(f"installed {sorted(shipped.items())}, not the lock's {sorted(pins.items())}")
if errors:
    print(f"error: {lock} is not the package's dependencies: " + "; ".join(errors)
          + " - run: bash infra/build_lambda.sh --update-constraints"
          " (or, keeping the other versions, --update-hashes)", file=sys.stderr)
    sys.exit(1)
PYTHON

# 5. Nothing Lambda runs: console scripts point at this machine's Python.
rm -rf "${OUT:?}/bin"

# 6. The streaming functions' handler (template.yaml: Handler run.sh). The Lambda
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

# 7. Byte-code the runtime can use as it is: hash-based and never checked
#    against the source, so the zip's fixed timestamps do not matter.
if [ "$BYTECODE" = "unchecked-hash" ]; then
  "$PY" -m compileall -f -q -j 0 --invalidation-mode unchecked-hash "$OUT" >/dev/null
fi

# 8. Sizes (in Python: `du -b`/`stat -c` are GNU-only), and the zip Lambda
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

# 9. Kept for the next --reuse with the same inputs (only the latest).
if [ -n "$REUSE" ] && [ -z "$UPDATE" ]; then
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
