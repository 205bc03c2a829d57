"""Compare strategies with everything else held equal.

    hetprune compare                      # the embedded default (digits ViT)
    hetprune compare --strategies hetdpt,attn-only,act-only,mix50 --budgets 8,12 --seeds 0,1,2

Every strategy gets the same dense model, train/val split, settings, seeds and
timer. Writes results.md, results.csv, results.json and pareto.png to --out.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from .. import config as config_mod
from ..errors import HetpruneError
from ..plugins import get_registry
from .common import (add_model_arguments, apply_data_options, base_model, data_for, no_empty_folder_on_error,
                     run_device)
from .prune_cmd import (add_budget_arguments, add_settings_arguments, budget_from, latency_batch_sets, predictor_sets,
                        round_to_sets)

HELP = "run several strategies under one harness and tabulate/plot the results"
DEFAULT_BUDGETS = (12,)


def int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise HetpruneError(f"{what} must be a comma list of whole numbers, got {text!r}") from None
    if not values:
        raise HetpruneError(f"{what} is empty")
    return values


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--strategies", default=None, metavar="A,B,...",
                   help="strategies to compare (default hetdpt,attn-only,act-only,mix50)")
    add_budget_arguments(p, many=True)
    p.add_argument("--seeds", default="0", metavar="0,1,2", help="seeds; several give mean ± std (default 0)")
    add_settings_arguments(p)
    p.add_argument("--batch-sizes", default="1,256", metavar="1,256",
                   help="batch sizes for timing: the smallest and largest are reported")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run N rows at once in single-threaded processes (default 1; try the core count)")
    p.add_argument("--out", default="runs/compare", metavar="DIR", help="output folder (default runs/compare)")


def run(args) -> int:
    with no_empty_folder_on_error(args.out):  # a budget the model cannot meet leaves no folder behind
        return _run(args)


def _run(args) -> int:
    from .. import cost_model
    from ..compare import (DEFAULT_STRATEGIES, CompareSpec, attach_speed, measure_rows, plan_rows, prepare_out,
                           run_rows, write_outputs)
    from ..costs import cost_summary
    from ..data import example_batch

    registry = get_registry()
    names = [s.strip() for s in (args.strategies or ",".join(DEFAULT_STRATEGIES)).split(",") if s.strip()]
    if len(set(names)) != len(names):
        raise HetpruneError(f"--strategies lists a strategy twice: {names}")
    strategies = [registry.build("strategy", n) for n in names]
    if args.budgets:
        budgets = [budget_from(args, k) for k in int_list(args.budgets, "--budgets")]
    else:
        one = budget_from(args)
        budgets = [one] if one else [budget_from(args, k) for k in DEFAULT_BUDGETS]
    seeds = int_list(args.seeds, "--seeds")
    defaults: dict = {}
    types: dict = {}
    for s in strategies:
        defaults.update(getattr(s, "defaults", {}))
        types.update(getattr(s, "setting_types", None) or {})
    sets = list(args.set)
    if args.predictor:
        sets += predictor_sets(defaults, args.predictor, ",".join(names))
    sets = round_to_sets(defaults, args.round_to, ",".join(names)) + latency_batch_sets(args.latency_batch) + sets
    settings = config_mod.resolve(defaults, args.config, {"scorer": args.scorer, "device": args.device,
                                                          "amp": args.amp, "cost_model": args.cost_model},
                                  sets, types=types)
    device = run_device(settings)
    registry.component("scorer", settings["scorer"])
    budgets = [cost_model.bind(b, settings, registry) for b in budgets]
    batch_sizes = int_list(args.batch_sizes, "--batch-sizes")
    if any(b < 1 for b in batch_sizes):
        raise HetpruneError(f"--batch-sizes must be >= 1, got {batch_sizes}")
    for name in sorted(cost_model.refuse_parallel(args.jobs, budgets, settings)):
        cm = cost_model.build(registry, name, settings)   # time the models where it predicts, too
        if isinstance(getattr(cm, "batch_size", None), int) and cm.batch_size not in batch_sizes:
            batch_sizes.append(cm.batch_size)
    out = Path(args.out)
    prepare_out(out, args.resume, args.overwrite, "compare")
    spec = CompareSpec(names, budgets, seeds, settings, batch_sizes=batch_sizes, device=settings["device"])

    dense, model_spec, base_info = base_model(args, device=settings["device"])
    data = data_for(args, dense)
    apply_data_options(args, settings, data)
    spec.settings = settings
    from .. import devices
    from .. import distributed as dist
    from ..train import evaluate_dataset

    devices.place(dense, device)
    base_info["top1"] = evaluate_dataset(dense, data.val, device, workers=settings["finetune"]["workers"],
                                         amp=settings["amp"])
    if dist.active() and args.jobs > 1:
        raise HetpruneError("--jobs runs rows in parallel processes on one machine; under torchrun use --jobs 1")
    if args.jobs < 1:
        raise HetpruneError(f"--jobs must be >= 1, got {args.jobs}")
    plans = plan_rows(spec, base_info["hash"], data.fingerprint)
    rows = run_rows(plans, registry, dense, model_spec, data, base_info, out, resume=args.resume, jobs=args.jobs,
                    data_spec=args.data or "digits")
    if not dist.is_main():  # rank 0 times the models and writes the results
        return 0
    example = devices.place(example_batch(data, 2), device)
    dense_row = {"strategy": "dense", "top1": base_info["top1"], **cost_summary(dense, example)}
    timing = measure_rows(spec, dense, rows, out, input_shape=tuple(example.shape[1:]))
    attach_speed(rows, dense_row, timing)
    command = "hetprune " + " ".join(shlex.quote(a) for a in args.argv)
    meta = {"model": model_spec.name if args.model else base_info["source"], "data": data.name,
            "command": command, "base": base_info}
    result = write_outputs(out, spec, dense_row, rows, timing, meta)
    print()
    print(result["markdown"])
    print(f"wrote {out}/results.md, results.csv, results.json, pareto.png")
    return 0
