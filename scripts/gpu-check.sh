#!/usr/bin/env bash
# The whole GPU path in one prepared run (at most about 8 minutes on one GPU):
#   pytest -m cuda; hetprune compare on the embedded default; the paper's speed configurations
#   in bf16 at batch 256 (and compiled); HetDPT+ speed; the latency cost model's predicted against
#   measured speedups; all on CUDA.
#
#   bash scripts/gpu-check.sh RESULTS_DIR              # on a GPU machine
#   bash scripts/gpu-check.sh RESULTS_DIR --cpu-smoke  # the same steps, tiny and on the CPU: checks the script
#
# Works offline on a machine whose python3 has torch, timm, pluggy, safetensors, scikit-learn, scipy,
# matplotlib, pyyaml and tqdm: torch-pruning is installed from .whl/*.whl when missing (fetch it beforehand
# with `pip download --no-deps torch-pruning==1.6.1 -d .whl/`), this project with
# `pip install --no-deps --no-build-isolation -e .` (skipped by --cpu-smoke, which uses PYTHONPATH).
# Every step logs to RESULTS_DIR/<step>.log and has its own timeout; a failing step does not stop the
# others; RESULTS_DIR/summary.txt lists each step's outcome. The exit status is the number of steps
# that did not pass. GPU_CHECK_BUDGET_S (default 470) caps the whole run.
set -u

OUT=${1:?usage: bash scripts/gpu-check.sh RESULTS_DIR [--cpu-smoke]}
MODE=${2:-gpu}
case "$MODE" in gpu|--cpu-smoke) ;; *) echo "error: unknown option $MODE; allowed: --cpu-smoke" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-470}
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
FAILED=0
export HETPRUNE_NO_PROGRESS=1 PYTHONUNBUFFERED=1
: > "$SUMMARY"

# step NAME CAP_SECONDS COMMAND...: run with min(CAP, time left) as its timeout, log, record the outcome
step() {
    local name=$1 cap=$2
    shift 2
    local left=$((BUDGET - ($(date +%s) - START)))
    cap=$((cap * CAP_SCALE))
    local limit=$((cap < left ? cap : left))
    if ((limit < 10)); then
        echo "$name: SKIPPED (the ${BUDGET}s budget is spent)" | tee -a "$SUMMARY"
        FAILED=$((FAILED + 1))
        return
    fi
    local t0 rc status
    t0=$(date +%s)
    printf '== %s (timeout %ss)\n$ %s\n' "$name" "$limit" "$*" > "$OUT/$name.log"
    # bash -c so that a step may be one of the functions below (exported)
    timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >> "$OUT/$name.log" 2>&1
    rc=$?
    if ((rc == 0)); then
        status=passed
    elif ((rc == 124 || rc == 137)); then
        status="TIMED OUT after ${limit}s"
    else
        status="FAILED (exit $rc)"
    fi
    ((rc == 0)) || FAILED=$((FAILED + 1))
    echo "$name: $status in $(($(date +%s) - t0))s (log: $name.log)" | tee -a "$SUMMARY"
}

install() {
    if ! "$PY" -c "import torch_pruning" 2>/dev/null; then
        local wheels=(.whl/torch_pruning-*.whl)
        [ -e "${wheels[0]}" ] || { echo "torch_pruning is missing and there is no .whl/torch_pruning-*.whl"; return 1; }
        "$PY" -m pip install --no-index --no-deps "${wheels[@]}" || return 1
    fi
    "$PY" -m pip install --no-deps --no-build-isolation -e . || return 1
    "$PY" -c "import hetprune, torch_pruning; print('hetprune from', hetprune.__file__)"
}

environment() {
    git -C "$ROOT" log -1 --format='commit %H %s' 2>/dev/null
    command -v nvidia-smi >/dev/null && nvidia-smi
    "$PY" - <<'EOF'
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda)
print("cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i}", torch.cuda.get_device_name(i), "capability", torch.cuda.get_device_capability(i),
          "native bf16:", torch.cuda.is_bf16_supported(including_emulation=False))
EOF
}

export -f install environment
export PY ROOT

if [ "$MODE" = --cpu-smoke ]; then
    # the project's own checkout on the path instead of an install; tiny sizes on the CPU
    export PYTHONPATH="$ROOT:$ROOT/plugins${PYTHONPATH:+:$PYTHONPATH}"
    DEVICE=cpu
    CAP_SCALE=${GPU_CHECK_CAP_SCALE:-3}   # a shared CPU is slower than the GPU these caps are sized for
    TINY="$OUT/tiny.safetensors"
    KW='{"img_size": 16, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 4, "num_heads": 2, "init_values": 0.1}'
    # a tiny model with random weights for compare, and the paper's sites on DeiT-Tiny for the HetDPT+ script
    "$PY" - "$OUT" "$KW" <<'EOF' || exit 2
import json, sys
import torch
sys.path.insert(0, "benchmarks")
from speed_paper_configs import pruned_recipe
from hetprune.io import save_weights
from hetprune.models import ModelSpec, build
out, kwargs = sys.argv[1], json.loads(sys.argv[2])
torch.manual_seed(0)
save_weights(f"{out}/tiny.safetensors", build(ModelSpec("vit_tiny_patch16_224", kwargs)))
recipe = pruned_recipe("deit_tiny_patch16_224", build(ModelSpec("deit_tiny_patch16_224")))
with open(f"{out}/deit-tiny-recipe.json", "w") as fh:
    json.dump(recipe.to_dict(), fh)
EOF
    COMPARE=(--model vit_tiny_patch16_224 --model-kwargs "$KW" --checkpoint "$TINY" --strategies act-only,mix50
             --budgets 2 --seeds 0 --batch-sizes 1 --scorer magnitude --set finetune.epochs=1
             --set finetune.subset=32 --set short_finetune.subset=32 --set scoring.subset=32)
    SPEED=(--device cpu --dtype fp32 --batch-size 1 --configs deit_s --repeats 1 --warmup 0 --profile never
           --threads 1)
    SPEED_COMPILE=("${SPEED[@]}")
    PLUS=(--model deit_tiny_patch16_224 --recipe "$OUT/deit-tiny-recipe.json" --target 0.5 --batch 1 --repeats 1
          --warmup 0 --min-time 0 --threads 1 --device cpu --dtype fp32 --with-width-first)
    LATENCY=(--configs digits --batches 2 --repeats 1 --no-width --device cpu --dtype fp32 --tag cpu-smoke)
else
    CAP_SCALE=1
    step install 90 install
    DEVICE=cuda
    COMPARE=(--strategies hetdpt,act-only,mix50 --budgets 8,12 --seeds 0)
    SPEED=(--device cuda --dtype bf16 --batch-size 256)
    SPEED_COMPILE=("${SPEED[@]}" --configs deit_b)   # compiling DeiT-S too would not fit the 8 minutes
    PLUS=(--device cuda --dtype bf16 --batch 256 1 --repeats 5 --min-time 0.2 --threads 8 --with-depth-only --with-width-first)
    LATENCY=(--configs deit-b,deit-s --batches 1,256 --repeats 5 --no-width --device cuda --dtype bf16 --tag cuda-bf16)
fi

step environment 30 environment
step pytest-cuda 100 "$PY" -m pytest -q -m cuda -p no:cacheprovider --junitxml="$OUT/pytest-cuda.xml"
step compare 160 "$PY" -m hetprune compare --device "$DEVICE" "${COMPARE[@]}" --out "$OUT/compare" --overwrite
step speed-bf16 60 "$PY" benchmarks/speed_paper_configs.py "${SPEED[@]}" --out "$OUT/speed"
step hetdpt-plus-speed 100 "$PY" benchmarks/hetdpt_plus_speed.py "${PLUS[@]}" --out "$OUT/hetdpt-plus-speed-$DEVICE.md"
step latency-model 70 "$PY" benchmarks/latency_model.py "${LATENCY[@]}" --out "$OUT/latency"
step speed-bf16-compile 110 "$PY" benchmarks/speed_paper_configs.py "${SPEED_COMPILE[@]}" --compile \
    --out "$OUT/speed-compile"

echo "done in $(($(date +%s) - START))s; $FAILED step(s) did not pass; results in $OUT" | tee -a "$SUMMARY"
exit "$FAILED"
