"""What MAP points and checks cost against the rest of a run, at the toy scale the MAP study measures and at
the paper's DeiT-B scale, counted by ``--plan`` (issue 43: "no more than 2x the one-shot points' cost"; issue 58: at most 10 % of the whole
run at DeiT-B scale).

The MAP study (benchmarks/map_points.py) prices a scheme's points and checks in images against the one-shot
points'. That ratio depends on how large the gate phase and the final fine-tune are beside the points, which
differs by orders of magnitude between the embedded benchmarks and ImageNet. This counts every stage's
training image passes with ``--plan`` (nothing is trained, no probe): digit pairs with the study's
1,000-image gate phase (budget 8), and the paper's DeiT-B recipe (``--config deit-b-paper``, budget 10) on
data sets of ImageNet-1k's sizes (1,281,167 training and 50,000 val images, made when read: only the plan's
example is). Per case: the points' and checks' images, the checks against the points and against the final
fine-tune, and the whole run's images.

The plan counts every pipeline check's gate phase whole: the first removals the candidates share (trained
once in a run) are known only once the candidates are, so its checks line is an upper bound; the MAP study
reports what a run spent. The winner's selection is not in the checks line where the final select stage
continues from it (``verify_selection`` 1): it is the gate phase's line.

    python benchmarks/plan_costs.py

Writes benchmarks/results/plan-costs.{md,json}. Takes about a minute (DeiT-B is built on the CPU, once).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from studylib.files import write
from studylib.machine import load, machine, machine_line
from studylib.tables import table

from hetprune.pruning.plan import PlanStep, map_share
from hetprune.training.bundle import DataBundle

COST_LINE = 0.10   # issue 58: a scheme whose points and checks spend more of the run than this cannot be the default

ROOT = Path(__file__).resolve().parent.parent


def image_checks(**changes) -> dict:
    """One-shot points, then issue 58's first checks: the 3 best predicted splits, pipeline checks sized in
    images (``verify_images`` the case's: `IMAGE_BUDGETS`), each candidate selected on 15 % of the scoring
    subset with no floor; ``changes`` on top (every checks setting spelled out: the defaults moved since)."""
    return {"hetdpt": {"point_selection": "oneshot", "verify": 3, "verify_by": "pipeline", "verify_selection": 0.15,
                       "verify_images": "the case's", "verify_among": "best", "verify_selection_at_least": None,
                       **changes}}


# (label, settings): the MAP study's schemes that matter for the cost line, in the old hetdpt.verify_* names the
# study and its committed page use (read as the checks policy they spell for one release: issue 71)
SCHEMES = [
    ("one-shot points, no checks", {"hetdpt": {"point_selection": "oneshot", "verify": 0}}),
    ("progressive points (the paper's), no checks", {"hetdpt": {"point_selection": "progressive", "verify": 0}}),
    # the checks' settings spelled out: since issue 58 the defaults are 6 spread pipeline checks sized in images
    ("progressive points, 3 checks from path points", {"hetdpt": {"point_selection": "progressive", "verify": 3,
                                                                  "verify_by": "points", "verify_among": "best"}}),
    ("progressive points, 3 pipeline checks", {"hetdpt": {"point_selection": "progressive", "verify": 3,
                                                          "verify_by": "pipeline", "verify_images": None,
                                                          "verify_selection": 1, "verify_among": "best"}}),
    ("the same, verify_selection 0.33", {"hetdpt": {"point_selection": "progressive", "verify": 3,
                                                    "verify_by": "pipeline", "verify_images": None,
                                                    "verify_selection": 0.33, "verify_among": "best",
                                                    "verify_selection_at_least": None}}),
    # issue 58, item 2: checks sized in images (each at most one point's fine-tune), the candidates selected on
    # 15 % of the scoring subset; verify_images is the case's (IMAGE_BUDGETS): a budget is a number of images
    ("one-shot points, 3 pipeline checks sized in images, verify_selection 0.15", image_checks()),
    ("the same only on a near-tie (verify_when unsure: counted as if they run)", image_checks(verify_when="unsure")),
    ("the same checks, one in each part of the budget line (verify_among spread)",
     image_checks(verify_among="spread")),
    # references above the line (the MAP study's oneshot-spread6-img and oneshot-spread3-img-sel1)
    ("the spread checks, 6 of them (verify 6, verify_images auto)",
     image_checks(verify=6, verify_images="auto", verify_among="spread")),
    ("the 3 spread checks, each selected on the whole scoring subset (verify_selection 1, verify_images auto)",
     image_checks(verify_selection=1, verify_images="auto", verify_among="spread")),
    # the floor that keeps a selection's images where a share of a small subset is too few to rank the sites
    ("6 spread checks, verify_selection 0.07 with a floor of 300 images a gate epoch (verify_images auto; the "
     "default since issue 58's study)",
     image_checks(verify=6, verify_selection=0.07, verify_selection_at_least=300, verify_images="auto",
                  verify_among="spread")),
]


class Sized(Dataset):
    """``n`` items of 3x224x224 zeros, made when read: a data set of a real data set's size for the plan."""

    def __init__(self, n: int, classes: int = 1000):
        self.n, self.classes = n, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.zeros(3, 224, 224), i % self.classes


def merged(*dicts: dict) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = merged(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def stages(plan) -> dict[str, int]:
    return {s.stage: s.train_images for s in plan.steps}


def deit_b(settings: dict) -> dict[str, int]:
    import hetprune

    if not hasattr(deit_b, "model"):
        torch.manual_seed(0)
        deit_b.model = hetprune.model.spec.build(hetprune.model.spec.ModelSpec("deit_base_distilled_patch16_224"))
        # hetprune's own classification data of ImageNet's sizes: the recipe's mixup, cutmix, repeats and
        # kd_token act on its batches (a Task's own loader cannot take them and is refused)
        deit_b.task = DataBundle("imagenet-sized", Sized(1_281_167), Sized(50_000), 1000, 3, 224, "imagenet-sized")
    plan = hetprune.prune(deit_b.model, deit_b.task, "hetdpt", 10, config="deit-b-paper", amp="none", plan=True,
                          plan_probe=0, progress=False, log=lambda m: None, settings=settings)
    return stages(plan)


def digit_pairs(settings: dict) -> dict[str, int]:
    from hetprune.cli import main

    sets = []
    for section, values in settings.items():
        sets += [a for k, v in values.items() for a in ("--set", f"{section}.{k}={json.dumps(v)}")]
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        out = Path(tmp) / "out"
        rc = main(["prune", "--data", "digit-pairs", "--strategy", "hetdpt", "--budget", "8", *sets,
                   "--plan", "--plan-probe", "0", "--out", str(out)])
        if rc != 0:
            raise SystemExit(f"the digit-pairs plan failed ({rc})")
        steps = json.loads((Path(tmp) / "out.work" / "plan.json").read_text())["steps"]
    return {s["stage"]: s["train_images"] for s in steps if s["stage"] != "total"}   # the stages, as prune() returns them


CASES = {"digit pairs, budget 8, scoring.subset 1000 (the MAP study's replicate)":
         (digit_pairs, {"scoring": {"subset": 1000}}),
         "DeiT-B, deit-b-paper, budget 10, ImageNet-1k's sizes": (deit_b, {})}
# hetdpt.verify_images of the checks sized in images, per case: the MAP study's 5,000 at toy scale; at DeiT-B
# more than 3 candidates' selections and one point's fine-tune each can spend, so the plan counts that most
IMAGE_BUDGETS = dict(zip(CASES, (5_000, 60_000_000)))


def for_case(settings: dict, case: str) -> dict:
    """``settings`` with the case's image budget where a scheme asks for it."""
    hetdpt = settings.get("hetdpt", {})
    if hetdpt.get("verify_images") != "the case's":
        return settings
    return {**settings, "hetdpt": {**hetdpt, "verify_images": IMAGE_BUDGETS[case]}}


def row(label: str, counted: dict[str, int], oneshot: dict[str, int]) -> dict:
    points = counted.get("stage 1: MAP points", 0)
    checks = sum(v for k, v in counted.items() if k.startswith("stage 1:") and "checks" in k)
    final = counted.get("stage 2: fine-tune", 0)
    return {"scheme": label, "points": points, "checks": checks, "gate_phase": counted.get("select: gate phase", 0),
            "final_finetune": final, "total": sum(counted.values()),
            "map_share": map_share([PlanStep(k, "", 0, v) for k, v in counted.items()]),
            "points_and_checks_vs_oneshot": (points + checks) / oneshot["stage 1: MAP points"],
            "run_vs_oneshot_run": sum(counted.values()) / sum(oneshot.values()),
            "checks_vs_final_finetune": checks / final if final else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--name", default="plan-costs")
    args = ap.parse_args()
    command = "python benchmarks/plan_costs.py" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])
    started, load_start = time.time(), load()
    cases = {}
    for case, (count, base) in CASES.items():
        counted = [(label, count(merged(base, for_case(s, case)))) for label, s in SCHEMES]
        oneshot = counted[0][1]
        cases[case] = [row(label, c, oneshot) for label, c in counted]
        print(f"{case}: counted", flush=True)
    res = {"command": command, "machine": machine(), "load_start": load_start, "load_end": load(),
           "seconds": round(time.time() - started, 1), "cases": cases}
    write(args.results, args.name, res, markdown(res))


def markdown(res: dict) -> str:
    m = lambda n: f"{n / 1e6:,.1f} M" if n >= 1e6 else f"{n:,}"   # noqa: E731
    lines = ["# What MAP points and checks cost against the rest of a run, by `--plan`", "",
             f"Produced by `{res['command']}` (counts only: nothing trained, no probe).", "",
             machine_line(res) + " (image counts do not depend on the machine).", "",
             "Training image passes per stage as `--plan` counts them. Pipeline checks: each candidate's gate "
             "phase counted whole (the removals the candidates share are known only once they are; the MAP "
             "study reports what a run spent) plus the final fine-tunes successive halving spends "
             "(`verify_budget`'s default: the selections + 2), less the winner's selection where the final select "
             "stage continues from it (`verify_selection` 1: it is the gate phase's column; the MAP study counts "
             "it with the checks). Checks sized in images (`verify_images`: "
             + ", ".join(f"{n:,} for {c.split(',')[0]}" for c, n in IMAGE_BUDGETS.items())
             + "): each check is at most one point's fine-tune, so the plan counts at most the selections and 3 "
             "of them. The last three columns: the scheme's points and "
             "checks against the one-shot points' images (the MAP study's toy-scale cost: issue 43's cap of 2x, "
             "a column since issue 58), and its "
             "checks against one final fine-tune; the whole run against the same run with one-shot points and no "
             "checks. **Share of the run**: the points' and checks' images over the whole run's, as `--plan` prints "
             f"it (issue 58's cost line: a scheme over {COST_LINE:.0%} of the DeiT-B run cannot be the default).", ""]
    for case, rows in res["cases"].items():
        at_scale = case.startswith("DeiT-B")   # the cost line is the DeiT-B run's: toy points dwarf a toy run
        lines += [f"## {case}", ""]
        lines += table(["scheme", "MAP points", "checks", "gate phase", "final fine-tune", "whole run",
                        "points + checks vs one-shot points", "checks vs the final fine-tune",
                        "whole run vs one-shot's", "share of the run"],
                       [[r["scheme"], m(r["points"]), m(r["checks"]), m(r["gate_phase"]), m(r["final_finetune"]),
                         m(r["total"]), f"{r['points_and_checks_vs_oneshot']:.2f}x",
                         "-" if r["checks_vs_final_finetune"] is None else f"{r['checks_vs_final_finetune']:.2f}",
                         f"{r['run_vs_oneshot_run']:.2f}x",
                         f"{r['map_share']:.1%}{' (over the line)' if at_scale and r['map_share'] > COST_LINE else ''}"]
                        for r in rows])
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
