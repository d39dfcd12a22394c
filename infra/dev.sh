#!/usr/bin/env bash
# Run memchat locally: installs into .venv, then `memchat dev` (embedded
# PostgreSQL under .memchat/ unless DATABASE_URL is set). Args go to `memchat dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/venv.sh dev
exec .venv/bin/memchat dev "$@"
