#!/usr/bin/env bash
# Sets up the environment, then builds an index over a generated demo
# dataset, searches it and prints recall@10, QPS and mean reads per query.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/nearline demo "$@"
