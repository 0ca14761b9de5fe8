#!/usr/bin/env bash
# The project's whole test suite: formatting, lints, Rust unit/property
# tests, the Python suite, and the Python end-to-end tests again with the
# pread I/O fallback forced. Fails loudly on the first error.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== setup"
bash scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test -p nearline
echo "== pytest"
.venv/bin/python -m pytest -q tests
echo "== pytest (pread I/O engine forced)"
NEARLINE_IO=pread .venv/bin/python -m pytest -q tests -m io_engine
echo "== all tests passed"
