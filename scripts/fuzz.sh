#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ one after another and prints one
# summary table: executions and whether a crash, timeout, out-of-memory or
# leak was found. See fuzz/README.md.
#
# Usage: scripts/fuzz.sh [-t SECONDS | -r RUNS] [-s SANITIZER] [TARGET...]
#   -t SECONDS   time budget per target (default 600, or $FUZZ_TIME)
#   -r RUNS      run each target for RUNS inputs instead of a time budget
#   -s SANITIZER address (default), none, ... (passed to cargo fuzz)
#   TARGET...    targets to run (default: all of fuzz/fuzz_targets)
#
# Environment: CARGO_TARGET_DIR as for cargo; FUZZ_TARGET_DIR a separate
# target directory for the instrumented fuzz builds; FUZZ_ARGS extra
# libFuzzer arguments (e.g. "-jobs=4 -workers=4" on a machine with cores to
# spare).
# Logs go to fuzz/logs/TARGET.log, crashing inputs to fuzz/artifacts/TARGET/.
# Exits non-zero if any target failed.
#
# The only Rust toolchain may be stable: RUSTC_BOOTSTRAP=1 lets it accept the
# -Z flags cargo-fuzz passes (sanitizer, coverage instrumentation). It is set
# for the cargo-fuzz commands only: cargo rebuilds everything when it changes.
set -uo pipefail
cd "$(dirname "$0")/.."

time_budget="${FUZZ_TIME:-600}"
runs=""
sanitizer="address"
while getopts "t:r:s:h" opt; do
    case "$opt" in
        t) time_budget="$OPTARG" ;;
        r) runs="$OPTARG" ;;
        s) sanitizer="$OPTARG" ;;
        *) sed -n '2,20p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_targets/*.rs; do
        targets+=("$(basename "$f" .rs)")
    done
fi

fuzz_dir=()
if [ -n "${FUZZ_TARGET_DIR:-}" ]; then
    fuzz_dir=(--target-dir "$FUZZ_TARGET_DIR")
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --version 0.13.2 --locked || exit 1
fi

echo "== seed corpora (fuzz/corpus/TARGET)"
NEARLINE_FUZZ_CORPUS="$PWD/fuzz/corpus" \
    cargo test -q -p nearline --test fuzz_readers -- --ignored build_fuzz_corpus >/dev/null ||
    { echo "building the seed corpora failed"; exit 1; }
NEARLINE_FUZZ_CORPUS="$PWD/fuzz/corpus" \
    cargo test -q -p nearline --test fuzz_update_readers -- --ignored build_update_fuzz_corpus >/dev/null ||
    { echo "building the seed corpora failed"; exit 1; }

echo "== building the targets (sanitizer: $sanitizer)"
RUSTC_BOOTSTRAP=1 cargo fuzz build "${fuzz_dir[@]}" --sanitizer "$sanitizer" || { echo "cargo fuzz build failed"; exit 1; }

if [ -n "$runs" ]; then
    budget=(-runs="$runs")
    budget_text="$runs runs"
else
    budget=(-max_total_time="$time_budget")
    budget_text="${time_budget} s"
fi

mkdir -p fuzz/logs
declare -A execs result secs
failed=0
for t in "${targets[@]}"; do
    log="fuzz/logs/$t.log"
    echo "== $t ($budget_text)"
    start=$(date +%s)
    # -timeout: one input may take 10 s; -rss_limit_mb / -malloc_limit_mb: a
    # reader that allocates from an unchecked header is an out-of-memory.
    # shellcheck disable=SC2086
    RUSTC_BOOTSTRAP=1 cargo fuzz run "${fuzz_dir[@]}" --sanitizer "$sanitizer" "$t" "fuzz/corpus/$t" -- \
        "${budget[@]}" -print_final_stats=1 -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb=512 ${FUZZ_ARGS:-} >"$log" 2>&1
    rc=$?
    secs[$t]=$(($(date +%s) - start))
    n=$(grep -a 'stat::number_of_executed_units' "$log" | tail -1 | awk '{print $2}')
    if [ -z "$n" ]; then
        n=$(grep -aoE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    fi
    execs[$t]="${n:-0}"
    if grep -aq 'libFuzzer: timeout' "$log"; then
        result[$t]="TIMEOUT"
    elif grep -aq 'libFuzzer: out-of-memory\|malloc limit' "$log"; then
        result[$t]="OOM"
    elif grep -aq 'LeakSanitizer: detected memory leaks' "$log"; then
        result[$t]="LEAK"
    elif grep -aq 'libFuzzer: deadly signal\|ERROR: AddressSanitizer\|panicked at' "$log"; then
        result[$t]="CRASH"
    elif [ "$rc" -ne 0 ]; then
        result[$t]="FAILED (exit $rc)"
    else
        result[$t]="ok"
    fi
    [ "${result[$t]}" = "ok" ] || failed=1
    echo "   ${execs[$t]} executions, ${result[$t]}"
done

echo
echo "== summary ($budget_text per target, sanitizer $sanitizer)"
printf '%-18s %14s %8s  %s\n' target executions seconds result
for t in "${targets[@]}"; do
    printf '%-18s %14s %8s  %s\n' "$t" "${execs[$t]}" "${secs[$t]}" "${result[$t]}"
done
if [ "$failed" -ne 0 ]; then
    echo
    echo "inputs that failed are in fuzz/artifacts/TARGET/; reproduce one with"
    echo "  RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET fuzz/artifacts/TARGET/FILE"
    exit 1
fi
