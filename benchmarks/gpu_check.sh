#!/usr/bin/env bash
# GPU check: every CUDA-only check and benchmark of specrt in one run, on one GPU machine with
# no network, in <= 6 minutes on one H200.
#
# Through the device tool (it runs in the repository root with $OUT set; files under $OUT
# come back):
#     run(command="bash benchmarks/gpu_check.sh", timeout_s=480)
# By hand on a CUDA machine:
#     bash benchmarks/gpu_check.sh                    # logs + summary in benchmarks/out/gpu
#     bash benchmarks/gpu_check.sh --dry-run          # print the steps, run nothing
#     GPU_CHECK_ALLOW_CPU=1 bash benchmarks/gpu_check.sh   # no CUDA: quick CPU plumbing run
#
# Steps (each with its own timeout, all inside a total budget, so the summary is always
# written; a failing step is recorded and the next one runs):
#   env             GPU, driver, python / torch / triton / transformers versions
#   build_ext       the C++ n-gram matcher (`setup.py build_ext --inplace`); a failure is
#                   tolerated (reported, not fatal): the n-gram drafter falls back to Python
#   test_kernels    tests/test_kernels.py with the kernels compiled (bf16 included)
#   test_gpu        tests/test_gpu.py (CUDA exactness, graphs, CUDA vs CPU logits) +
#                   tests/test_speculative.py + tests/test_cuda_graph.py (CPU models)
#   bench_kernels   python -m benchmarks.kernels (full sweep)
#   bench_graphs    python -m benchmarks.graphs (draft loop eager vs CUDA graph, 0.5B shapes)
#   models          random-weight Qwen2.5-1.5B- and 0.5B-shaped bf16 checkpoints in $WORK
#                   (transformers Qwen2Config + save_pretrained; ~4 GB; no download)
#   verify_vs_step  python -m benchmarks.verify_vs_step on those two checkpoints
#
# Files under $OUT (7): setup.log (env, build_ext, models), tests.log (both pytest steps),
# bench_kernels.log, bench_graphs.log, bench_verify_vs_step.log, verify_vs_step.png,
# summary.md (step | status | seconds | key numbers, also printed at the end).
# Exit status: 0 if every step passed (build_ext may fail), 1 otherwise, 2 on bad usage.
#
# Environment: PY (default python3), OUT (default benchmarks/out/gpu), GPU_CHECK_BUDGET
# (total seconds, default 360), GPU_CHECK_WORK (scratch, default /tmp/specrt-gpu-check),
# GPU_CHECK_ALLOW_CPU=1 (run the quick CPU variant when CUDA is absent), GPU_CHECK_KEEP=1
# (keep the scratch checkpoints).
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET          # the kernels must be compiled, not interpreted
OUT=${OUT:-benchmarks/out/gpu}
WORK=${GPU_CHECK_WORK:-/tmp/specrt-gpu-check}
BUDGET=${GPU_CHECK_BUDGET:-360}
RESERVE=10                      # seconds kept for the summary

DRY_RUN=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown argument '$arg' (use --dry-run or --help)" >&2; exit 2 ;;
    esac
done

# --- mode: GPU (default) or the quick CPU plumbing run ------------------------------------
if (( DRY_RUN )); then
    if [[ "${GPU_CHECK_ALLOW_CPU:-0}" == 1 ]]; then MODE=cpu; else MODE=gpu; fi
elif "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    MODE=gpu
elif [[ "${GPU_CHECK_ALLOW_CPU:-0}" == 1 ]]; then
    MODE=cpu
else
    echo "gpu_check: CUDA is not available to $PY (or torch is missing there); run this on a GPU machine, or set" \
         "GPU_CHECK_ALLOW_CPU=1 for a quick CPU run of the plumbing" >&2
    exit 2
fi

if [[ $MODE == gpu ]]; then
    KERNEL_TESTS="tests/test_kernels.py"
    GPU_TESTS="tests/test_gpu.py tests/test_speculative.py tests/test_cuda_graph.py"
    KERNELS_ARGS=""
    GRAPHS_ARGS=""
    MODELS_SIZE=full
    VERIFY_ARGS="--device cuda --dtype bfloat16"
else    # CPU: a few fast tests (the Triton interpreter is slow) and tiny, quick benchmarks
    KERNEL_TESTS="tests/test_kernels.py -k 'hand_built or decode_equals_last_row'"
    GPU_TESTS="tests/test_gpu.py tests/test_cuda_graph.py -k 'not 100_rounds'"
    KERNELS_ARGS="--quick"
    GRAPHS_ARGS="--quick"
    MODELS_SIZE=tiny
    VERIFY_ARGS="--device cpu --dtype float32 --quick --threads 1"
fi

# --- helpers ------------------------------------------------------------------------------
START=$SECONDS
NAMES=() STATUS=() SECS=() KEYS=()
FAILED=0

if (( ! DRY_RUN )); then
    mkdir -p "$OUT" "$WORK" || exit 2
    OUT=$(cd "$OUT" && pwd)
fi

# run_step NAME LOG CAP_SECONDS TOLERATED COMMAND: run COMMAND (a bash string) under
# `timeout`, append its output to $OUT/LOG, record status, seconds and key numbers.
run_step() {
    local name=$1 log=$2 cap=$3 tolerated=$4 cmd=$5
    NAMES+=("$name")
    if (( DRY_RUN )); then
        printf '%-15s timeout <= %4ss  >> %s\n    %s\n' "$name" "$cap" "\$OUT/$log" "$cmd"
        STATUS+=("dry-run") SECS+=(0) KEYS+=("")
        return
    fi
    local left=$(( BUDGET - (SECONDS - START) - RESERVE ))
    local limit=$(( cap < left ? cap : left ))
    if (( limit < 15 )); then
        echo "=== $name: SKIPPED, ${left}s left of the ${BUDGET}s budget ===" >> "$OUT/$log"
        echo "[gpu_check] $name: skipped (time budget spent)"
        STATUS+=("SKIPPED") SECS+=(0) KEYS+=("out of time budget")
        FAILED=1
        return
    fi
    local tmp="$WORK/step-${#NAMES[@]}.out"
    echo "[gpu_check] $name (timeout ${limit}s): $cmd"
    echo "=== $name: $cmd (timeout ${limit}s, $(date -u '+%H:%M:%S UTC')) ===" >> "$OUT/$log"
    local t0=$SECONDS
    timeout -k 10 "$limit" bash -c "$cmd" > "$tmp" 2>&1
    local rc=$?
    local dt=$(( SECONDS - t0 ))
    cat "$tmp" >> "$OUT/$log"
    echo "=== $name: exit $rc after ${dt}s ===" >> "$OUT/$log"
    local status="ok"
    if (( rc == 124 || rc == 137 )); then
        status="TIMEOUT (${limit}s)"
    elif (( rc != 0 )); then
        status="FAIL (exit $rc)"
    fi
    if [[ $status != ok ]]; then
        if [[ $tolerated == 1 ]]; then status="$status, tolerated"; else FAILED=1; fi
    fi
    STATUS+=("$status") SECS+=("$dt")
    KEYS+=("$("$PY" "$WORK/keys.py" "$name" "$tmp" 2>/dev/null || true)")
    echo "[gpu_check] $name: $status, ${dt}s"
    tail -n 4 "$tmp" | cut -c1-300 | sed 's/^/    /'
}

# --- helper programs, written to the scratch directory --------------------------------------
if (( ! DRY_RUN )); then
cat > "$WORK/make_models.py" <<'EOF'
"""Random-weight Qwen2.5-Coder-1.5B- and 0.5B-shaped checkpoints (bf16), made with transformers'
own classes so the files are exactly what a real checkpoint looks like. argv: OUT_DIR full|tiny"""
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

out, size = sys.argv[1], sys.argv[2]
device = "cuda" if torch.cuda.is_available() else "cpu"
if size == "full":    # the real pair's config.json shape fields (both untied)
    shapes = {"target": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                             num_attention_heads=12, vocab_size=151936),
              "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                            num_attention_heads=14, vocab_size=151936)}
else:
    shapes = {"target": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, vocab_size=1000),
              "draft": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, vocab_size=1000)}
for name, shape in shapes.items():
    t0 = time.perf_counter()
    cfg = Qwen2Config(num_key_value_heads=2, rope_theta=1e6, max_position_embeddings=32768,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                      **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    model.save_pretrained(f"{out}/{name}")
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n / 1e6:,.1f} M parameters, bf16, built on {device} and saved to "
          f"{out}/{name} in {time.perf_counter() - t0:.1f} s")
    del model
EOF

cat > "$WORK/keys.py" <<'EOF'
"""The key numbers of one step's output, as one short line for summary.md. argv: STEP FILE"""
import json
import re
import sys

step, path = sys.argv[1], sys.argv[2]
text = open(path, errors="replace").read()


def last_json():
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def f(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


out = []
if step == "env":
    out += re.findall(r"^GPU \d+: ([^(\n]+)", text, re.M)[:1]
    out += re.findall(r"^(torch [^\n]+)", text, re.M)[:1]
elif step == "build_ext":
    out += re.findall(r"ngram backend: (\S+)", text)[-1:]
elif step.startswith("test"):
    counts = re.findall(r"^=*\s*((?:\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|"
                        r"deselected|warnings?)(?:, )?)+) in [\d.]+s", text, re.M)
    out += counts[-1:] or ["no pytest summary line"]
    diffs = re.findall(r"(\d+)/(\d+) outputs differ from plain", text)
    if diffs:
        bad = sum(int(a) for a, _ in diffs)
        out.append(f"bf16 spec != plain: {bad} of {sum(int(b) for _, b in diffs)} outputs")
elif step == "models":
    out += re.findall(r"^(\w+: [\d.,]+ M parameters)", text, re.M)
else:
    j = last_json()
    if j is None:
        out.append("no JSON line")
    elif step == "bench_kernels":
        out.append(f"copy {f(j.get('copy_bandwidth_gbps'), 0)} GB/s")
        att = j.get("verify_attention") or []
        if att:
            best = max(att, key=lambda r: r["fraction_of_copy_bw"])
            out.append(f"attn best {best['fraction_of_copy_bw']:.0%} of copy bw "
                       f"(B={best['B']} T={best['T']} L={best['cache_len']})")
            sp = [r["speedup_vs_sdpa"] for r in att]
            out.append(f"vs SDPA {min(sp):.2f}-{max(sp):.2f}x")
            out.append(f"max abs diff {max(r['max_abs_diff'] for r in att):.1e}")
        acc = j.get("acceptance") or []
        if acc:
            out.append("acceptance agrees" if all(r["agrees_with_reference"] for r in acc)
                       else "ACCEPTANCE DISAGREES")
    elif step == "bench_graphs":
        out.append(f"floor {f(j.get('floor_ms_per_step'), 3)} ms/step")
        for r in j.get("rows", []):
            out.append(f"B{r['B']} K{r['K']}: {f(r['eager_ms_per_step'], 3)} -> "
                       f"{f(r['static_ms_per_step'], 3)} ms/step ({f(r['speedup'])}x)")
        out.append("drafts identical" if j.get("drafts_identical") else "DRAFTS DIFFER")
    elif step == "verify_vs_step":
        rows = {(r["model"], r["P"], r["T"]): r for r in j.get("rows", [])}
        for (m, p, t), r in sorted(rows.items()):
            if t == 17 and p == min(P for _, P, _ in rows):
                out.append(f"{m} P={p}: T=1 {f(rows[(m, p, 1)]['ms'])} ms, T=17 "
                           f"{f(r['ms'])} ms ({f(r['ratio_to_T1'])}x)")
        for p, v in (j.get("draft_over_target_step") or {}).items():
            out.append(f"draft/target step P={p}: {f(v)}")
print("; ".join(out).replace("|", "/"))
EOF
fi

# --- the steps ------------------------------------------------------------------------------
echo "gpu_check: mode $MODE, python $PY, out $OUT, budget ${BUDGET}s$( (( DRY_RUN )) && echo ', DRY RUN')"

run_step env setup.log 30 0 "(nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv) || echo 'no nvidia-smi'; $PY -c 'import sys, torch, triton, transformers; print(\"python\", sys.version.split()[0]); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available()); print(\"triton\", triton.__version__); print(\"transformers\", transformers.__version__)'"

run_step build_ext setup.log 90 1 "$PY setup.py -q build_ext --inplace; rc=\$?; $PY -c 'from specrt.drafters.ngram_index import BACKEND; print(\"ngram backend:\", BACKEND)'; exit \$rc"

run_step test_kernels tests.log 150 0 "$PY -m pytest -q -p no:cacheprovider $KERNEL_TESTS"

run_step test_gpu tests.log 180 0 "$PY -m pytest -q -s -p no:cacheprovider $GPU_TESTS"

run_step bench_kernels bench_kernels.log 120 0 "$PY -m benchmarks.kernels $KERNELS_ARGS --out $WORK/kernels"

run_step bench_graphs bench_graphs.log 90 0 "$PY -m benchmarks.graphs $GRAPHS_ARGS --out $WORK/graphs"

run_step models setup.log 90 0 "rm -rf $WORK/models && $PY $WORK/make_models.py $WORK/models $MODELS_SIZE"

run_step verify_vs_step bench_verify_vs_step.log 90 0 "$PY -m benchmarks.verify_vs_step --model $WORK/models/target --draft $WORK/models/draft $VERIFY_ARGS --no-record --no-progress --out $WORK/verify && cp $WORK/verify/verify_vs_step.png $OUT/verify_vs_step.png"

# --- summary --------------------------------------------------------------------------------
if (( DRY_RUN )); then
    echo "(dry run: nothing was run; the summary would go to \$OUT/summary.md)"
    exit 0
fi
[[ "${GPU_CHECK_KEEP:-0}" == 1 ]] || rm -rf "$WORK/models"
{
    echo "# specrt GPU check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), mode $MODE, total $(( SECONDS - START )) s of a" \
         "${BUDGET} s budget. Logs: setup.log, tests.log, bench_*.log (same directory)."
    echo
    echo "| step | status | seconds | key numbers |"
    echo "|:---|:---|---:|:---|"
    for i in "${!NAMES[@]}"; do
        echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECS[$i]} | ${KEYS[$i]} |"
    done
    echo
    if (( FAILED )); then echo "Result: **FAILED** (see the logs)."; else echo "Result: all steps passed."; fi
} > "$OUT/summary.md"
echo
cat "$OUT/summary.md"
exit $(( FAILED ? 1 : 0 ))
