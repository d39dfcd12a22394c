#!/usr/bin/env bash
# The test command (README and CI): lint, type-check, then the whole suite
# against a real PostgreSQL (embedded, or DATABASE_URL). Args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/venv.sh test
.venv/bin/ruff check functions tests
.venv/bin/ruff format --check functions tests
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
