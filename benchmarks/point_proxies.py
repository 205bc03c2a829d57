"""Which cheap measurement ranks the splits like the full fine-tune does? (issue 14)

MAP fits its predictor on cheap points. With the paper's one-shot points
(`hetdpt.point_selection=oneshot`) a point removes its sites at once and gets
a short fine-tune; with gradual points (`gradual`) a point is what the run's own
selector (gate-taylor: one site off per epoch of gate training) makes of the
split. An ablation's ground truth already holds the second for every split
and seed: a truth row's `top1_before_finetune` is exactly the gradual point of
that split and seed. So, from committed `hetprune ablate` results alone (no
training), this script reports per budget:

* Spearman rank correlation with the true mean top-1 of the splits, for the
  one-shot points (where measured) and for each seed's gradual values;
* the split each seed's gradual values pick (their argmax: what MAP could do
  with every split measured) and its regret against the truth's mean, and
  held out: against the mean of the other seeds only, since the truth of seed s
  contains the very run that made seed s's value.

    python benchmarks/point_proxies.py benchmarks/results/digit-pairs-ablate-b12.json ...

Writes benchmarks/results/point-proxies.md (``--out`` changes it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from scipy.stats import spearmanr
from studylib.files import write
from studylib.tables import table

ROOT = Path(__file__).resolve().parent.parent


def study(path: Path) -> dict:
    d = json.loads(path.read_text())
    rows = [r for r in d["rows"] if str(r["id"]).startswith("truth-")]
    seeds = sorted({r["seed"] for r in rows})
    splits = sorted({(r["n_attn"], r["n_act"]) for r in rows})
    top1 = {(r["n_attn"], r["n_act"], r["seed"]): r["top1"] for r in rows}
    before = {(r["n_attn"], r["n_act"], r["seed"]): r["top1_before_finetune"] for r in rows}
    true = {s: statistics.mean(top1[s + (k,)] for k in seeds) for s in splits}
    best = max(splits, key=lambda s: (true[s], -s[0]))
    cheap = {(s["n_attn"], s["n_act"]): s["cheap"] for s in d["splits"] if s.get("cheap") is not None}
    out = {"file": str(path), "budget": d["budget"], "seeds": seeds, "best": best, "best_true": true[best],
           "oneshot_spearman": spearmanr([cheap[s] for s in cheap], [true[s] for s in cheap])[0]
           if len(cheap) > 2 else None, "oneshot_count": len(cheap), "gradual": []}
    for k in seeds:
        values = {s: before[s + (k,)] for s in splits}
        pick = max(splits, key=lambda s: (values[s], -s[0]))
        others = [j for j in seeds if j != k]
        held = {s: statistics.mean(top1[s + (j,)] for j in others) for s in splits} if others else None
        out["gradual"].append({
            "seed": k, "spearman": spearmanr([values[s] for s in splits], [true[s] for s in splits])[0],
            "pick": pick, "regret": true[best] - true[pick],
            "held_out_regret": max(held.values()) - held[pick] if held else None})
    return out


def markdown(results: list[dict], command: str) -> str:
    lines = ["# Cheap points against the ground truth: one-shot or gradual?", "", f"Command: `{command}`", "",
             "Per committed ablation (every split fine-tuned fully; seeds as listed): the rank correlation of the "
             "one-shot MAP points (short fine-tune) with the true mean top-1, and for each seed the rank "
             "correlation, argmax and regret of the gradual values (gate-taylor's selection of that split, before "
             "the final fine-tune). Held-out regret: against the mean of the other seeds. No training: read "
             "from the ablations' rows.", ""]
    rows = []
    for r in results:
        g = r["gradual"]
        one = f"{r['oneshot_spearman']:.2f} ({r['oneshot_count']})" if r["oneshot_spearman"] is not None else "-"
        rows.append([Path(r["file"]).name, r["budget"], f"{r['best'][0]}+{r['best'][1]} ({r['best_true']:.2f})", one,
                     ", ".join(f"{x['spearman']:.2f}" for x in g), ", ".join(f"{x['pick'][0]}+{x['pick'][1]}" for x in g),
                     ", ".join(f"{x['regret']:.2f}" for x in g),
                     ", ".join("-" if x["held_out_regret"] is None else f"{x['held_out_regret']:.2f}" for x in g)])
    lines += table(["ablation", "budget", "best split (true %)", "one-shot points: Spearman (points)",
                    "gradual: Spearman per seed", "gradual picks", "regret per seed", "held-out regret per seed"], rows)
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ablations", nargs="+", help="ablation.json files of `hetprune ablate`")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "point-proxies.md"))
    args = p.parse_args()
    command = "python benchmarks/point_proxies.py " + shlex.join(sys.argv[1:])
    results = [study(Path(f)) for f in args.ablations]
    md = markdown(results, command)
    out = Path(args.out)
    write(out.parent, out.stem, {"command": command, "results": results}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
