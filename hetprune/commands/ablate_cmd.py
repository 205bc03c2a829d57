"""Test HetDPT's softest assumption: fit predictors on cheap points, then
fine-tune every feasible split fully and see whether their pick is the best.

    hetprune ablate --budget 12 --seeds 0,1,2
    hetprune ablate --budget 8 --predictors poly,nearest --scorers gate-taylor,taylor,block-influence,random

Writes ablation.json, ablation.md, splits.png (and scorers.png) to --out.
Every fine-tuned split is saved the moment it finishes; rerun with --resume.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from .. import config as config_mod
from ..errors import HetpruneError
from ..plugins import get_registry
from .common import (add_model_arguments, apply_data_options, base_model, data_for, no_empty_folder_on_error,
                     run_device)
from .compare_cmd import int_list
from .prune_cmd import add_budget_arguments, budget_from, latency_batch_sets

HELP = "does the predictor's pick match full fine-tuning? (and which scorer recovers best)"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_budget_arguments(p)
    p.add_argument("--predictors", default=None, metavar="A,B",
                   help="predictors to judge (default: the MAP strategy's, poly)")
    p.add_argument("--scorers", default=None, metavar="A,B,...",
                   help="also compare these scorers at the first predictor's pick, e.g. "
                        "gate-taylor,taylor,block-influence,random")
    p.add_argument("--strategy", default="hetdpt", metavar="NAME",
                   help="the strategy whose cheap MAP points are used (default hetdpt)")
    p.add_argument("--seeds", default="0", metavar="0,1,2")
    p.add_argument("--tolerance", type=float, default=0.3, metavar="POINTS", help="a pick within this many points of the best counts "
                                                               "as right (default 0.3)")
    g = p.add_argument_group("settings")
    g.add_argument("--config", metavar="FILE")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--scorer", metavar="NAME", help="scorer of the ground-truth splits (default gate-taylor)")
    g.add_argument("--device", metavar="auto|cpu|cuda|cuda:N", help="as for prune (default cpu)")
    g.add_argument("--amp", metavar="auto|bf16|fp16|none", help="as for prune (default auto)")
    g.add_argument("--cost-model", metavar="auto|macs|latency", help="what --target-speedup counts (as for prune)")
    g.add_argument("--latency-batch", type=int, metavar="N", help="as for prune (default 64)")
    g.add_argument("--resume", action="store_true", help="reuse finished splits and points in --out")
    g.add_argument("--overwrite", action="store_true", help="start over in an --out holding an earlier ablation")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="fine-tune N splits at once (processes)")
    p.add_argument("--out", default="runs/ablate", metavar="DIR")


def run(args) -> int:
    with no_empty_folder_on_error(args.out):  # a budget the model cannot meet leaves no folder behind
        return _run(args)


def _run(args) -> int:
    from .. import devices
    from .. import distributed as dist
    from ..ablate import markdown, mean_by_pair, predictor_metrics, split_plans, write
    from ..compare import mean_std, prepare_out, run_rows
    from ..pipeline import PruneJob
    from ..train import evaluate_dataset

    registry = get_registry()
    strategy = registry.build("strategy", args.strategy)
    if not (hasattr(strategy, "point_plan") and hasattr(strategy, "collect_points")):
        raise HetpruneError(f"strategy {args.strategy!r} has no cheap predictor points (point_plan/collect_points); "
                            "use hetdpt or a strategy built like it")
    section = strategy.name
    budget = budget_from(args)
    if budget is None:
        raise HetpruneError("give a budget: --budget K, --target-macs F, --target-speedup S or --target-latency T")
    settings = config_mod.resolve(getattr(strategy, "defaults", {}), args.config,
                                  {"scorer": args.scorer, "device": args.device, "amp": args.amp,
                                   "cost_model": args.cost_model},
                                  latency_batch_sets(args.latency_batch) + args.set,
                                  types=getattr(strategy, "setting_types", None))
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise HetpruneError(f"--tolerance must be a finite number of points >= 0, got {args.tolerance}")
    device = run_device(settings)
    from .. import cost_model

    budget = cost_model.bind(budget, settings, registry)
    cost_model.refuse_parallel(args.jobs, [budget], settings)
    predictors = [n.strip() for n in (args.predictors or settings[section]["predictor"]).split(",") if n.strip()]
    for name in predictors:
        registry.component("predictor", name)
    scorers = [n.strip() for n in (args.scorers or "").split(",") if n.strip()]
    for name in scorers:
        registry.component("scorer", name)
    seeds = int_list(args.seeds, "--seeds")
    if args.jobs < 1:
        raise HetpruneError(f"--jobs must be >= 1, got {args.jobs}")
    out = Path(args.out)
    prepare_out(out, args.resume, args.overwrite, "ablation")

    dense, model_spec, base_info = base_model(args, device=settings["device"])
    data = data_for(args, dense)
    apply_data_options(args, settings, data)
    devices.place(dense, device)
    base_info["top1"] = evaluate_dataset(dense, data.val, device, workers=settings["finetune"]["workers"],
                                         amp=settings["amp"])
    log = print if dist.is_main() else (lambda msg: None)

    # 1. cheap points, exactly as the strategy collects them (one set per seed)
    points, pairs = [], None
    for seed in seeds:
        s = {**settings, "seed": seed}
        job = PruneJob(dense=dense, spec=model_spec, data=data, budget=budget, settings=s, registry=registry,
                       workdir=out / "work" / f"points-seed{seed}", shared_dir=out / "work" / "shared",
                       base_info=dict(base_info), resume=args.resume, log=log, strategy_name=strategy.name)
        pairs = job.feasible_pairs()
        log(f"cheap points, seed {seed} ...")
        points += strategy.collect_points(job, strategy.point_plan(job, pairs))
    triples = [(p["n_attn"], p["n_act"], p["accuracy"]) for p in points]

    # 2. every predictor on the same points
    fitted = {}
    for name in predictors:
        options = settings[section].get("predictor_options", {}).get(name, {})
        fitted[name] = registry.build("predictor", name, **options).fit(triples)
    first_pick = max(pairs, key=lambda p: (fitted[predictors[0]].predict(*p), -p[0]))

    # 3. ground truth (every split, full schedule) and the scorer rows, resumable
    plans = split_plans(pairs, seeds, settings, budget, base_info["hash"], data.fingerprint, kind="truth",
                        unused=(section,))
    for name in scorers:
        plans += split_plans([first_pick], seeds, settings, budget, base_info["hash"], data.fingerprint,
                             scorer=name, kind="scorer", unused=(section,))
    log(f"fine-tuning {len(plans)} rows: {len(pairs)} splits x {len(seeds)} seeds"
        + (f" + {len(scorers)} scorers at {first_pick}" if scorers else ""))
    rows = run_rows(plans, registry, dense, model_spec, data, base_info, out, resume=args.resume, jobs=args.jobs,
                    data_spec=args.data or "digits")
    if not dist.is_main():
        return 0
    truth_rows = [r for r, p in zip(rows, plans) if p.id.startswith("truth-")]
    true, true_std = mean_by_pair(truth_rows)
    cheap, _ = mean_by_pair([{"n_attn": a, "n_act": m, "top1": acc} for a, m, acc in triples])
    predicted = {name: {p: f.predict(*p) for p in pairs} for name, f in fitted.items()}
    result = {
        "budget": budget.sites if budget.sites is not None else budget.describe(), "seeds": seeds, "dense_top1": base_info["top1"],
        "command": "hetprune " + " ".join(shlex.quote(a) for a in args.argv),
        "finetune": settings["finetune"], "short_finetune": settings["short_finetune"], "points": points,
        "point_finetune": points[0].get("point_finetune", "short_finetune") if points else "short_finetune",
        "point_selection": settings[section].get("point_selection", "oneshot"), "scorer": settings["scorer"],
        "predictors": {name: {**predictor_metrics(predicted[name], true, args.tolerance),
                              "fit": f.fit_report() if hasattr(f, "fit_report") else {}}
                       for name, f in fitted.items()},
        "splits": [{"n_attn": a, "n_act": m, "true": true[(a, m)], "true_std": true_std[(a, m)],
                    "cheap": cheap.get((a, m)), "predicted": {n: predicted[n][(a, m)] for n in predictors}}
                   for a, m in sorted(pairs)],
        "rows": rows,
    }
    if scorers:
        result["scorer_split"] = list(first_pick)
        result["scorers"] = {}
        for name in scorers:
            mine = [r for r, p in zip(rows, plans) if p.id.startswith("scorer-") and p.settings["scorer"] == name]
            top1, top1_std = mean_std([r["top1"] for r in mine])
            result["scorers"][name] = {"top1": top1, "top1_std": top1_std,
                                       "before": mean_std([r["top1_before_finetune"] for r in mine])[0],
                                       "sites": mine[0]["sites"]}
    write(out, result)
    print()
    print(markdown(result))
    print(f"wrote {out}/ablation.json, ablation.md, splits.png" + (", scorers.png" if scorers else ""))
    return 0
