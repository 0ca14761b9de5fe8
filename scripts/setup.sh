#!/usr/bin/env bash
# Creates ./.venv with pinned Python dependencies and builds the nearline
# extension into it (release mode). Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -r requirements-dev.txt
# diskannpy pins numpy 1.25; installed without its deps into our numpy 2 env.
.venv/bin/python -m pip install -q --no-deps diskannpy==0.7.0 || echo "warning: diskannpy unavailable; peer comparisons will be skipped" >&2
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin develop --release -q
