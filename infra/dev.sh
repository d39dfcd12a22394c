#!/usr/bin/env bash
# Run memchat locally: installs into .venv, then `memchat dev` (embedded
# PostgreSQL under .memchat/ unless DATABASE_URL is set). Args go to `memchat dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/venv.sh dev --progress  # pip's progress shown: a first install takes a while
exec .venv/bin/memchat dev "$@"
