#!/usr/bin/env bash
# GPU check (issue 15, item 5): specrt's CUDA-only tests and measurements, on one GPU machine
# with no network, inside 8 minutes on one H200. Nothing CPU-only runs here (no C++ build, no
# CPU tests, no checkpoint written: the probes build random bf16 models in memory).
#
#     run(command="bash benchmarks/gpu_check.sh", timeout_s=480)   # through the device tool
#     bash benchmarks/gpu_check.sh            # by hand on a CUDA machine: every step
#     bash benchmarks/gpu_check.sh probe kernels   # only the steps named (env always runs)
#     bash benchmarks/gpu_check.sh --dry-run  # print the steps and their caps, run nothing
#
# Steps (caps in seconds; they add up to 440, leaving 40 s of the 480 s for start-up and the
# summary; a failing or timed-out step is recorded and the next one runs):
#   env     10   GPU, driver, python / torch / triton versions
#   tests  200   one pytest process: tests/test_kernels.py with the kernels compiled (bf16
#                included: fused verify == decode steps bit for bit) and tests/test_gpu.py
#   probe  120   one process, `python -m benchmarks.gpu_probe` (its own budget 80 s): 1.5B and
#                0.5B shapes, decode ms/token vs the weight-read floor, verify(T)/step for
#                T = 1..17, draft/target step ratio, kernels per step (profiler), host syncs,
#                bf16 verify == decode over 512 tokens, a speculative round's cost
#   kernels 110  `python -m benchmarks.gpu_kernels` (its own budget 90 s): GPU time per kernel of
#                one decode step, and the matmul's candidate tiles timed per weight shape
# Files under $OUT: env.log, tests.log, probe.log, probe.json, kernels.log, kernels.json,
# summary.md (the step table, the tests' count, the kernels' tables, then the probe's table,
# last, each for the steps that ran; also printed). Exit 0 if every step passed, 1 otherwise,
# 2 on bad usage or no CUDA.
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PY=${PY:-python3}
OUT=${OUT:-benchmarks/out/gpu}
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET              # the kernels must be compiled, not interpreted

ALL_STEPS=(env tests probe kernels)
DRY_RUN=0
PICKED=0
STEPS=(env)
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        env) PICKED=1 ;;                              # always runs
        tests|probe|kernels) PICKED=1; [[ " ${STEPS[*]} " == *" $arg "* ]] || STEPS+=("$arg") ;;
        *) echo "gpu_check: unknown argument '$arg' (use tests, probe, kernels, --dry-run or" \
                "--help)" >&2; exit 2 ;;
    esac
done
(( PICKED )) || STEPS=("${ALL_STEPS[@]}")

declare -A CAP=([env]=10 [tests]=200 [probe]=120 [kernels]=110)
declare -A CMD=(
    [env]="nvidia-smi; $PY -c 'import sys, torch, triton; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"triton\", triton.__version__); print(torch.cuda.get_device_name())'"
    [tests]="$PY -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_gpu.py -rs"
    [probe]="$PY -m benchmarks.gpu_probe --budget 80 --json '$OUT/probe.json'"
    [kernels]="$PY -m benchmarks.gpu_kernels --budget 90 --json '$OUT/kernels.json'"
)

if (( DRY_RUN )); then
    total=0
    for s in "${STEPS[@]}"; do
        printf '%-7s cap %4ss  %s\n' "$s" "${CAP[$s]}" "${CMD[$s]}"
        total=$(( total + CAP[$s] ))
    done
    echo "total of caps: ${total}s (of 480s); files under OUT=$OUT"
    exit 0
fi

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: CUDA is not available to $PY; run this on a GPU machine" >&2
    exit 2
fi
mkdir -p "$OUT"
declare -A STATUS SECS
failed=0
for s in "${STEPS[@]}"; do
    echo "=== $s (cap ${CAP[$s]}s)"
    t0=$SECONDS
    timeout --kill-after=5 "${CAP[$s]}" bash -c "${CMD[$s]}" >"$OUT/$s.log" 2>&1
    rc=$?
    SECS[$s]=$(( SECONDS - t0 ))
    case $rc in
        0) STATUS[$s]=pass ;;
        124|137) STATUS[$s]="timeout"; failed=1 ;;
        *) STATUS[$s]="fail (rc $rc)"; failed=1 ;;
    esac
    tail -n 3 "$OUT/$s.log"
done

{
    echo "| step | status | seconds | cap |"
    echo "|---|---|---|---|"
    for s in "${STEPS[@]}"; do echo "| $s | ${STATUS[$s]} | ${SECS[$s]} | ${CAP[$s]} |"; done
    echo
    ran() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }   # this run's steps only, not stale logs
    ran tests && echo "tests: $(grep -E '[0-9]+ (passed|failed)' "$OUT/tests.log" | tail -n 1)" &&
        echo
    ran kernels && cat "$OUT/kernels.log" && echo
    ran probe && sed -n '/^| model | measure | value |/,$p' "$OUT/probe.log"
} >"$OUT/summary.md"
echo
cat "$OUT/summary.md"
exit $failed
