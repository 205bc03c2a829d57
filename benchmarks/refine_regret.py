"""Regret of hetdpt's allocation (predictor x refinement rounds) against an ablation's ground truth.

`hetprune ablate` fits predictors on the one-shot cheap points only; MAP
refinement (`hetdpt.refine`) measures more cheap points after the fit, so its
pick is taken here from `hetprune prune --strategy hetdpt` itself, one run per
seed, and looked up in the ground truth (every split fine-tuned fully, mean
over the ablation's seeds). Only the allocation matters, so the runs skip the
gate phase and the final fine-tune (`--scorer magnitude`,
`finetune.epochs=0`): neither changes the split.

    python benchmarks/refine_regret.py --data digit-pairs --truth runs/digit-pairs-ablate/b12/ablation.json \\
        --predictors poly,local --refine 0,2 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="digits")
    p.add_argument("--truth", required=True, help="ablation.json of `hetprune ablate` at the budget to study")
    p.add_argument("--predictors", default="poly,local")
    p.add_argument("--refine", default="0,2", help="refinement rounds to compare")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more settings for every prune, e.g. short_finetune.subset=300")
    p.add_argument("--tag", default="", help="suffix of the result files, for a variant run")
    p.add_argument("--out", default=None, help="default runs/<data>-refine-b<K>")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()

    from hetprune.cli import main as cli

    truth = json.loads(Path(args.truth).read_text())
    budget = truth["budget"]["sites"] if isinstance(truth["budget"], dict) else int(truth["budget"])
    true = {(s["n_attn"], s["n_act"]): s["true"] for s in truth["splits"]}
    best = max(true, key=lambda k: true[k])
    out = Path(args.out or f"runs/{args.data}-refine-b{budget}" + (f"-{args.tag}" if args.tag else ""))
    command = "python benchmarks/refine_regret.py " + shlex.join(sys.argv[1:])
    load_before = os.getloadavg()
    runs = []
    for predictor in args.predictors.split(","):
        for refine in [int(r) for r in args.refine.split(",")]:
            for seed in [int(s) for s in args.seeds.split(",")]:
                folder = out / f"{predictor}-refine{refine}-seed{seed}"
                argv = ["prune", "--data", args.data, "--strategy", "hetdpt", "--budget", str(budget),
                        "--predictor", predictor, "--set", f"hetdpt.refine={refine}", "--set", f"seed={seed}",
                        "--scorer", "magnitude", "--set", "finetune.epochs=0", "--out", str(folder), "--overwrite"]
                for item in args.set:
                    argv += ["--set", item]
                start = time.time()
                rc = cli(argv)
                if rc:
                    return rc
                alloc = json.loads((folder / "report.json").read_text())["allocation"]
                pick = (alloc["pick"]["n_attn"], alloc["pick"]["n_act"])
                extra = sum(len(r["measured"]) for r in alloc.get("refinement", []))
                runs.append({"predictor": predictor, "refine": refine, "seed": seed, "pick": list(pick),
                             "true_of_pick": true[pick], "regret": true[best] - true[pick],
                             "points": len(alloc["points"]), "refinement_points": extra,
                             "seconds": round(time.time() - start, 1), "command": "hetprune " + shlex.join(argv)})
                print(f"{predictor} refine={refine} seed={seed}: pick {pick[0]}+{pick[1]}, "
                      f"true {true[pick]:.2f}, regret {true[best] - true[pick]:.2f}", flush=True)
    load_after = os.getloadavg()
    lines = [f"# Allocation regret on the embedded {args.data} ViT, budget {budget}", "",
             f"Produced by `{command}`: one `hetprune prune --strategy hetdpt` per predictor, refinement rounds "
             f"and seed (gate phase and final fine-tune skipped: they do not change the split), each pick looked "
             f"up in the ground truth of `{truth.get('command') or args.truth}` (every split fine-tuned fully, "
             f"mean over seeds {truth.get('seeds')}). Best split {best[0]}+{best[1]} at {true[best]:.2f} %. "
             f"Load average (1, 5, 15 min) {' '.join(f'{x:.2f}' for x in load_before)} at the start, "
             f"{' '.join(f'{x:.2f}' for x in load_after)} at the end.", "",
             "| predictor | refine | picks (seeds) | true top-1 of the picks % | mean regret (points) | "
             "extra cheap points |", "|---|---|---|---|---|---|"]
    for predictor in args.predictors.split(","):
        for refine in [int(r) for r in args.refine.split(",")]:
            rs = [r for r in runs if r["predictor"] == predictor and r["refine"] == refine]
            lines.append(f"| {predictor} | {refine} | {', '.join(f'{a}+{m}' for a, m in (r['pick'] for r in rs))} | "
                         f"{', '.join(format(r['true_of_pick'], '.2f') for r in rs)} | "
                         f"{statistics.mean(r['regret'] for r in rs):.2f} | "
                         f"{statistics.mean(r['refinement_points'] for r in rs):.1f} |")
    results = Path(args.results)
    name = f"{args.data}-refine-b{budget}" + (f"-{args.tag}" if args.tag else "")
    (results / f"{name}.md").write_text("\n".join(lines) + "\n")
    (results / f"{name}.json").write_text(json.dumps({"command": command, "budget": budget, "best": list(best),
                                                      "true": {f"{a}+{m}": v for (a, m), v in true.items()},
                                                      "runs": runs, "load_before": load_before,
                                                      "load_after": load_after}, indent=2) + "\n")
    print(f"wrote {results}/{name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
