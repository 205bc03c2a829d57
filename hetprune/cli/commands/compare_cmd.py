"""Compare strategies with everything else held equal.

    hetprune compare                      # the embedded digit-grid ViT at an equal MAC target
    hetprune compare --target-macs 0.55,0.45 --seeds 0,1,2
    hetprune compare --data digits --strategies hetdpt,attn-only,act-only,mix50 --budgets 8,12

Every strategy gets the same dense model, train/val split, settings, seeds and
timer. Writes results.md, results.csv, results.json and pareto.png to --out.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ...core.errors import HetpruneError
from ...core.plugins import get_registry
from .common import add_model_arguments, base_and_data, print_plan
from .prune_cmd import (add_budget_arguments, add_reuse_older_argument, add_settings_arguments, budget_from,
                        settings_options)

HELP = "run several strategies under one harness and tabulate/plot the results"
# the benchmark with a ViT's token count that shows the recovery asymmetry (docs/results/observations.md)
DEFAULT_DATA = "digit-grid"
# each embedded benchmark's MAC target, chosen by benchmarks/default_target.py (benchmarks/results/default-target*.md)
DEFAULT_TARGETS = {"digit-pairs": 0.45, "digit-grid": 0.45}
DEFAULT_TARGET_MACS = DEFAULT_TARGETS[DEFAULT_DATA]


def default_target(data: str | None) -> float:
    """The MAC target a compare on ``data`` gets without a budget option (another data set: the default's)."""
    return DEFAULT_TARGETS.get(data or DEFAULT_DATA, DEFAULT_TARGET_MACS)


def int_list(text: str, what: str) -> list[int]:
    """A comma list of whole numbers, each given once."""
    from ...harness.compare import distinct

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise HetpruneError(f"{what} must be a comma list of whole numbers, got {text!r}") from None
    if not values:
        raise HetpruneError(f"{what} is empty")
    return distinct(values, what)


def compare_budgets(args) -> list:
    """The rows' budgets: ``--budgets`` (sites), a comma list of ``--target-macs``, one other target, or by
    default every strategy at the same MAC target, so that rows cost alike and their accuracies compare."""
    from ...pruning.budget import Budget, parse_macs
    from ...harness.compare import distinct

    if args.budgets:
        return [budget_from(args, k) for k in int_list(args.budgets, "--budgets")]
    if args.target_macs is not None:
        values = [v for v in args.target_macs.split(",") if v.strip()]
        if not values:
            raise HetpruneError("--target-macs is empty")
        return distinct([Budget(target_macs=parse_macs(v)) for v in values], "--target-macs")
    return [budget_from(args) or Budget(target_macs=default_target(compare_data(args)))]


def compare_data(args) -> str | None:
    """``--data``, or for the embedded default the digit grid (see `DEFAULT_DATA`)."""
    return DEFAULT_DATA if args.model is None and args.data is None else args.data


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--strategies", default=None, metavar="A,B,...",
                   help="strategies to compare (default hetdpt,attn-only,act-only,mix50)")
    add_budget_arguments(p, many=True, default=f" (default {DEFAULT_TARGET_MACS:g}: every strategy at the same cost)")
    p.add_argument("--seeds", default="0", metavar="0,1,2", help="seeds; several give mean ± std (default 0)")
    add_settings_arguments(p)
    add_reuse_older_argument(p.add_argument_group("rows of an older release"))
    p.add_argument("--batch-sizes", default="1,256", metavar="1,256",
                   help="batch sizes for timing: the smallest and largest are reported")
    p.add_argument("--speed-budget", type=float, default=15.0, metavar="S",
                   help="seconds per batch size the timer may add until every speedup is known within ±2%% "
                        "(default 15; 0: the fixed rounds only)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run N rows at once in single-threaded processes (default 1; try the core count)")
    p.add_argument("--out", default="runs/compare", metavar="DIR", help="output folder (default runs/compare)")


def run(args) -> int:
    from ...core.io import no_empty_folder_on_error

    with no_empty_folder_on_error(args.out):  # a budget the model cannot meet leaves no folder behind
        return _run(args)


def _run(args) -> int:
    """Parse the options, build the model and its Task, and call [`hetprune.compare`][hetprune.harness.compare.compare]."""
    from ...core import distributed as dist
    from ...harness.compare import COMPARE_FOLDER, DEFAULT_STRATEGIES, compare
    from ...pruning.run_start import probe_for, start_run
    from ...training.task import classification

    registry = get_registry()
    probe_for(args.plan, args.plan_probe)   # refused before the base model is built or trained
    names = [s.strip() for s in (args.strategies or ",".join(DEFAULT_STRATEGIES)).split(",") if s.strip()]
    if len(set(names)) != len(names):
        raise HetpruneError(f"--strategies lists a strategy twice: {names}")
    strategies = [registry.build("strategy", n) for n in names]
    budgets = compare_budgets(args)
    defaulted, args.data = args.data is None and args.model is None, compare_data(args)
    seeds = int_list(args.seeds, "--seeds")
    batch_sizes = int_list(args.batch_sizes, "--batch-sizes")
    start = start_run(strategies, budgets, folder=COMPARE_FOLDER, out=args.out, resume=args.resume,
                      reuse_older=args.reuse_older,
                      overwrite=args.overwrite, registry=registry, **settings_options(args, strategies), plan=args.plan)
    dense, model_spec, base_info, data = base_and_data(args, start, "compare", defaulted)
    command = "hetprune " + " ".join(shlex.quote(a) for a in args.argv)
    result = compare(dense, classification(data), names, budgets, seeds, start=start, out=args.out,
                     batch_sizes=batch_sizes, speed_budget_s=args.speed_budget, jobs=args.jobs,
                     spec=model_spec, base_info=base_info, data_spec=args.data or "digits",
                     meta={"model": model_spec.label() if args.model else base_info["source"], "command": command},
                     plan=args.plan, plan_probe=args.plan_probe)
    if args.plan:
        return print_plan(result, Path(args.out) / "work")
    if not dist.is_main():
        return 0
    print()
    print(result.markdown)
    print(f"wrote {args.out}/results.md, results.csv, results.json, pareto.png")
    return 0
