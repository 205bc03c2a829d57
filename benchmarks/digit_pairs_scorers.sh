#!/bin/bash
# Reproduce benchmarks/results/digit-pairs-scorers-b12-5+7.md (the lines it prints are the table's data):
# the within-kind scorers at the split 5+7 of budget 12 on digit-pairs, seeds 0, 1, 2, default full fine-tune.
# `--strategy mix --set mix.ratio=0.42` makes 5 of the 12 removals attention sites.
#   OMP_NUM_THREADS=1 bash benchmarks/digit_pairs_scorers.sh
set -e
out=${OUT:-runs/digit-pairs-scorers57}
mkdir -p "$out"
for scorer in gate-taylor random taylor block-influence; do
  for seed in 0 1 2; do
    python -m hetprune prune --data digit-pairs --strategy mix --set mix.ratio=0.42 --budget 12 --scorer "$scorer" \
      --set seed="$seed" --out "$out/$scorer-seed$seed" --overwrite > "$out/$scorer-seed$seed.log" 2>&1
    python -c "import json;r=json.load(open('$out/$scorer-seed$seed/report.json'));print('$scorer', $seed, r['n_attn'], r['n_act'], round(r['top1_before_finetune'],2), round(r['top1'],2), ' '.join(r['sites']))"
  done
done
