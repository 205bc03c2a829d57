#!/usr/bin/env bash
# The GPU check: what a user needs to know first, in at most 8 minutes on one GPU, in this order:
#   1. install this project (torch-pruning is optional: without it only the HetDPT+ step is skipped);
#   2. DeiT-B dense against the paper's pruned recipe, fp32 and bf16, batch 64 and 256 (measured speedup);
#   3. the training-step probe of `--plan` on DeiT-B with the paper's recipe (student + teacher, bf16):
#      images/s and peak memory at batch 128 (probe-batch), and at 1024 through accumulation, 8 x 128
#      (probe-accum); each prints the paper recipe's plan timed by its probe;
#   4. the CUDA tests; 5. HetDPT+ speed (needs torch-pruning).
#
#   bash scripts/gpu-check.sh RESULTS_DIR              # on a GPU machine; RESULTS_DIR.tar.gz holds everything
#   bash scripts/gpu-check.sh RESULTS_DIR --cpu-smoke  # the same steps, tiny and on the CPU: checks the script
#
# Offline: needs python3 with torch, timm, pluggy, safetensors, scikit-learn, scipy, matplotlib, pyyaml, tqdm
# and pillow. torch-pruning is installed from .whl/torch_pruning-*.whl when it is missing and a wheel is there
# (fetch it beforehand: pip download --no-deps torch-pruning==1.6.1 -d .whl/). Each step has a cap; the caps
# add up to at most the budget (GPU_CHECK_BUDGET_S, default 480), so no step is starved by an earlier one.
# Every step logs to RESULTS_DIR/<step>.log; a failing step does not stop the others; summary.txt lists the
# outcomes. The exit status is the number of steps that did not pass (a skipped step is not a failure).
set -u

OUT=${1:?usage: bash scripts/gpu-check.sh RESULTS_DIR [--cpu-smoke]}
MODE=${2:-gpu}
case "$MODE" in gpu|--cpu-smoke) ;; *) echo "error: unknown option $MODE; allowed: --cpu-smoke" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
FAILED=0
export HETPRUNE_NO_PROGRESS=1 PYTHONUNBUFFERED=1

# name:cap in seconds, in the order they run; the caps must fit the budget (checked before anything runs)
CAPS=(install:60 environment:15 speed-deitb:100 probe-batch:80 probe-accum:100 pytest-cuda:60 hetdpt-plus-speed:50)
TOTAL=0
for entry in "${CAPS[@]}"; do TOTAL=$((TOTAL + ${entry#*:})); done
if ((TOTAL > BUDGET)); then
    echo "error: the steps' caps add up to ${TOTAL}s, over the ${BUDGET}s budget" >&2
    exit 2
fi
: > "$SUMMARY"
cap_of() { for entry in "${CAPS[@]}"; do [ "${entry%%:*}" = "$1" ] && echo "${entry#*:}"; done; }

# step NAME COMMAND...: run under its cap (scaled by CAP_SCALE), log, record the outcome; exit 77 = skipped
step() {
    local name=$1
    shift
    local limit=$(($(cap_of "$name") * CAP_SCALE))
    local t0 rc status
    t0=$(date +%s)
    printf '== %s (cap %ss)\n$ %s\n' "$name" "$limit" "$*" > "$OUT/$name.log"
    timeout --kill-after=10 "$limit" bash -c '"$@"' "$name" "$@" >> "$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=passed ;;
        77) status="skipped ($(tail -n 1 "$OUT/$name.log"))" ;;
        124|137) status="TIMED OUT after ${limit}s" ;;
        *) status="FAILED (exit $rc)" ;;
    esac
    ((rc == 0 || rc == 77)) || FAILED=$((FAILED + 1))
    echo "$name: $status in $(($(date +%s) - t0))s (log: $name.log)" | tee -a "$SUMMARY"
}

install() {
    if ! "$PY" -c "import torch_pruning" 2>/dev/null; then
        local wheels=(.whl/torch_pruning-*.whl)
        if [ -e "${wheels[0]}" ]; then
            "$PY" -m pip install --no-index --no-deps "${wheels[@]}" || return 1
        else
            echo "note: torch_pruning is missing and there is no .whl/torch_pruning-*.whl: the HetDPT+ step is skipped"
        fi
    fi
    "$PY" -m pip install --no-deps --no-build-isolation -e . || return 1
    "$PY" -c "import hetprune; print('hetprune from', hetprune.__file__)"
}

environment() {
    git -C "$ROOT" log -1 --format='commit %H %s' 2>/dev/null
    command -v nvidia-smi >/dev/null && nvidia-smi
    "$PY" - <<'EOF'
import os, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| cpus", os.cpu_count(), "| load", os.getloadavg())
print("cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i}", torch.cuda.get_device_name(i), "capability", torch.cuda.get_device_capability(i),
          "native bf16:", torch.cuda.is_bf16_supported(including_emulation=False))
EOF
}

# DeiT-B dense against the paper's recipe (speed_paper_configs.py), each dtype at each batch size
speed() {
    local dtype batch rc=0
    for dtype in $SPEED_DTYPES; do
        for batch in $SPEED_BATCHES; do
            echo "-- $dtype, batch $batch"
            "$PY" benchmarks/speed_paper_configs.py --device "$DEVICE" --dtype "$dtype" --batch-size "$batch" \
                $SPEED_ARGS --out "$OUT/speed-$dtype-$batch" || rc=1
        done
    done
    return $rc
}

# an ImageFolder of generated JPEGs for the probe: the training step's speed does not depend on what the images show
make_images() {
    "$PY" - "$1" "$2" "$3" "$4" <<'EOF'
import sys
from pathlib import Path
import numpy as np
from PIL import Image
root, size, classes, per_class = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
for split, n in (("train", per_class), ("val", 2)):
    for c in range(classes):
        folder = root / split / f"c{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
print("made", root)
EOF
}

# --plan's probe of the paper recipe's training step (prints images/s and peak memory; nothing trained kept)
probe() {
    local batch=$1 accum=$2
    "$PY" -m hetprune prune --model "$PROBE_MODEL" --model-kwargs "$PROBE_KWARGS" --data "$OUT/images" \
        --config deit-b-paper --amp "$PROBE_AMP" --device "$DEVICE" --budget "$PROBE_BUDGET" --plan \
        --plan-probe "$PROBE_S" \
        --set finetune.teacher="$PROBE_TEACHER" --set finetune.teacher_pretrained=false \
        --set "finetune.teacher_kwargs=$PROBE_KWARGS" --set finetune.batch_size="$batch" \
        --set finetune.accum_steps="$accum" --out "$OUT/probe-$batch" || return 1
    cp "$OUT/probe-$batch.work/plan.json" "$OUT/plan-$batch.json"
}

plus_speed() {
    "$PY" -c "import torch_pruning" 2>/dev/null || { echo "torch_pruning is not installed"; return 77; }
    "$PY" benchmarks/hetdpt_plus_speed.py "$@" --out "$OUT/hetdpt-plus-speed-$DEVICE.md"
}

export -f install environment speed make_images probe plus_speed
export PY ROOT OUT

if [ "$MODE" = --cpu-smoke ]; then
    export PYTHONPATH="$ROOT:$ROOT/plugins${PYTHONPATH:+:$PYTHONPATH}"   # the checkout itself, not an install
    export DEVICE=cpu SPEED_DTYPES="fp32 bf16" SPEED_BATCHES="1 2"
    export SPEED_ARGS="--configs deit_s --repeats 1 --warmup 0 --profile never --threads 1"
    export PROBE_MODEL=deit_tiny_distilled_patch16_224 PROBE_TEACHER=deit_tiny_patch16_224 PROBE_AMP=none PROBE_S=2
    export PROBE_BUDGET=2 PROBE_BATCH=16 PROBE_ACCUM=4   # the accumulated step: 4 x 16
    export PROBE_KWARGS='{"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10}'
    CAP_SCALE=${GPU_CHECK_CAP_SCALE:-2}   # a shared CPU is slower than the GPU these caps are sized for
    "$PY" - "$OUT" <<'EOF' || exit 2
import json, sys
import torch
sys.path.insert(0, "benchmarks")
from speed_paper_configs import pruned_recipe
from hetprune.model.spec import ModelSpec, build
torch.manual_seed(0)
recipe = pruned_recipe("deit_tiny_patch16_224", build(ModelSpec("deit_tiny_patch16_224")))
with open(f"{sys.argv[1]}/deit-tiny-recipe.json", "w") as fh:
    json.dump(recipe.to_dict(), fh)
EOF
    PLUS=(--model deit_tiny_patch16_224 --recipe "$OUT/deit-tiny-recipe.json" --target 0.5 --batch 1 --repeats 1
          --warmup 0 --min-time 0 --threads 1 --device cpu --dtype fp32 --with-width-first)
    make_images "$OUT/images" 32 10 8 > /dev/null || exit 2
    echo "install: skipped (--cpu-smoke runs the checkout on PYTHONPATH)" | tee -a "$SUMMARY"
else
    export DEVICE=cuda SPEED_DTYPES="fp32 bf16" SPEED_BATCHES="64 256" SPEED_ARGS="--configs deit_b"
    export PROBE_MODEL=deit_base_distilled_patch16_224 PROBE_TEACHER=deit_base_patch16_224 PROBE_AMP=bf16 PROBE_S=25
    export PROBE_BUDGET=10 PROBE_BATCH=128 PROBE_ACCUM=8   # the accumulated step: 8 x 128 = 1024
    export PROBE_KWARGS='{"num_classes": 10}'   # ten classes of generated images; the head is 0.01 % of the step
    CAP_SCALE=1
    PLUS=(--device cuda --dtype bf16 --batch 256 1 --repeats 5 --min-time 0.2 --threads 8 --with-depth-only
          --with-width-first)
    step install install
    make_images "$OUT/images" 224 10 110 > /dev/null &   # 1,100 training images: a batch of 1,024 fits in one
    IMAGES=$!
fi

step environment environment
step speed-deitb speed
[ -n "${IMAGES:-}" ] && wait "$IMAGES"
step probe-batch probe "$PROBE_BATCH" 1
step probe-accum probe $((PROBE_BATCH * PROBE_ACCUM)) "$PROBE_ACCUM"
step pytest-cuda "$PY" -m pytest -q -m cuda -p no:cacheprovider --junitxml="$OUT/pytest-cuda.xml"
step hetdpt-plus-speed plus_speed "${PLUS[@]}"

echo "done in $(($(date +%s) - START))s; $FAILED step(s) did not pass; results in $OUT" | tee -a "$SUMMARY"
rm -rf "$OUT/images" "$OUT"/probe-*.work "$OUT"/probe-*/
tar -czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "packed $OUT.tar.gz" | tee -a "$SUMMARY"
exit "$FAILED"
