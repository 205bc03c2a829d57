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

from ...core.errors import HetpruneError
from ...core.plugins import get_registry
from .common import add_model_arguments, base_and_data, print_plan
from .compare_cmd import int_list
from .prune_cmd import add_budget_arguments, add_plan_arguments, add_reuse_older_argument, budget_from, settings_options

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
    g.add_argument("--device", metavar="auto|cpu|cuda|cuda:N", help="as for prune (default auto)")
    g.add_argument("--amp", metavar="auto|bf16|fp16|none", help="as for prune (default auto)")
    g.add_argument("--cost-model", metavar="auto|macs|latency", help="what --target-speedup counts (as for prune)")
    g.add_argument("--latency-batch", type=int, metavar="N", help="as for prune (default 64)")
    g.add_argument("--resume", action="store_true", help="reuse finished splits and points in --out")
    add_reuse_older_argument(g)
    g.add_argument("--overwrite", action="store_true", help="start over in an --out holding an earlier ablation")
    add_plan_arguments(g)
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="fine-tune N splits at once (processes)")
    p.add_argument("--out", default="runs/ablate", metavar="DIR")


def run(args) -> int:
    from ...core.io import no_empty_folder_on_error

    with no_empty_folder_on_error(args.out):  # a budget the model cannot meet leaves no folder behind
        return _run(args)


def _run(args) -> int:
    """Parse the options, build the model and its Task, and call [`hetprune.ablate`][hetprune.harness.ablate.ablate]."""
    from ...core import distributed as dist
    from ...harness.ablate import ABLATION_FOLDER, ablate, markdown
    from ...pruning.run_start import probe_for, start_run
    from ...training.task import classification

    registry = get_registry()
    probe_for(args.plan, args.plan_probe)   # refused before the base model is built or trained
    strategy = registry.build("strategy", args.strategy)
    budget = budget_from(args)
    if budget is None:
        raise HetpruneError("give a budget: --budget K, --target-macs F, --target-speedup S or --target-latency T")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise HetpruneError(f"--tolerance must be a finite number of points >= 0, got {args.tolerance}")
    start = start_run([strategy], [budget], folder=ABLATION_FOLDER, out=args.out, resume=args.resume,
                      reuse_older=args.reuse_older,
                      overwrite=args.overwrite, registry=registry, **settings_options(args, [strategy]), plan=args.plan)
    predictors = [n.strip() for n in (args.predictors or "").split(",") if n.strip()] or None
    scorers = [n.strip() for n in (args.scorers or "").split(",") if n.strip()]
    seeds = int_list(args.seeds, "--seeds")
    for name in (predictors or []):
        registry.component("predictor", name)   # unknown names fail before the base model is trained
    for name in scorers:
        registry.component("scorer", name)
    dense, model_spec, base_info, data = base_and_data(args, start, "ablate")
    command = "hetprune " + " ".join(shlex.quote(a) for a in args.argv)
    result = ablate(dense, classification(data), strategy.name, budget, seeds, predictors=predictors,
                    scorers=scorers, tolerance=args.tolerance, start=start, out=args.out, jobs=args.jobs,
                    spec=model_spec, base_info=base_info, data_spec=args.data or "digits", meta={"command": command},
                    plan=args.plan, plan_probe=args.plan_probe)
    if args.plan:
        return print_plan(result, Path(args.out) / "work")
    if not dist.is_main():
        return 0
    print()
    print(markdown(result))
    print(f"wrote {args.out}/ablation.json, ablation.md, splits.png" + (", scorers.png" if scorers else ""))
    return 0
