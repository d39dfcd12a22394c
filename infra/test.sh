#!/usr/bin/env bash
# The test command (README and CI): lint, type-check, then the whole suite
# against a real PostgreSQL (embedded, or DATABASE_URL). Args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/venv.sh test
# The pooler tests start a real pgbouncer (transaction mode), as Supabase's
# Supavisor behaves; Debian packages it. Without it those tests fail: no skips.
if ! PATH="$PATH:/usr/sbin" command -v pgbouncer >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing pgbouncer (Debian package) for the pooler tests" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
  else
    echo "pgbouncer is missing: sudo apt-get install pgbouncer" >&2
  fi
fi
.venv/bin/ruff check functions tests
.venv/bin/ruff format --check functions tests
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
