#!/usr/bin/env bash
# The GPU check: what a user needs to know first, in at most 5.6 minutes on one GPU, in this order:
#   1. install this project (torch-pruning is optional: without it only the HetDPT+ step is skipped);
#   2. the machine: GPU, driver, torch, CPUs;
#   3. speed: DeiT-B dense against the paper's pruned recipe in fp32 (TF32 off and on), bf16 autocast, bf16
#      weights and bf16 weights compiled, at batch 256 (benchmarks/gpu_speed.py);
#   4. the loader alone: images/s per worker with the paper's augmentations on ImageNet-sized JPEGs, hetprune's
#      against timm's own pipeline (benchmarks/loader_throughput.py);
#   5. the probe of `--plan` on DeiT-B with the paper's recipe (student + teacher, bf16, batch 128): the
#      training step alone, the loader alone, the two together, and which one bounds the run;
#   6. the CUDA tests (pytest -m cuda); 7. HetDPT+ speed (needs torch-pruning).
#
#   bash scripts/gpu-check.sh RESULTS_DIR              # on a GPU machine; RESULTS_DIR.tar.gz holds everything
#   bash scripts/gpu-check.sh RESULTS_DIR --cpu-smoke  # the same steps, tiny and on the CPU: checks the script
#
# Offline: needs python3 with torch, timm, pluggy, safetensors, scikit-learn, scipy, matplotlib, pyyaml, tqdm
# and pillow. torch-pruning is installed from .whl/torch_pruning-*.whl when it is missing and a wheel is there
# (fetch it beforehand: pip download --no-deps torch-pruning==1.6.1 -d .whl/). Each step has a cap; the caps
# add up to at most the budget (GPU_CHECK_BUDGET_S, default 335), so no step is starved by an earlier one.
# Every step logs to RESULTS_DIR/<step>.log and writes its results as JSON (and Markdown) there; a failing
# step does not stop the others. summary.txt is one table: each step's outcome and what it measured. The
# folder holds logs and JSON only (no weights, no images): RESULTS_DIR.tar.gz is well under a megabyte.
# The exit status is the number of steps that did not pass (a skipped step is not a failure).
set -u

OUT=${1:?usage: bash scripts/gpu-check.sh RESULTS_DIR [--cpu-smoke]}
MODE=${2:-gpu}
case "$MODE" in gpu|--cpu-smoke) ;; *) echo "error: unknown option $MODE; allowed: --cpu-smoke" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-335}
START=$(date +%s)
STEPS="$OUT/steps.tsv"
FAILED=0
export HETPRUNE_NO_PROGRESS=1 PYTHONUNBUFFERED=1

# name:cap in seconds, in the order they run; the caps must fit the budget (checked before anything runs). Sized
# by the run on one H200 (benchmarks/results/gpu-h200.md): install 18 s, environment 4 (over 10 on a fresh
# machine: the first import of torch), speed 67 (at batch 64 and 256), loader 34, probe 54, pytest 76, HetDPT+ 34
CAPS=(install:25 environment:15 speed:70 loader:40 probe:60 pytest-cuda:85 hetdpt-plus-speed:40)
TOTAL=0
for entry in "${CAPS[@]}"; do TOTAL=$((TOTAL + ${entry#*:})); done
if ((TOTAL > BUDGET)); then
    echo "error: the steps' caps add up to ${TOTAL}s, over the ${BUDGET}s budget" >&2
    exit 2
fi
: > "$STEPS"
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
        77) status="skipped: $(tail -n 1 "$OUT/$name.log")" ;;
        124|137) status="TIMED OUT after ${limit}s" ;;
        *) status="FAILED (exit $rc)" ;;
    esac
    ((rc == 0 || rc == 77)) || FAILED=$((FAILED + 1))
    printf '%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" >> "$STEPS"
    echo "$name: $status in $(($(date +%s) - t0))s"
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
    # a copy without .git (a snapshot sent to a GPU machine) names its commit in GPU_CHECK_COMMIT
    git -C "$ROOT" log -1 --format='commit %H %s' 2>/dev/null || echo "commit ${GPU_CHECK_COMMIT:-unknown}"
    command -v nvidia-smi >/dev/null && nvidia-smi
    "$PY" - "$OUT/environment.json" <<'EOF'
import json, os, platform, sys
import torch
gpus = [{"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i)),
         "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2 ** 30, 1),
         "native_bf16": torch.cuda.is_bf16_supported(including_emulation=False)}
        for i in range(torch.cuda.device_count())]
env = {"commit": os.environ.get("GPU_CHECK_COMMIT"), "python": platform.python_version(), "torch": torch.__version__,
       "cuda": torch.version.cuda,
       "cpus": os.cpu_count(), "load": os.getloadavg(), "gpus": gpus}
print(json.dumps(env, indent=1))
with open(sys.argv[1], "w") as fh:
    json.dump(env, fh, indent=1)
EOF
}

# JPEGs of photographs' size and detail for the loader and the probe (their speed depends on the files' size
# and content, not on what they show): smooth colour fields with noise, JPEG quality 90
make_images() {
    "$PY" - "$1" "$2" "$3" "$4" <<'EOF'
import sys
from pathlib import Path
import numpy as np
from PIL import Image
root, per_class, classes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
width, height = (int(v) for v in sys.argv[4].split("x"))
rng = np.random.default_rng(0)
yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
for split, n in (("train", per_class), ("val", 2)):
    for c in range(classes):
        folder = root / split / f"c{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            a, b, phase = rng.uniform(2, 12, 3)
            base = np.stack([np.sin(a * xx + phase + k) * np.cos(b * yy - k) for k in range(3)], -1) * 90 + 128
            pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
EOF
}

loader_step() {
    [ -f benchmarks/loader_throughput.py ] || { echo "benchmarks/loader_throughput.py is not here"; return 77; }
    "$PY" benchmarks/loader_throughput.py "$@"
}

# --plan's probe of the paper recipe's training step (prints three rates and the bound; nothing trained kept)
probe() {
    "$PY" -m hetprune prune --model "$PROBE_MODEL" --model-kwargs "$PROBE_KWARGS" --data "$IMAGES" \
        --config deit-b-paper --amp "$PROBE_AMP" --device "$DEVICE" --budget "$PROBE_BUDGET" --plan \
        --plan-probe "$PROBE_S" --workers "$PROBE_WORKERS" \
        --set finetune.teacher="$PROBE_TEACHER" --set finetune.teacher_pretrained=false \
        --set "finetune.teacher_kwargs=$PROBE_KWARGS" --set finetune.batch_size="$PROBE_BATCH" \
        --set finetune.accum_steps=1 --out "$OUT/probe" || return 1
    cp "$OUT/probe.work/plan.json" "$OUT/plan.json"
}

plus_speed() {
    "$PY" -c "import torch_pruning" 2>/dev/null || { echo "torch_pruning is not installed"; return 77; }
    "$PY" benchmarks/hetdpt_plus_speed.py "$@" --out "$OUT/hetdpt-plus-speed-$DEVICE.md"
}

export -f install environment make_images loader_step probe plus_speed
export PY ROOT OUT

if [ "$MODE" = --cpu-smoke ]; then
    export PYTHONPATH="$ROOT:$ROOT/plugins${PYTHONPATH:+:$PYTHONPATH}"   # the checkout itself, not an install
    export DEVICE=cpu IMAGES="$OUT/images"
    SPEED=(--device cpu --model deit_tiny_patch16_224 --modes fp32,bf16-weights --batches 1,2 --repeats 1
           --warmup 1 --min-time 0)
    LOADER=(--images "$IMAGES" --augment paper --workers 1 --pipelines timm,hetprune --seconds 1 --rounds 1
            --warmup 1 --batch-size 8)
    export PROBE_MODEL=deit_tiny_distilled_patch16_224 PROBE_TEACHER=deit_tiny_patch16_224 PROBE_AMP=none PROBE_S=3
    export PROBE_BUDGET=2 PROBE_BATCH=16 PROBE_WORKERS=1
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
          --warmup 0 --min-time 0 --threads 1 --device cpu --dtype fp32)
    make_images "$IMAGES" 12 10 64x48 || exit 2
    printf 'install\tskipped: --cpu-smoke runs the checkout on PYTHONPATH\t0\n' >> "$STEPS"
else
    export DEVICE=cuda IMAGES="$OUT/images"
    SPEED=(--device cuda --batches 256)
    LOADER=(--images "$IMAGES" --augment paper --workers "1,$(($(nproc) - 1))" --pipelines timm,hetprune --seconds 2
            --rounds 1)
    export PROBE_MODEL=deit_base_distilled_patch16_224 PROBE_TEACHER=deit_base_patch16_224 PROBE_AMP=bf16 PROBE_S=15
    export PROBE_BUDGET=10 PROBE_BATCH=128 PROBE_WORKERS=$(($(nproc) - 1))
    export PROBE_KWARGS='{"num_classes": 10}'   # ten classes of generated images; the head is 0.01 % of the step
    CAP_SCALE=1
    PLUS=(--device cuda --dtype bf16 --batch 256 --repeats 3 --min-time 0.1 --threads 8)
    step install install
    make_images "$IMAGES" 26 10 500x375 &   # 260 ImageNet-sized JPEGs: the loader and the probe repeat them
    MAKING=$!
fi

step environment environment
step speed "$PY" benchmarks/gpu_speed.py "${SPEED[@]}" --out "$OUT"
[ -n "${MAKING:-}" ] && wait "$MAKING"
step loader loader_step "${LOADER[@]}" --results "$OUT" --name loader
step probe probe
# on a GPU, the CUDA tests in 4 processes where pytest-xdist is installed (they took 76 s in one on an H200;
# in four: to be measured)
XDIST=$([ "$MODE" = gpu ] && "$PY" -c "import xdist" 2>/dev/null && echo "-n 4")
step pytest-cuda "$PY" -m pytest -q -m cuda -p no:cacheprovider $XDIST --junitxml="$OUT/pytest-cuda.xml"
step hetdpt-plus-speed plus_speed "${PLUS[@]}"

rm -rf "$OUT/images" "$OUT/probe.work" "$OUT/probe"
"$PY" scripts/gpu_check_summary.py "$OUT" "$(($(date +%s) - START))" | tee "$OUT/summary.txt"
tar -czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "packed $OUT.tar.gz"
exit "$FAILED"
