#!/usr/bin/env bash
# Creates ./.venv with pinned Python dependencies and builds the nearline
# extension into it (release mode). Idempotent; safe to re-run: an unchanged
# tree compiles nothing.
#
# CARGO_TARGET_DIR (default: ./target) is where the compiled crates go; every
# script and cargo command of this repository shares it. PYO3_PYTHON is set to
# the venv's interpreter so that maturin and plain cargo commands (clippy,
# test) configure pyo3 the same way and do not invalidate each other's builds.
# NEARLINE_CARGO_PROFILE (default: release) is the cargo profile of the
# extension; scripts/test.sh uses `ci`, the profile of its cargo steps.
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
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
export PYO3_PYTHON="$PWD/.venv/bin/python"
PROFILE="${NEARLINE_CARGO_PROFILE:-release}"
echo "building the nearline extension (cargo profile $PROFILE; a first build compiles every crate: a few minutes on 2 cores)" >&2
# No -q: cargo's progress shows which crate is compiling.
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin develop --profile "$PROFILE"
