"""Regret of hetdpt's allocation (predictor x refinement rounds) against an ablation's ground truth.

`hetprune ablate` fits predictors on the one-shot cheap points only; MAP
refinement (`hetdpt.refine`) measures more cheap points after the fit, so its
pick is taken here from `hetprune prune --strategy hetdpt` itself, one run per
seed, and looked up in the ground truth (every split fine-tuned fully, mean
over the ablation's seeds; and, held out, mean over the other seeds only,
since with `hetdpt.point_selection=gradual` a point of seed s is the truth
run of seed s before its fine-tune). Only the allocation matters, so the runs
skip the final fine-tune (`finetune.epochs=0`) and, unless `--scorer` says
otherwise, the gate phase (`--scorer magnitude`): neither changes the split
of one-shot points. Gradual points are made by the run's scorer: give
`--scorer gate-taylor` with them. Runs of one seed share their MAP points (the
points file is keyed by every setting that shapes a point, so only matching
points are reused).

    python benchmarks/refine_regret.py --data digit-pairs --truth runs/digit-pairs-ablate/b12/ablation.json \\
        --predictors poly,local --refine 0,2 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path

from studylib.files import write
from studylib.machine import load
from studylib.tables import table

ROOT = Path(__file__).resolve().parent.parent


def regret_table(runs: list[dict]) -> list[str]:
    """One row per predictor and refinement rounds, over their seeds, in the order they ran (the results JSON's
    ``runs``)."""
    rows = []
    for predictor, refine in dict.fromkeys((r["predictor"], r["refine"]) for r in runs):
        rs = [r for r in runs if r["predictor"] == predictor and r["refine"] == refine]
        held = (f"{statistics.mean(r['held_out_regret'] for r in rs):.2f}"
                if all(r["held_out_regret"] is not None for r in rs) else "-")
        rows.append([predictor, refine, ", ".join(f"{a}+{m}" for a, m in (r["pick"] for r in rs)),
                     ", ".join(format(r["true_of_pick"], ".2f") for r in rs),
                     f"{statistics.mean(r['regret'] for r in rs):.2f}", held,
                     f"{statistics.mean(r['refinement_points'] for r in rs):.1f}",
                     f"{statistics.mean(r['point_seconds'] for r in rs):.0f}"])
    return table(["predictor", "refine", "picks (seeds)", "true top-1 of the picks %", "mean regret (points)",
                  "held-out regret", "extra cheap points", "MAP points' time (s)"], rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="digits")
    p.add_argument("--truth", required=True, help="ablation.json of `hetprune ablate` at the budget to study")
    p.add_argument("--predictors", default="poly,local")
    p.add_argument("--refine", default="0,2", help="refinement rounds to compare")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more settings for every prune, e.g. short_finetune.subset=300")
    p.add_argument("--scorer", default="magnitude",
                   help="the runs' scorer (magnitude: no gate phase; gradual points need the real one, gate-taylor)")
    p.add_argument("--points", default=None, metavar="FILE",
                   help="a map-points.jsonl to start from (e.g. the ablation's work/shared/map-points.jsonl): its "
                        "points are reused where their key matches, measured otherwise")
    p.add_argument("--tag", default="", help="suffix of the result files, for a variant run")
    p.add_argument("--out", default=None, help="default runs/<data>-refine-b<K>")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()

    from hetprune.cli import main as cli

    truth = json.loads(Path(args.truth).read_text())
    budget = truth["budget"]["sites"] if isinstance(truth["budget"], dict) else int(truth["budget"])
    true = {(s["n_attn"], s["n_act"]): s["true"] for s in truth["splits"]}
    per_seed: dict = {}   # (a, m) -> {seed: top-1} of the truth rows
    for r in truth.get("rows", []):
        if str(r.get("id", "")).startswith("truth-"):
            per_seed.setdefault((r["n_attn"], r["n_act"]), {})[r["seed"]] = r["top1"]

    def held_out(seed: int) -> dict | None:
        """The truth without this seed's own rows (None when the truth has no other seed)."""
        out = {k: statistics.mean(v for s, v in runs_.items() if s != seed) for k, runs_ in per_seed.items()
               if any(s != seed for s in runs_)}
        return out if len(out) == len(true) else None
    best = max(true, key=lambda k: true[k])
    out = Path(args.out or f"runs/{args.data}-refine-b{budget}" + (f"-{args.tag}" if args.tag else ""))
    command = "python benchmarks/refine_regret.py " + shlex.join(sys.argv[1:])
    load_before = load()
    runs = []
    for predictor in args.predictors.split(","):
        for refine in [int(r) for r in args.refine.split(",")]:
            for seed in [int(s) for s in args.seeds.split(",")]:
                folder = out / f"{predictor}-refine{refine}-seed{seed}"
                argv = ["prune", "--data", args.data, "--strategy", "hetdpt", "--budget", str(budget),
                        "--predictor", predictor, "--set", f"hetdpt.refine={refine}", "--set", f"seed={seed}",
                        "--scorer", args.scorer, "--set", "finetune.epochs=0", "--out", str(folder), "--overwrite"]
                points_file = folder.with_name(folder.name + ".work") / "map-points.jsonl"
                earlier = sorted(out.glob(f"*-seed{seed}.work/map-points.jsonl")) or (
                    [Path(args.points)] if args.points else [])
                if earlier and earlier[0] != points_file:   # this seed's points, measured by an earlier run
                    points_file.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(earlier[0], points_file)
                for item in args.set:
                    argv += ["--set", item]
                start = time.time()
                rc = cli(argv)
                if rc:
                    return rc
                alloc = json.loads((folder / "report.json").read_text())["allocation"]
                pick = (alloc["pick"]["n_attn"], alloc["pick"]["n_act"])
                extra = sum(len(r["measured"]) for r in alloc.get("refinement", []))
                held = held_out(seed)
                runs.append({"predictor": predictor, "refine": refine, "seed": seed, "pick": list(pick),
                             "true_of_pick": true[pick], "regret": true[best] - true[pick],
                             "held_out_regret": None if held is None else max(held.values()) - held[pick],
                             "point_seconds": round(sum(p.get("seconds", 0) for p in alloc["points"]), 1),
                             "points": len(alloc["points"]), "refinement_points": extra,
                             "seconds": round(time.time() - start, 1), "command": "hetprune " + shlex.join(argv)})
                print(f"{predictor} refine={refine} seed={seed}: pick {pick[0]}+{pick[1]}, "
                      f"true {true[pick]:.2f}, regret {true[best] - true[pick]:.2f}", flush=True)
    load_after = load()
    lines = [f"# Allocation regret on the embedded {args.data} ViT, budget {budget}", "",
             f"Produced by `{command}`: one `hetprune prune --strategy hetdpt` per predictor, refinement rounds "
             f"and seed (gate phase and final fine-tune skipped: they do not change the split), each pick looked "
             f"up in the ground truth of `{truth.get('command') or args.truth}` (every split fine-tuned fully, "
             f"mean over seeds {truth.get('seeds')}). Best split {best[0]}+{best[1]} at {true[best]:.2f} %. "
             f"Load average (1, 5, 15 min) {' '.join(f'{x:.2f}' for x in load_before)} at the start, "
             f"{' '.join(f'{x:.2f}' for x in load_after)} at the end.", "",
             "Held-out regret: against the mean of the truth's other seeds (the run's own seed left out).", "",
             *regret_table(runs)]
    name = f"{args.data}-refine-b{budget}" + (f"-{args.tag}" if args.tag else "")
    results = write(args.results, name, {"command": command, "budget": budget, "best": list(best),
                                         "true": {f"{a}+{m}": v for (a, m), v in true.items()}, "runs": runs,
                                         "load_before": load_before, "load_after": load_after},
                    "\n".join(lines), echo=False)
    print(f"wrote {results}/{name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
