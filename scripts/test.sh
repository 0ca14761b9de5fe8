#!/usr/bin/env bash
# The project's whole test suite: formatting, lints, Rust unit/property
# tests, the Python suite, and the Python end-to-end tests again with the
# pread I/O fallback forced. Fails loudly on the first error.
#
# Every cargo step (clippy, the Rust tests, the extension maturin builds for
# the Python tests) runs with the `ci` profile (Cargo.toml) in one target
# directory, so the Rust tests reuse what the extension build compiled
# (dependencies whose features do not differ between the two graphs, about
# half of them: pyo3 and numpy turn on features of some shared crates) and an
# unchanged tree compiles nothing. The extension left in .venv is then the
# `ci` build (debug assertions and overflow checks on); `bash scripts/setup.sh`
# puts the release build back (from its own cache: no recompile).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
export NEARLINE_CARGO_PROFILE=ci
echo "== setup (extension built with the ci profile)"
bash scripts/setup.sh
# setup.sh made the venv; the same interpreter configures pyo3 for every cargo step.
export PYO3_PYTHON="$PWD/.venv/bin/python"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --profile ci --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --profile ci -p nearline -p nearline-http
# The budget tests' 30.7 MB graph indexes (tests/conftest.py budget_index): built by the first pytest
# pass, opened again by the pread pass; a directory of this run's own, removed when it ends.
NEARLINE_TEST_INDEXES="$(mktemp -d)"
export NEARLINE_TEST_INDEXES
trap 'rm -rf "$NEARLINE_TEST_INDEXES"' EXIT
echo "== pytest"
.venv/bin/python -m pytest -q --durations=15 tests
echo "== pytest (pread I/O engine forced)"
# (the crash test's 50 kills per index kind ran above; 10 each here, with pread; and the
# reader-in-another-process test's 1,500 acknowledged inserts ran above: 800 here, which still
# take the reader through two of the writer's checkpoints and log resets, with pread)
NEARLINE_IO=pread NEARLINE_CRASH_TRIALS=10 NEARLINE_STRESS_INSERTS=800 .venv/bin/python -m pytest -q --durations=10 tests -m "io_engine and not build_only"
echo "== all tests passed"
