#!/usr/bin/env bash
# The test command (README and CI): lint, type-check, then the whole suite
# against a real PostgreSQL (embedded, or DATABASE_URL), then the Citus lane
# (`pytest --citus`). Args go to pytest instead (one run, as given).
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/venv.sh test
# Debian packages some tests need; without them those tests fail (no skips):
# the pooler tests start a real pgbouncer (transaction mode), as Supabase's
# Supavisor behaves; the browser tests (tests/browser) drive headless Chromium
# through chromedriver; the JS client tests (tests/js) need Node 20+ and npm.
# Installed in one apt-get call when we are root.
missing=()
PATH="$PATH:/usr/sbin" command -v pgbouncer >/dev/null || missing+=(pgbouncer)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
# tests/js (the OpenAI-compatible endpoint from the openai npm package and the
# Vercel AI SDK) runs `npm ci` and node; without them that test fails.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing ${missing[*]} (Debian packages) for the pooler, browser and JS tests" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing for the pooler, browser and JS tests: sudo apt-get install ${missing[*]}" >&2
  fi
fi
.venv/bin/ruff check functions tests
.venv/bin/ruff format --check functions tests
.venv/bin/mypy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest
# The Citus lane: the behaviour tests that run on Citus too (tests/conftest.py,
# CITUS_LANE), against a cluster of their own, migrated and distributed.
exec .venv/bin/python -m pytest --citus
