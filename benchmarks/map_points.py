"""Which MAP points and predictor pick the split full fine-tuning finds best? (issues 35 and 43)

For every studied target of the three embedded benchmarks (digit pairs, digits, the digit grid), the ground truth is
every feasible split (n_attn, n_act) pruned and fine-tuned on the final
schedule (``hetprune ablate``'s truth rows: the fixed split's gate-taylor
selection, then the final fine-tune), mean over seeds. Then, per seed, each
point scheme measures its points as ``hetprune prune --strategy hetdpt``
would for that target (``collect_points`` of the ``hetdpt`` strategy, the
same code), each predictor is fitted on them, and its pick is looked up in
the truth. Per (scheme, predictor, target): the pick per seed, its true
top-1, the regret (best true split minus the pick's, mean truth), Kendall's
tau between predicted and true values over the feasible splits, and the
points' cost: images through their fine-tunes and seconds, as a share of one
final fine-tune (``finetune``: epochs x subset images; seconds: the truth
rows' median wall time, selection and final fine-tune together).

Everything is saved as it finishes and reused by a rerun of the same command:
the truth rows (``rows.jsonl`` per target, keyed like ``hetprune ablate``'s),
the points (one keyed points file per benchmark, shared by targets: a point
depends on its scheme's settings, never on the target, so the targets of one
seed share their points and progressive paths are extended, not redone), and
each finished (benchmark, seed, scheme) unit's fits (``units/*.json``, read back only under the same
resolved settings: a moved default makes a unit again).

Reused: the truth of digit pairs at MACs 0.7, 0.55 and 0.45, seeds 0 and 1,
from benchmarks/results/default-target.json (made on the shipped base model);
before it is used, one split per target is fine-tuned again on both seeds and
must reproduce the committed mean and std, else every seed is fine-tuned here.

``--combine A,B,...`` runs nothing: it applies the rule over the targets of earlier passes (A.json, B.json,
..., each target studied by one of them on the same seeds) and writes the ranking as ``--name``.

``--reuse-from NAME`` takes an earlier study's results (NAME.json, made with the same ``--set``) for what
this pass does not redo: a target's truth where one of its rows (the best split, first seed) fine-tuned again
here reproduces the committed value exactly (else every seed is fine-tuned here), and the units of the
schemes not in ``--schemes`` (the md names them).

    python benchmarks/map_points.py                      # everything: truth, points, report
    python benchmarks/map_points.py --phase truth        # only the ground truth
    python benchmarks/map_points.py --benchmarks digit-pairs --targets macs0.45 --seeds 0 --out runs/quick

Issue 43's schemes ``progressive-pipeline3`` / ``-pipeline2`` check the K best predicted splits the way
the final run would make them (``verify_by pipeline``: the run's own selection from the dense model, then
fine-tunes on fractions of the final schedule by successive halving); their cost counts the checks. Every
point and check is measured on the selection split, never on val. The choice: the lowest worst-target
excess regret (mean regret minus that target's seed-noise floor) among the schemes whose points and checks
cost at most 2x the one-shot points' images at every target.

Writes benchmarks/results/<name>.{md,json,png} (``--name``, default map-points; ``--results`` changes the
folder).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

from hetprune.pruning.point_store import metric_of
from studylib.files import write
from studylib.machine import load, machine, machine_line
from studylib.runs import budget_of, context, final_images, floors_of, oracle_rows, resolved_settings, truth_rows
from studylib.tables import table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# the targets of issue 35: every target whose true landscape is committed (digit pairs), budget 12 and the
# MAC targets of digits-compare-macs.md (digits)
TARGETS = {
    "digit-pairs": ["b8", "b12", "macs0.7", "macs0.55", "macs0.45", "macs0.6"],
    "digits": ["b12", "macs0.55", "macs0.45"],
    # issue 43: budget 12 (half its 24 sites, as digits') and the MAC targets default_target.py measured for the
    # grid, as digit pairs' were chosen
    "digit-grid": ["b12", "macs0.7", "macs0.55", "macs0.45", "macs0.6", "macs0.35"],
}
# issue 58: targets no default was chosen on (macs0.6, between the studied 0.7 and 0.55; on the grid also
# macs0.35, below every studied one), to judge a pick where no study tuned it
UNSTUDIED = {("digit-pairs", "macs0.6"), ("digit-grid", "macs0.6"), ("digit-grid", "macs0.35")}
# truth reused from a committed file: (benchmark, target) -> (file, seeds it holds)
REUSED = {("digit-pairs", f"macs{t:g}"): ("default-target.json", (0, 1)) for t in (0.7, 0.55, 0.45)}

# the checks' settings whose defaults moved after a scheme was studied, spelled out so that the scheme keeps
# meaning what it measured (a rerun resolves them to the settings its page reports): the floor and the spread checks
# became the default with issue 58's study, after issue 43's checks were sized in final fine-tunes (verify_images
# null) on the K best predicted. The schemes keep the old hetdpt.verify_* names their committed results were run
# and keyed with (a saved unit is found by its --set list); the loader reads them as the checks policy they spell
# (hetdpt.checks, issue 71) for one release, with a deprecation line: rename them with the next study.
NO_FLOOR = "hetdpt.verify_selection_at_least=null"
BEST_NO_FLOOR = ["hetdpt.verify_among=best", NO_FLOOR]
ISSUE43_CHECKS = ["hetdpt.verify_images=null", *BEST_NO_FLOOR]
# the point schemes studied: name -> settings (--set items) on top of hetdpt's defaults
SCHEMES = {
    "oneshot": ["hetdpt.point_selection=oneshot", "hetdpt.verify=0"],
    "progressive": ["hetdpt.point_selection=progressive", "hetdpt.verify=0"],
    "progressive-attn-first": ["hetdpt.point_selection=progressive", "hetdpt.interleave_first=attn",
                               "hetdpt.verify=0"],
    "progressive-final-schedule": ["hetdpt.point_selection=progressive", "hetdpt.point_finetune=finetune",
                                   "hetdpt.verify=0"],
    "gradual": ["hetdpt.point_selection=gradual", "hetdpt.verify=0"],
    # past the paper (issue 35, item 5): progressive points, then the 3 best predicted splits checked on the
    # final schedule from the nearest path point (hetdpt.verify), the best of them picked
    "progressive-verify3": ["hetdpt.point_selection=progressive", "hetdpt.verify=3", "hetdpt.verify_by=points",
                            "hetdpt.verify_among=best"],
    # progressive points on the final schedule at a fraction of the steps: 2 or 3 sites per step
    "progressive-final-stride2": ["hetdpt.point_selection=progressive", "hetdpt.point_finetune=finetune",
                                  "hetdpt.path_stride=2", "hetdpt.verify=0"],
    "progressive-final-stride3": ["hetdpt.point_selection=progressive", "hetdpt.point_finetune=finetune",
                                  "hetdpt.path_stride=3", "hetdpt.verify=0"],
    "progressive-final-stride3-verify2": ["hetdpt.point_selection=progressive", "hetdpt.point_finetune=finetune",
                                          "hetdpt.path_stride=3", "hetdpt.verify=2", "hetdpt.verify_by=points",
                                          "hetdpt.verify_among=best"],
    # issue 43, item 2: the 3 (or 2) best predicted splits checked by the final run's own selection and
    # fine-tune on the selection split, by successive halving within hetdpt.verify_budget (its default)
    "progressive-pipeline3": ["hetdpt.point_selection=progressive", "hetdpt.verify=3", "hetdpt.verify_by=pipeline",
                              *ISSUE43_CHECKS, "hetdpt.verify_selection=1"],
    "progressive-pipeline2": ["hetdpt.point_selection=progressive", "hetdpt.verify=2", "hetdpt.verify_by=pipeline",
                              *ISSUE43_CHECKS, "hetdpt.verify_selection=1"],
    # the same checks, each candidate's gate phase on a fifth of the scoring subset (hetdpt.verify_selection);
    # the winner is selected again by the final run on the whole subset
    "progressive-pipeline3-sel20": ["hetdpt.point_selection=progressive", "hetdpt.verify=3",
                                    "hetdpt.verify_by=pipeline", *ISSUE43_CHECKS, "hetdpt.verify_selection=0.2"],
    "progressive-pipeline3-sel33": ["hetdpt.point_selection=progressive", "hetdpt.verify=3",
                                    "hetdpt.verify_by=pipeline", *ISSUE43_CHECKS, "hetdpt.verify_selection=0.33"],
    # issue 58, item 2: checks sized in images (hetdpt.verify_images), each at most one point's fine-tune, the
    # candidates selected on 15 % of the scoring subset: the sizes that keep DeiT-B's choice of the split
    # under 10 % of its run (benchmarks/plan_costs.py); the budget (5,000 images) is more than the rounds can
    # spend at every studied target here, so each check is one whole point's fine-tune
    "oneshot-pipeline3-img": ["hetdpt.point_selection=oneshot", "hetdpt.verify=3", "hetdpt.verify_by=pipeline",
                              "hetdpt.verify_selection=0.15", "hetdpt.verify_images=5000", *BEST_NO_FLOOR],
    # the same checks only where the predictor is unsure (hetdpt.verify_when unsure): on the splits predicted
    # within its leave-one-out error of the best
    "oneshot-unsure3-img": ["hetdpt.point_selection=oneshot", "hetdpt.verify=3", "hetdpt.verify_by=pipeline",
                            "hetdpt.verify_selection=0.15", "hetdpt.verify_images=5000", "hetdpt.verify_when=unsure",
                            *BEST_NO_FLOOR],
    # the same checks, not on the 3 best predicted splits but on the best predicted of each third of the
    # budget line (hetdpt.verify_among spread): a predictor wrong about the whole line (digit pairs at budget 8,
    # Kendall tau -0.69) cannot keep its best part from the checks
    "oneshot-spread3-img": ["hetdpt.point_selection=oneshot", "hetdpt.verify=3", "hetdpt.verify_by=pipeline",
                            "hetdpt.verify_selection=0.15", "hetdpt.verify_images=5000", "hetdpt.verify_among=spread",
                            NO_FLOOR],
    # references above the cost line, to say where the spread checks' regret comes from: twice the checks
    # (each still one point's fine-tune, verify_images auto), and the 3 spread checks each selected on the whole
    # scoring subset (the final run's own selection) instead of 15 % of it
    "oneshot-spread6-img": ["hetdpt.point_selection=oneshot", "hetdpt.verify=6", "hetdpt.verify_by=pipeline",
                            "hetdpt.verify_selection=0.15", "hetdpt.verify_images=auto", "hetdpt.verify_among=spread",
                            NO_FLOOR],
    "oneshot-spread3-img-sel1": ["hetdpt.point_selection=oneshot", "hetdpt.verify=3", "hetdpt.verify_by=pipeline",
                                 "hetdpt.verify_selection=1", "hetdpt.verify_images=auto",
                                 "hetdpt.verify_among=spread", NO_FLOOR],
    # what check_bound.py says 3 candidates cannot give and 6 can: 6 spread checks, each candidate selected on
    # 7 % of the scoring subset (DeiT-B: 90,000 images a gate epoch; the 6 checks and the points 9.4 % of its
    # run) but on at least 300 images a gate epoch (verify_selection_at_least: a share of a small subset is too
    # few images to rank the sites; here the floor is the whole subset, the run's own selection)
    "oneshot-spread6-floor300": ["hetdpt.point_selection=oneshot", "hetdpt.verify=6", "hetdpt.verify_by=pipeline",
                                 "hetdpt.verify_selection=0.07", "hetdpt.verify_selection_at_least=300",
                                 "hetdpt.verify_images=auto", "hetdpt.verify_among=spread"],
}
WORDS = {   # what each scheme's points are, for the tables
    "oneshot": "today's default: each point's sites off the dense model at once (taylor's order), one fine-tune "
               "on the final schedule (point_finetune auto)",
    "progressive": "the paper's: attention, activation and interleaved paths (activation first), one more site "
                   "per point, each fine-tuned with short_finetune from the previous point's weights",
    "progressive-attn-first": "the same, the interleaved path removing attention first",
    "progressive-final-schedule": "progressive, each step fine-tuned on the final schedule",
    "gradual": "each point made by the run's own gate-taylor selection from the dense model, no fine-tune after",
    "progressive-verify3": "past the paper: progressive points, then the 3 best predicted splits each reached "
                           "from the nearest path point it contains and fine-tuned on the final schedule; the best "
                           "of the 3 is the pick",
    "progressive-final-stride2": "progressive on the final schedule, 2 sites per step",
    "progressive-final-stride3": "progressive on the final schedule, 3 sites per step",
    "progressive-final-stride3-verify2": "that, then the 2 best predicted splits checked as in progressive-verify3",
    "progressive-pipeline3": "progressive points, then the 3 best predicted splits each selected by the run's own "
                             "scorer from the dense model and fine-tuned on fractions of the final schedule by "
                             "successive halving (verify_by pipeline; budget: the 3 selections, the first removals "
                             "they share trained once, + 2 final fine-tunes)",
    "progressive-pipeline2": "the same with the 2 best predicted splits (budget: 2 selections + 2 final fine-tunes)",
    "progressive-pipeline3-sel20": "progressive-pipeline3 with cheaper checks: each candidate's gate phase on a "
                                   "fifth of the scoring subset (verify_selection 0.2; budget: those selections + "
                                   "2 final fine-tunes); the final run selects the winner again on the whole subset",
    "progressive-pipeline3-sel33": "the same on a third of the scoring subset (verify_selection 0.33)",
    "oneshot-pipeline3-img": "one-shot points, then the 3 best predicted splits each selected by the run's scorer on "
                             "15 % of the scoring subset and fine-tuned on at most one point's schedule by "
                             "successive halving (checks sized in images: verify_images)",
    "oneshot-unsure3-img": "the same checks only where the predictor is unsure (verify_when unsure): the splits "
                           "predicted within its leave-one-out error of the best, none when the best stands out",
    "oneshot-spread3-img": "the same checks on the best predicted split of each third of the feasible splits "
                           "(ordered by attention removals; verify_among spread) instead of the 3 best predicted",
    "oneshot-spread6-img": "the spread checks on the best predicted split of each sixth of the feasible splits "
                           "(verify 6), each one point's fine-tune (verify_images auto)",
    "oneshot-spread3-img-sel1": "the 3 spread checks, each candidate selected on the whole scoring subset "
                                "(verify_selection 1, the final run's own selection) instead of 15 % of it",
    "oneshot-spread6-floor300": "6 spread checks (the best predicted of each sixth of the line), each candidate "
                                "selected on 7 % of the scoring subset but on at least 300 images a gate epoch",
}
# the predictors fitted on every scheme's points: label -> (registered name, options)
PREDICTORS = {
    "local": ("local", {}),
    "poly (auto)": ("poly", {"degree": "auto"}),
    "poly (2)": ("poly", {"degree": 2}),
    "gp": ("gp", {}),
}
BASELINE = "oneshot"   # today's points: the cost every scheme is measured against
COST_LINE = 0.10       # issue 58: the default may spend at most this share of a DeiT-B run (plan_costs.py counts it)
COST_CAP = 2.0         # issue 43's toy-scale cap (x the one-shot points): the rule only where DeiT-B is not counted
# the scheme's row in benchmarks/results/plan-costs.json (its DeiT-B case: --config deit-b-paper, budget 10,
# ImageNet-1k's sizes, as --plan counts it), by scheme
PLAN_COSTS_ROWS = {
    "oneshot": "one-shot points, no checks",
    "progressive": "progressive points (the paper's), no checks",
    "progressive-verify3": "progressive points, 3 checks from path points",
    "progressive-pipeline3": "progressive points, 3 pipeline checks",
    "progressive-pipeline3-sel33": "the same, verify_selection 0.33",
    "oneshot-pipeline3-img": "one-shot points, 3 pipeline checks sized in images, verify_selection 0.15",
    "oneshot-unsure3-img": "the same only on a near-tie (verify_when unsure: counted as if they run)",
    "oneshot-spread3-img": "the same checks, one in each part of the budget line (verify_among spread)",
    "oneshot-spread6-img": "the spread checks, 6 of them (verify 6, verify_images auto)",
    "oneshot-spread3-img-sel1": "the 3 spread checks, each selected on the whole scoring subset (verify_selection 1, "
                                "verify_images auto)",
    "oneshot-spread6-floor300": "6 spread checks, verify_selection 0.07 with a floor of 300 images a gate epoch "
                                "(verify_images auto; the default since issue 58's study)",
}


def deit_b_shares(path: Path | None = None) -> dict[str, float]:
    """Per scheme, what choosing the split spends of a DeiT-B run (the points' and checks' images over the
    run's), as benchmarks/plan_costs.py committed it; schemes it does not count are absent."""
    data = json.loads((path or RESULTS / "plan-costs.json").read_text())
    [rows] = [r for case, r in data["cases"].items() if case.startswith("DeiT-B")]
    share = {r["scheme"]: r["map_share"] for r in rows}
    return {scheme: share[label] for scheme, label in PLAN_COSTS_ROWS.items() if label in share}
GOAL = 0.5             # mean regret above the seed-noise floor (points) issue 43 asks for at every target


# -- a prune job on the study's base model (studylib.runs.context) -------------------------------------------

def job_for(ctx, target: str, seed: int, workdir: Path, shared: Path, settings=None):
    """A hetdpt job of the study at ``target`` and ``seed`` (``settings``: a `Settings` other than the
    context's)."""
    from hetprune.pruning.pipeline import PruneJob

    s = (settings or ctx.settings).replace(seed=seed)
    return PruneJob(dense=ctx.dense, spec=ctx.spec, data=None, task=ctx.task, budget=budget_of(target), settings=s,
                    registry=ctx.registry, workdir=workdir, shared_dir=shared, base_info=dict(ctx.info),
                    progress=False, log=lambda m: None, strategy_name="hetdpt")


def feasible(ctx, target: str, out: Path) -> list[tuple[int, int]]:
    job = job_for(ctx, target, 0, out / "work-pairs", out / "work-pairs")
    with job.serving():
        return sorted(job.feasible_pairs())


# -- phase 1: the ground truth -----------------------------------------------------------------------------

def committed_truth(bench: str, target: str) -> dict | None:
    """The reused truth of one target: ``{split: (mean, std)}`` over the committed seeds, or None."""
    if (bench, target) not in REUSED:
        return None
    name, _ = REUSED[(bench, target)]
    data = json.loads((RESULTS / name).read_text())
    macs = float(target[len("macs"):])
    [found] = [t for t in data["targets"] if abs(t["target_macs"] - macs) < 1e-9]
    return {tuple(int(v) for v in k.split("+")): (found["splits"][k], found["std"][k]) for k in found["splits"]}


def split_record(values: list[float], per_seed: dict[str, float]) -> dict:
    """One split's truth: the mean and std of its final top-1 over ``values`` (every seed's, reused ones
    included) and the seeds fine-tuned, by seed."""
    return {"true": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "seeds": len(values), "per_seed": per_seed}


def truth(ctx, target: str, seeds: list[int], out: Path, jobs: int, log) -> dict:
    """The truth of one target: per split the mean and std of the final top-1 over ``seeds``, how it was made
    (fine-tuned here or reused), the rows, and the median wall time of one truth row."""
    folder = out / ctx.bench / f"truth-{target}"
    pairs = feasible(ctx, target, folder)
    reused = None if ctx.sets else committed_truth(ctx.bench, target)   # committed truth: the defaults
    note, per_seed = "every seed fine-tuned here", {}
    if reused is not None:
        if set(reused) != set(pairs):
            raise SystemExit(f"{ctx.bench} {target}: the committed truth holds splits {sorted(reused)}, the target "
                             f"allows {pairs}: not the same landscape")
        name, old_seeds = REUSED[(ctx.bench, target)]
        check = max(reused, key=lambda p: reused[p][0])   # the best split: where a mismatch would matter most
        rows = truth_rows(ctx, target, [check], old_seeds, folder, jobs, log)
        values = [r["metric"] for r in rows]
        mean, std = statistics.mean(values), statistics.stdev(values)
        same = abs(mean - reused[check][0]) < 1e-6 and abs(std - reused[check][1]) < 1e-6
        if same:
            note = (f"seeds {', '.join(map(str, old_seeds))} reused from {name} (split {check[0]}+{check[1]} "
                    f"fine-tuned again on both: {mean:.2f} ± {std:.2f}, as committed)")
        else:
            note = (f"{name} NOT reused: split {check[0]}+{check[1]} fine-tuned again gives {mean:.2f} ± {std:.2f}, "
                    f"committed {reused[check][0]:.2f} ± {reused[check][1]:.2f}; every seed fine-tuned here")
            reused = None
    todo_seeds = [s for s in seeds if reused is None or s not in REUSED[(ctx.bench, target)][1]]
    rows = truth_rows(ctx, target, pairs, todo_seeds, folder, jobs, log) if todo_seeds else []
    for r in rows:
        per_seed.setdefault((r["n_attn"], r["n_act"]), {})[r["seed"]] = r["metric"]
    splits = {}
    for p in pairs:
        values = list(per_seed.get(p, {}).values())
        n_old = len(REUSED[(ctx.bench, target)][1]) if reused is not None else 0
        if reused is not None:   # the committed seeds' two values from their mean and std (order unknown)
            m, sd = reused[p]
            half = sd / 2 ** 0.5
            values += [m - half, m + half][:n_old]
        splits[p] = split_record(values, {str(k): v for k, v in sorted(per_seed.get(p, {}).items())})
    walls = [r["wall_s"] for r in rows if "wall_s" in r]
    return {"target": target, "pairs": [list(p) for p in pairs], "splits": splits, "note": note,
            "row_seconds_total": round(sum(walls), 1),
            "seeds": sorted(set(todo_seeds) | set(REUSED[(ctx.bench, target)][1] if reused is not None else ())),
            "row_seconds": statistics.median(walls) if walls else None}


def reused_truth(ctx, target: str, seeds: list[int], out: Path, jobs: int, log, earlier: dict,
                 name: str, base: str) -> dict | None:
    """The truth of one target taken from an earlier study's results file (``--reuse-from``) where it was made
    with the same settings, base model, splits and seeds, and one of its rows fine-tuned again here reproduces
    its committed value exactly (the best split on the first seed); None otherwise (then fine-tuned here)."""
    t = earlier.get("truth", {}).get(f"{ctx.bench}|{target}")
    if t is None or earlier.get("sets") != ctx.sets or earlier.get("bases", {}).get(ctx.bench) != base:
        return None
    pairs = feasible(ctx, target, out / ctx.bench / f"truth-{target}")
    splits = {tuple(map(int, k.split("+"))): v for k, v in t["splits"].items()}
    if set(splits) != set(pairs) or not all(str(s) in v["per_seed"] for v in splits.values() for s in seeds):
        return None
    check = max(splits, key=lambda p: (splits[p]["true"], -p[0]))
    [row] = truth_rows(ctx, target, [check], seeds[:1], out / ctx.bench / f"truth-{target}", jobs, log)
    committed = splits[check]["per_seed"][str(seeds[0])]
    if abs(row["metric"] - committed) > 1e-6:
        log(f"{ctx.bench} {target}: {name} not reused: split {check[0]}+{check[1]} seed {seeds[0]} gives "
            f"{row['metric']:.2f} here, {committed:.2f} there")
        return None
    keep = {str(s) for s in seeds}
    kept = {}
    for p, v in splits.items():
        values = {k: x for k, x in v["per_seed"].items() if k in keep}
        kept[p] = split_record(list(values.values()), values)
    return {"target": target, "pairs": [list(p) for p in pairs], "splits": kept,
            "note": f"reused from {name}.json (split {check[0]}+{check[1]} on seed {seeds[0]} fine-tuned again here: "
                    f"{row['metric']:.2f}, as committed)",
            "row_seconds_total": round(row.get("wall_s") or 0.0, 1), "seeds": sorted(seeds),
            "row_seconds": t.get("row_seconds")}


def reused_units(earlier: dict, benches: list[str], seeds: list[int], schemes: list[str],
                 extra: list[str]) -> list[dict]:
    """An earlier study's units (``--reuse-from``) of the schemes this pass does not run, on its benchmarks and
    seeds: their fits as that study stored them (scored here against the same truth)."""
    return [u for u in earlier.get("units", []) if u["scheme"] not in schemes and u["bench"] in benches
            and u["seed"] in seeds and u["scheme"] in SCHEMES and u.get("sets") == SCHEMES[u["scheme"]] + list(extra)]


# -- phase 2: every scheme's points, every predictor ---------------------------------------------------------

def fit_all(points: list[dict], pairs, registry) -> dict:
    """Every predictor fitted on ``points``: its prediction at every feasible split and its fit report."""
    triples = [(p["n_attn"], p["n_act"], metric_of(p)) for p in points]
    out = {}
    for label, (name, options) in PREDICTORS.items():
        try:
            predictor = registry.build("predictor", name, **options)
            predictor.fit(triples)   # its return value is ignored (the contract's rule)
        except Exception as exc:   # too few points for this predictor: the row says so
            out[label] = {"error": str(exc)}
            continue
        out[label] = {"predicted": {f"{a}+{m}": predictor.predict(a, m) for a, m in pairs},
                      "fit": predictor.fit_report() if hasattr(predictor, "fit_report") else {}}
    return out


def saved_unit(path: Path, targets: list[str], sets: list[str], resolved: dict) -> dict | None:
    """The unit saved at ``path`` if it was made for these targets and settings, else None. Settings are
    compared as resolved (every default filled in), not only as the scheme's ``--set`` list: a unit made
    before a default moved ran other settings under the same list, and is made again."""
    if not path.is_file():
        return None
    done = json.loads(path.read_text())
    same = done.get("targets") == targets and done.get("sets") == sets and done.get("resolved") == resolved
    return done if same else None


def unit(bench: str, seed: int, scheme: str, targets: list[str], out: Path, extra: list[str] = ()) -> dict:
    """One (benchmark, seed, scheme): its points for every target, and every predictor's fit on them (saved;
    a rerun with the same targets and resolved settings reads it back: `saved_unit`). ``extra``: ``--set``
    settings on top of the scheme's, for the truth and every scheme alike."""
    import torch

    torch.set_num_threads(1)
    path = out / "units" / f"{bench}-seed{seed}-{scheme}.json"   # scheme names are file-safe
    sets = SCHEMES[scheme] + list(extra)
    resolved = resolved_settings(sets)
    done = saved_unit(path, targets, sets, resolved)
    if done is not None:
        return done
    ctx = context(bench, sets)
    shared = out / bench / "points"
    result = {"bench": bench, "seed": seed, "scheme": scheme, "sets": sets, "resolved": resolved,
              "targets": targets, "per_target": {}}
    for target in targets:
        work = out / bench / "work" / f"{target}-seed{seed}-{scheme}"
        job = job_for(ctx, target, seed, work, shared)
        started = time.time()
        with job.serving():
            alloc = ctx.strategy.allocation(job)   # stage 1's own steps: the run's points, candidates and checks
            pairs = sorted(alloc.pairs)
            # the scheme's points even where the checks would cover every split: the study compares predictors
            plan = alloc.point_plan() or alloc.scheme.plan(alloc.pairs)
            points = alloc.points(plan)
            fits = fit_all(points, pairs, ctx.registry)
            if alloc.most and alloc.policy.measure == "pipeline":
                pipeline_checks(alloc, fits, None)
            elif alloc.most:   # each predictor's splits to check (hetdpt.checks points) measured, as allocate does
                for fit in fits.values():
                    if "predicted" not in fit:
                        continue
                    best = splits_to_check(alloc, fit)
                    if best is None:
                        continue
                    found = alloc.scheme.verify(best)
                    fit["verified"] = {f"{a}+{m}": metric_of(found[(a, m)]) for a, m in best}
                    fit["verify_images"] = sum(found[p].get("images") or 0 for p in best)
                    fit["verify_seconds"] = round(sum(found[p].get("seconds") or 0 for p in best), 1)
        result["per_target"][target] = {
            "pairs": [list(p) for p in pairs], "plan": [list(p) for p in plan], "points": points,
            "images": sum(p.get("images") or 0 for p in points),
            "seconds": round(sum(p.get("seconds") or 0 for p in points), 1),
            "wall_here": round(time.time() - started, 1),   # less where points were reused from another target
            "fits": fits}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return result


def splits_to_check(alloc, fit: dict) -> list | None:
    """The splits a run checks after this predictor's fit (`Allocation.candidates`), or None where it checks
    none (near-ties checks and a clear pick: taken without checks, at no cost, the fit saying so in
    ``unsure``), as the run's allocation does."""
    predicted = {tuple(map(int, k.split("+"))): v for k, v in fit["predicted"].items()}
    best, unsure = alloc.candidates(predicted, fit.get("fit", {}).get("loo_mae"))
    if unsure is not None:
        fit["unsure"] = unsure
        if not unsure["checked"]:
            return None
    return best


def pipeline_checks(alloc, fits: dict, budget) -> None:
    """Pipeline checks (a pipeline ``hetdpt.checks`` policy) for each predictor's splits to check, chosen as the
    run chooses them (`Allocation.candidates`: the K best predicted or, spread, the best of each K-th of the
    line; near-ties only the near ties, none where the best stands out, the fit saying which in
    ``unsure``): the winner, the halving's rounds and its
    cost (images: the units spent x one unit's images, a final fine-tune's or in images a point's;
    seconds: each candidate's selection, timed once and counted for every predictor that checks it, plus the stored
    check fine-tunes)."""
    job = alloc.job
    checks = alloc.checks()   # one object for every predictor: a selection made once is reused
    timings = job.workdir / "selection-seconds.json"   # kept: a rerun that reuses stored checks still counts them
    selecting = {tuple(map(int, k.split("+"))): v for k, v in
                 (json.loads(timings.read_text()) if timings.is_file() else {}).items()}

    def keep_timings():   # the selections this process made, timed by the checks themselves
        selecting.update(checks.selection_seconds)
        timings.parent.mkdir(parents=True, exist_ok=True)
        timings.write_text(json.dumps({f"{a}+{m}": v for (a, m), v in selecting.items()}))

    def stored_at(fraction):   # read after each predictor's halving: it may have stored new checks
        return checks.store().at(fraction=fraction).load()

    for fit in fits.values():
        if "predicted" not in fit:
            continue
        best = splits_to_check(alloc, fit)
        if best is None:
            continue
        halved = checks.run(best, budget)
        keep_timings()
        seconds = sum(selecting.get(s, 0.0) for s in best)
        for r in halved.rounds:
            have = stored_at(r["fraction"])
            seconds += sum(have[(m["n_attn"], m["n_act"])].get("seconds") or 0 for m in r["measured"])
        fit["pipeline"] = halved.to_dict()
        fit["pipeline_pick"] = f"{halved.winner[0]}+{halved.winner[1]}"
        fit["verify_images"] = round(halved.spent * checks.unit.images)
        # what the same checks would have cost with every selection from scratch (no first removals shared)
        fit["verify_images_unshared"] = round((halved.spent - checks.selections_cost(best)
                                               + sum(checks.selection_cost(s) for s in best)) * checks.unit.images)
        fit["verify_seconds"] = round(seconds, 1)
        fit["verify_count"] = len(best)


def units(bench: str, seed: int, schemes: list[str], targets: list[str], out: Path,
          extra: list[str] = ()) -> list[dict]:
    """Several schemes of one (benchmark, seed) one after the other: schemes whose paths share points (the
    progressive variants' axis paths) must not walk them at the same time in two processes."""
    return [unit(bench, seed, scheme, targets, out, extra) for scheme in schemes]


def groups(schemes: list[str]) -> list[list[str]]:
    """The schemes in groups that share no point with another group (same point_finetune, same paths)."""
    found: dict = {}
    for name in schemes:
        sets = SCHEMES[name]
        family = (next((x for x in sets if x.startswith("hetdpt.point_selection=")), ""),
                  next((x for x in sets if x.startswith("hetdpt.point_finetune=")), ""))
        found.setdefault(family, []).append(name)
    return list(found.values())


def _units_star(args):
    return units(*args)


# -- phase 3: the tables -----------------------------------------------------------------------------------

def kendall(pred: list[float], true: list[float]) -> float | None:
    from scipy.stats import kendalltau

    if len(pred) < 2:
        return None
    tau = kendalltau(pred, true).statistic
    return None if tau != tau else float(tau)


def score(results: list[dict], truths: dict, final: dict) -> list[dict]:
    """One row per (benchmark, target, scheme, predictor): picks per seed, regrets, Kendall tau, costs."""
    rows = []
    keyed = {}
    for u in results:
        keyed.setdefault((u["bench"], u["scheme"]), []).append(u)
    for (bench, scheme), us in sorted(keyed.items()):
        for target in TARGETS[bench]:
            t = truths.get((bench, target))
            if t is None or not all(target in u["per_target"] for u in us):
                continue
            true = {k: v["true"] for k, v in ((f"{a}+{m}", t["splits"][(a, m)]) for a, m in map(tuple, t["pairs"]))}
            best = max(true, key=lambda k: (true[k], -int(k.split("+")[0])))
            for label in PREDICTORS:
                per = []
                for u in sorted(us, key=lambda u: u["seed"]):
                    pt = u["per_target"][target]
                    fit = pt["fits"][label]
                    if "error" in fit:
                        per = None
                        break
                    pred = fit["predicted"]
                    pick = max(true, key=lambda k: (pred[k], -int(k.split("+")[0])))   # ties: fewer attention
                    checked = fit.get("verified")
                    if checked:   # hetdpt.verify: the best of the checked splits
                        pick = max(checked, key=lambda k: (checked[k], -int(k.split("+")[0])))
                    if fit.get("pipeline_pick"):   # verify_by pipeline: successive halving's winner
                        pick = fit["pipeline_pick"]
                    keys = sorted(true)
                    own = {k: t["splits"][tuple(map(int, k.split("+")))]["per_seed"].get(str(u["seed"]))
                           for k in true}   # this seed's own truth rows: what this very run would have made
                    per.append({"seed": u["seed"], "pick": pick, "true_of_pick": true[pick],
                                "regret": true[best] - true[pick],
                                "own_seed_regret": None if None in own.values() else max(own.values()) - own[pick],
                                "kendall": kendall([pred[k] for k in keys], [true[k] for k in keys]),
                                "images": pt["images"] + fit.get("verify_images", 0),
                                "seconds": pt["seconds"] + fit.get("verify_seconds", 0),
                                "points": len(pt["points"]) + len(checked or ()) + fit.get("verify_count", 0),
                                **({"degree": fit["fit"].get("degree"),
                                    "cv_rmse": (fit["fit"].get("cv_rmse") or {}).get(str(fit["fit"].get("degree")))}
                                   if label.startswith("poly") else {})})
                if not per:
                    continue
                taus = [p["kendall"] for p in per if p["kendall"] is not None]
                rows.append({
                    "bench": bench, "target": target, "scheme": scheme, "predictor": label, "best": best,
                    "best_true": true[best], "seeds": per,
                    "mean_regret": statistics.mean(p["regret"] for p in per),
                    "mean_own_seed_regret": (statistics.mean(p["own_seed_regret"] for p in per)
                                             if all(p["own_seed_regret"] is not None for p in per) else None),
                    "mean_kendall": statistics.mean(taus) if taus else None,
                    "images": statistics.mean(p["images"] for p in per),
                    "images_share": statistics.mean(p["images"] for p in per) / final["images"][bench],
                    "seconds": statistics.mean(p["seconds"] for p in per),
                    "seconds_share": (statistics.mean(p["seconds"] for p in per) / final["seconds"][bench]
                                      if final["seconds"].get(bench) else None)})
    return rows


def slim(results: list[dict]) -> list[dict]:
    """The units as the results file keeps them: each point as (n_attn, n_act, metric, images, seconds, path)
    and each fit's predictions, verified values and degree choice (the full records stay under --out)."""
    out = []
    for u in results:
        per = {}
        for target, pt in u["per_target"].items():
            fits = {label: {k: v for k, v in fit.items() if k != "fit"} | (
                {"fit": {k: v for k, v in fit["fit"].items() if k in ("degree", "cv_rmse", "rmse", "loo_mae")}}
                if "fit" in fit else {}) for label, fit in pt["fits"].items()}
            per[target] = {"images": pt["images"], "seconds": pt["seconds"],
                           "points": [[p["n_attn"], p["n_act"], metric_of(p), p.get("images"), p.get("seconds"),
                                       p.get("path")] for p in pt["points"]], "fits": fits}
        out.append({k: u[k] for k in ("bench", "seed", "scheme", "sets")} | {"per_target": per})
    return out


def choose(rows: list[dict], floors: dict, shares: dict[str, float] | None = None) -> dict:
    """The default: the (scheme, predictor) with the lowest worst-target excess regret (its mean regret minus
    the target's seed-noise floor, ``floors[(bench, target)]``) among the affordable; ties: the lower mean
    regret over every target, then the cheaper.

    Affordable is issue 58's line: the scheme's points and checks spend at most COST_LINE of a DeiT-B run, as
    ``shares`` counts it (`deit_b_shares`); a scheme it does not count cannot be shown to meet the line, so it
    is not affordable. The toy-scale cost (x the one-shot points' images) stays a column; it decides (issue
    43's COST_CAP) only when nothing is counted at DeiT-B scale, as in a study without plan_costs.json."""
    shares = shares or {}
    base = {(r["bench"], r["target"]): r["images"] for r in rows if r["scheme"] == BASELINE}
    combos: dict = {}
    for r in rows:
        combos.setdefault((r["scheme"], r["predictor"]), []).append(r)
    ranking = []
    for (scheme, predictor), rs in combos.items():
        ratio = max(r["images"] / base[(r["bench"], r["target"])] for r in rs if (r["bench"], r["target"]) in base)
        excess = {id(r): r["mean_regret"] - floors.get((r["bench"], r["target"]), 0.0) for r in rs}
        worst = max(rs, key=lambda r: excess[id(r)])
        ranking.append({"scheme": scheme, "predictor": predictor, "worst_excess": excess[id(worst)],
                      "worst_mean_regret": max(r["mean_regret"] for r in rs),
                      "worst_target": f"{worst['bench']} {worst['target']}", "cost_ratio": ratio,
                      "mean_regret": statistics.mean(r["mean_regret"] for r in rs),
                      "deit_b_share": shares.get(scheme),
                      "affordable": (shares.get(scheme, math.inf) <= COST_LINE + 1e-9 if shares
                                     else ratio <= COST_CAP + 1e-9),
                      "all_within_goal": all(v <= GOAL + 1e-9 for v in excess.values()),
                      "targets": len(rs)})
    ranking.sort(key=lambda c: (not c["affordable"], c["worst_excess"], c["mean_regret"], c["cost_ratio"]))
    return {"ranking": ranking, "chosen": next((c for c in ranking if c["affordable"]), None)}


def target_words(target: str) -> str:
    return f"budget {target[1:]}" if target.startswith("b") else f"MACs {target[len('macs'):]}"


def markdown(result: dict) -> str:
    rows = result["rows"]
    lines = ["# MAP points and predictors against full fine-tunes", "",
             f"Produced by `{result['command']}`.", "",
             machine_line(result) + " for this pass, which reused what earlier passes of the same "
             f"command made under --out: {result['work']['truth_rows_s']} s of truth rows and "
             f"{result['work']['points_s']} s of points and checks (summed over the 2 processes; other work shared "
             "the machine: accuracy does not depend on load, seconds do). Per benchmark (truth rows + points and "
             "checks, single-threaded seconds): " + "; ".join(
                 f"{b}: {w['truth_rows_s']} + {w['points_s']} s" for b, w in result["work"].get("per_benchmark",
                                                                                             {}).items()) + ".",
             "", "Base models: " + "; ".join(f"{b}: {i}" for b, i in result["bases"].items()) + ".", "",
             *([f"Schemes whose points and checks were not run by this pass: their units (fits, picks and costs) "
                f"are {', '.join(f'`{k}` from {v}.json' for k, v in result['reused_units'].items())}, made on the "
                f"same base models, settings and seeds, scored here against the same truth.", ""]
               if result.get("reused_units") else []),
             *([f"Settings on top of the defaults, for the truth rows and every scheme: "
                f"{', '.join(f'`{x}`' for x in result['sets'])}.", ""] if result.get("sets") else []),
             "Ground truth per target: every feasible split pruned (gate-taylor) and fine-tuned on the final "
             "schedule, mean top-1 over the seeds; regret = the best split's true top-1 minus the pick's (points); "
             "Kendall tau between predicted and true values over the feasible splits; cost = images through the "
             "points' fine-tunes (x one final fine-tune's "
             + ", ".join(f"{b}: {n}" for b, n in result["final"]["images"].items())
             + " images) and seconds (x one truth row's median wall time, selection and fine-tune: "
             + ", ".join(f"{b}: {s:.1f} s" for b, s in result["final"]["seconds"].items() if s) + ").", "",
             "Truth: " + "; ".join(f"{b} {target_words(t)}: {n}" for (b, t), n in
                                  ((tuple(k.split("|")), v["note"]) for k, v in result["truth"].items())) + ".", ""]
    by = {(r["scheme"], r["predictor"], r["bench"], r["target"]): r for r in rows}
    ranked = {(c["scheme"], c["predictor"]): c for c in result["choice"]["ranking"]}
    cols = studied_targets(result)
    lines += ["## Headline", "", "Mean regret per target (points, over the seeds), the worst target's excess over "
              "its seed-noise floor (the last row) and the points' and checks' cost against the one-shot points' "
              "(the worst target's ratio of images):", ""]
    headline = []
    for label, scheme, predictor in highlights(result):
        c = ranked[(scheme, predictor)]
        cells = ["-" if (scheme, predictor, b, t) not in by else f"{by[(scheme, predictor, b, t)]['mean_regret']:.2f}"
                 for b, t in cols]
        headline.append([label, f"{scheme} / {predictor}", *cells, f"{c['worst_excess']:.2f}",
                         f"{c['cost_ratio']:.2f}x"])
    oracle = floors_of(result["oracle"])
    headline.append(["seed noise alone", "each seed's own best split",
                     *(f"{oracle[k]:.2f}" if k in oracle else "-" for k in cols), f"{max(oracle.values()):.2f}",
                     "(every split fine-tuned)"])
    lines += table(["row", "scheme / predictor",
                    *(f"{b} {target_words(t)}{' (unstudied)' if (b, t) in UNSTUDIED else ''}" for b, t in cols),
                    "worst excess over the floor", "cost"], headline)
    lines += ["", "## The schemes", "",
              *table(["scheme", "its points", "settings"],
                     [[name, WORDS.get(name, ""), " ".join(f"`--set {x}`" for x in sets)]
                      for name, sets in result["schemes"].items()])]
    lines += ["", "Predictors: " + ", ".join(f"`{label}` ({name}{' ' + json.dumps(o) if o else ''})"
                                          for label, (name, o) in PREDICTORS.items()) + ".", ""]
    for scheme in result["schemes"]:   # what the pipeline checks' shared first removals saved
        fits = [f for u in result["units"] if u["scheme"] == scheme for pt in u["per_target"].values()
                for f in pt["fits"].values() if f.get("verify_images_unshared")]
        if fits:
            spent, alone = sum(f["verify_images"] for f in fits), sum(f["verify_images_unshared"] for f in fits)
            lines += [f"{scheme}: its checks cost {spent:,} images over every target, seed and predictor, against "
                      f"{alone:,} with every selection from scratch: the first removals the selections share, "
                      f"trained once, saved {1 - spent / alone:.0%}.", ""]
    lines += choice_lines(result, cols)
    lines += ["", "## Every row", "",
              "Regret on its own seed: the best of that seed's truth rows minus that seed's row at the pick (the "
              "model this very run would have made against the best it could have made).", ""]
    every = []
    for r in sorted(rows, key=lambda r: (list(TARGETS).index(r["bench"]), TARGETS[r["bench"]].index(r["target"]),
                                         list(SCHEMES).index(r["scheme"]) if r["scheme"] in SCHEMES else 99,
                                         list(PREDICTORS).index(r["predictor"]))):
        picks = ", ".join(f"{p['pick']} ({p['true_of_pick']:.1f})" for p in r["seeds"])
        tau = "-" if r["mean_kendall"] is None else f"{r['mean_kendall']:.2f}"
        degree = ", ".join(f"{p['degree']} ({p['cv_rmse']:.2f})" if p.get("cv_rmse") is not None else
                           str(p.get("degree")) for p in r["seeds"]) if r["predictor"].startswith("poly") else "-"
        secs = f"{r['seconds']:.0f} ({r['seconds_share']:.1f}x)" if r["seconds_share"] else f"{r['seconds']:.0f}"
        own = "-" if r["mean_own_seed_regret"] is None else f"{r['mean_own_seed_regret']:.2f}"
        every.append([r["bench"], target_words(r["target"]), f"{r['best']} ({r['best_true']:.1f})", r["scheme"],
                      r["predictor"], picks, f"{r['mean_regret']:.2f}", own, tau,
                      f"{statistics.mean(p['points'] for p in r['seeds']):.0f}",
                      f"{r['images']:.0f} ({r['images_share']:.1f}x)", secs, degree])
    lines += table(["benchmark", "target", "best split (true %)", "scheme", "predictor", "picks per seed (true %)",
                    "mean regret", "on its own seed", "Kendall tau", "points", "images (x final FT)",
                    "seconds (x truth row)", "poly degree (CV RMSE)"], every)
    lines += ["", "## What seed noise alone costs", "",
              "Each seed picks the best split of its own truth rows (the real pipeline, every split measured on "
              "that seed); regret against the mean over seeds, as above. No point scheme measured on one seed "
              "can expect to beat this by much.", "",
              *table(["benchmark", "target", "best split (mean)", "each seed's own best (true %)", "mean regret"],
                     [[o["bench"], target_words(o["target"]), f"{o['best']} ({o['best_true']:.1f})",
                       ", ".join(f"{p['pick']} ({p['true_of_pick']:.1f})" for p in o["seeds"]),
                       f"{o['mean_regret']:.2f}"] for o in result["oracle"]])]
    landscapes = []
    for key, t in result["truth"].items():
        b, target = key.split("|")
        landscapes.append([b, target_words(target),
                           ", ".join(f"{s}: {v['true']:.1f} ± {v['std']:.1f}" for s, v in t["splits"].items())])
    lines += ["", "## The true landscapes", "",
              *table(["benchmark", "target", "splits (attn+act): true top-1 % (± std over seeds)"], landscapes)]
    return "\n".join(lines) + "\n"


def choice_lines(result: dict, cols: list[tuple[str, str]]) -> list[str]:
    """The rule's table (every scheme and predictor ranked, the pick in bold) and the mean regret per target:
    the part of the report a pass and a combination of passes (``--combine``) share."""
    pick = result["choice"]["chosen"]
    shares = any("deit_b_share" in c for c in result["choice"]["ranking"])   # a DeiT-B column where counted
    lines = ["## The choice", "",
              "The default is the scheme and predictor with the lowest worst-target excess regret (mean regret minus "
              "the target's seed-noise floor) whose points and checks "
              + (f"spend at most {COST_LINE:.0%} of a DeiT-B run (issue 58's line), as benchmarks/plan_costs.py "
                 "counts it: its `--config deit-b-paper` run, budget 10, ImageNet-1k's sizes, as `--plan` counts "
                 "it. A scheme it does not count (-) cannot be shown to meet the line. The cost at toy scale is a "
                 "column, not the rule." if shares else
                 f"cost at most {COST_CAP}x the `{BASELINE}` points' images at every target (issue 43's cap: "
                 "nothing here is counted at DeiT-B scale)."), ""]
    ranking = []
    for c in result["choice"]["ranking"]:
        mark = "**" if pick and (c["scheme"], c["predictor"]) == (pick["scheme"], pick["predictor"]) else ""
        share = ([f"{c['deit_b_share']:.1%}" if c["deit_b_share"] is not None else "-"]
                 if "deit_b_share" in c else [])
        ranking.append([f"{mark}{c['scheme']}{mark}", f"{mark}{c['predictor']}{mark}", f"{c['worst_excess']:.2f}",
                        c["worst_target"], f"{c['worst_mean_regret']:.2f}", f"{c['mean_regret']:.2f}",
                        f"{c['cost_ratio']:.2f}x", *share, "yes" if c["affordable"] else "no",
                        "yes" if c["all_within_goal"] else "no"])
    lines += table(["scheme", "predictor", "worst excess over the floor", "at", "worst mean regret",
                    "mean over targets", f"cost vs {BASELINE} (worst target)",
                    *(["share of the DeiT-B run"] if shares else []), "affordable",
                    f"every target ≤ floor + {GOAL}"], ranking)
    lines += ["", ("**Chosen: " + f"`{pick['scheme']}` points with `{pick['predictor']}`" + "**"
                   + (f" (worst-target excess over the seed-noise floor {pick['worst_excess']:.2f}; "
                      f"{'every' if pick['all_within_goal'] else 'not every'} target within {GOAL} point of "
                      "its floor).")
                   ) if pick else "**No scheme is affordable.**", ""]
    by = {(r["scheme"], r["predictor"], r["bench"], r["target"]): r for r in result["rows"]}
    per_target = []
    for c in result["choice"]["ranking"]:
        cells = []
        for b, t in cols:
            r = by.get((c["scheme"], c["predictor"], b, t))
            cells.append("-" if r is None else f"{r['mean_regret']:.2f}")
        per_target.append([c["scheme"], c["predictor"], *cells])
    lines += ["## Mean regret per target (points; mean over seeds)", "",
              *table(["scheme", "predictor", *(f"{b} {target_words(t)}" for b, t in cols)], per_target)]
    return lines


def studied_targets(result: dict) -> list[tuple[str, str]]:
    """The (benchmark, target) columns this result holds, in TARGETS' order."""
    have = {tuple(k.split("|")) for k in result["truth"]}
    return [(b, t) for b in TARGETS for t in TARGETS[b] if (b, t) in have]


def highlights(result: dict) -> list[tuple[str, str, str]]:
    """The rows the plot and the docs show: (label, scheme, predictor) of the chosen default, the default
    before it (progressive points, gp, 3 checks), pipeline checks, one-shot points, the paper's (progressive
    points, poly with CV's degree), the best at any cost and the lowest mean regret among the affordable;
    only those the result holds, one row per (scheme, predictor) with its labels joined."""
    ranking = result["choice"]["ranking"]
    have = {(c["scheme"], c["predictor"]) for c in ranking}
    pick = result["choice"]["chosen"]
    best_any = min(ranking, key=lambda c: (c["worst_excess"], c["mean_regret"]))
    rows = [("chosen default", pick["scheme"], pick["predictor"])] if pick else []
    rows += [("the default before issue 43: progressive, gp, 3 checks", "progressive-verify3", "gp"),
             ("pipeline checks (3, halving), gp", "progressive-pipeline3", "gp"),
             ("the default before issue 58: one-shot points, local", "oneshot", "local"),
             ("checks sized in images (3, halving), local", "oneshot-pipeline3-img", "local"),
             ("the same only on a near-tie, local", "oneshot-unsure3-img", "local"),
             ("the paper's: progressive, poly (CV degree)", "progressive", "poly (auto)"),
             (f"best at any cost ({best_any['cost_ratio']:.1f}x)", best_any["scheme"], best_any["predictor"])]
    affordable = [c for c in ranking if c["affordable"]]
    if affordable:
        best_mean = min(affordable, key=lambda c: c["mean_regret"])
        rows.append(("lowest mean regret over targets among the affordable", best_mean["scheme"],
                     best_mean["predictor"]))
    merged: dict[tuple[str, str], list[str]] = {}
    for label, scheme, predictor in rows:
        if (scheme, predictor) in have:
            merged.setdefault((scheme, predictor), []).append(label)
    return [("; ".join(labels), scheme, predictor) for (scheme, predictor), labels in merged.items()]


def combine(names: list[str], results: Path) -> dict:
    """Several passes' results (NAME.json under ``results``) as one study: their rows, seed-noise floors and
    truth notes over every target they hold, and the rule applied over all of them. Passes must not share a
    target (each target's rows and floor come from the one pass that studied it) and must run the same seeds."""
    parts = [json.loads((results / f"{n}.json").read_text()) for n in names]
    seen: dict[str, str] = {}
    for name, part in zip(names, parts):
        for key in part["truth"]:
            if key in seen:
                raise SystemExit(f"{key.replace('|', ' ')} is in both {seen[key]}.json and {name}.json: combine "
                                 "passes that studied different targets")
            seen[key] = name
    seeds = {name: sorted({p["seed"] for o in part["oracle"] for p in o["seeds"]}) for name, part in zip(names, parts)}
    if len({tuple(v) for v in seeds.values()}) > 1:
        raise SystemExit("the passes ran different seeds: " + "; ".join(f"{n}: {v}" for n, v in seeds.items()))
    rows = [r for part in parts for r in part["rows"]]
    result = {"command": ("python benchmarks/map_points.py " + shlex.join(sys.argv[1:])).strip(),
              "combined": names, "rows": rows, "oracle": [o for part in parts for o in part["oracle"]],
              "truth": {k: {"note": v["note"]} for part in parts for k, v in part["truth"].items()},
              "name": None, "seeds": next(iter(seeds.values())),
              "schemes": {k: v for part in parts for k, v in part.get("schemes", {}).items()},
              "predictors": {k: v for part in parts for k, v in part.get("predictors", {}).items()}}
    result["choice"] = choose(rows, floors_of(result["oracle"]), deit_b_shares())
    return result


def combined_markdown(result: dict) -> str:
    cols = studied_targets(result)
    floors = floors_of(result["oracle"])
    lines = ["# MAP points and predictors against full fine-tunes: passes combined", "",
             f"Produced by `{result['command']}` from "
             + ", ".join(f"[{n}.md]({n}.md)" for n in result["combined"])
             + f" (their machines, loads, commands and every row are there); seeds {result['seeds']}. Each "
             "target's rows and seed-noise floor come from the pass that studied it; the rule below is applied over "
             "every target of every pass.", "",
             "Seed-noise floor per target (mean regret of each seed's own best split): "
             + "; ".join(f"{b} {target_words(t)} {floors[(b, t)]:.2f}" for b, t in cols) + ".", ""]
    return "\n".join(lines + choice_lines(result, cols)) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["scheme"], r["predictor"], r["bench"], r["target"]): r["mean_regret"] for r in result["rows"]}
    oracle = floors_of(result["oracle"])
    targets = studied_targets(result)
    series = [(f"{label}: {scheme} / {predictor}", [by.get((scheme, predictor, b, t), float("nan"))
                                                    for b, t in targets]) for label, scheme, predictor in
              highlights(result)]
    series.append(("each seed's own best split (seed noise alone)", [oracle.get(k, float("nan")) for k in targets]))
    fig, ax = plt.subplots(figsize=(10, 4.6))
    width = 0.8 / len(series)
    for i, (label, ys) in enumerate(series):
        ax.bar([j + i * width for j in range(len(targets))], ys, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(targets))])
    ax.set_xticklabels([f"{b}\n{target_words(t)}" for b, t in targets], fontsize=7)
    ax.set_ylabel("mean regret over seeds (top-1 points)")
    ax.set_title(f"MAP's pick against every split fully fine-tuned (goal: the seed-noise bar + {GOAL}; every row: "
                 f"{result['name']}.md)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchmarks", default=",".join(TARGETS))
    p.add_argument("--targets", default=None, help="only these targets (e.g. b12,macs0.45, or digits:macs0.45 for "
                                                   "one benchmark's), else every studied one")
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--phase", default="all", choices=("truth", "points", "report", "all"))
    p.add_argument("--jobs", type=int, default=2, help="single-threaded processes (truth rows, then units)")
    p.add_argument("--out", default="runs/map-points")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--name", default="map-points", help="the results files' name (NAME.md, NAME.json, NAME.png)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting on top of the defaults for the truth rows and every scheme (repeatable), "
                        "e.g. scoring.subset=1000; use its own --out")
    p.add_argument("--reuse-from", default=None, metavar="NAME",
                   help="an earlier study's results (NAME.json under --results, same --set): its truth where one "
                        "of its rows is reproduced here exactly, and its units of the schemes not in --schemes")
    p.add_argument("--combine", default=None, metavar="NAME,NAME,...",
                   help="run nothing: apply the rule over the targets of these earlier passes (NAME.json under "
                        "--results), written as --name")
    args = p.parse_args()
    if args.combine:
        result = combine([n for n in args.combine.split(",") if n], Path(args.results))
        result["name"] = args.name
        write(args.results, args.name, result, combined_markdown(result))
        return 0

    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    benches = [b for b in args.benchmarks.split(",") if b]
    wanted = [t for t in (args.targets or "").split(",") if t]   # "macs0.45" (every benchmark) or "digits:b12"

    def studied(bench: str, target: str) -> bool:
        return not wanted or target in wanted or f"{bench}:{target}" in wanted

    targets = {b: [t for t in TARGETS[b] if studied(b, t)] for b in benches}
    seeds = [int(s) for s in args.seeds.split(",")]
    schemes = [s for s in args.schemes.split(",") if s]
    for s in schemes:
        if s not in SCHEMES:
            raise SystemExit(f"unknown scheme {s!r}; studied schemes: {', '.join(SCHEMES)}")
    load_start, started = load(), time.time()
    log = lambda m: print(m, flush=True)   # noqa: E731

    earlier = json.loads((Path(args.results) / f"{args.reuse_from}.json").read_text()) if args.reuse_from else {}
    truths, bases, final = {}, {}, {"images": {}, "seconds": {}}
    if args.phase in ("truth", "all", "report", "points"):
        for bench in benches:
            ctx = context(bench, args.sets)
            bases[bench] = f"{ctx.info.get('source')}, {ctx.info.get('weights', 'weights ?')}, dense top-1 " \
                           f"{ctx.info['metric']:.2f} %"
            final["images"][bench] = final_images(ctx)
            walls = []
            for target in targets[bench]:
                log(f"== truth: {bench} {target}")
                t = (earlier and reused_truth(ctx, target, seeds, out, args.jobs, log, earlier, args.reuse_from,
                                              bases[bench])) or truth(ctx, target, seeds, out, args.jobs, log)
                truths[(bench, target)] = t
                walls += [t["row_seconds"]] if t["row_seconds"] else []
            final["seconds"][bench] = statistics.median(walls) if walls else None
    if args.phase == "truth":
        return 0

    done = []
    todo = [(b, s, group, targets[b], out, args.sets) for b in benches for s in seeds for group in groups(schemes)]
    if args.jobs > 1 and len(todo) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(_units_star, t): t for t in todo}
            for fut in as_completed(futures):
                done += fut.result()
                b, seed, group = futures[fut][:3]
                log(f"== points done: {b} seed {seed} {', '.join(group)}")
    else:
        for t in todo:
            done += units(*t)
            log(f"== points done: {t[0]} seed {t[1]} {', '.join(t[2])}")
    if args.phase == "points":
        return 0

    borrowed = reused_units(earlier, benches, seeds, schemes, args.sets) if earlier else []
    done += borrowed
    rows = score(done, truths, final)
    def stored_seconds(bench: str) -> float:   # every point and check stored for the benchmark under --out
        return sum(json.loads(line).get("seconds", 0) for name in ("map-points.jsonl", "map-checks.jsonl",
                                                                   "map-pipeline-checks.jsonl")
                   if (out / bench / "points" / name).is_file()
                   for line in (out / bench / "points" / name).read_text().splitlines() if line)

    per_bench = {b: {"truth_rows_s": round(sum(t["row_seconds_total"] for (tb, _), t in truths.items() if tb == b)),
                     "points_s": round(stored_seconds(b))} for b in benches}
    work = {"truth_rows_s": sum(v["truth_rows_s"] for v in per_bench.values()),
            "points_s": sum(v["points_s"] for v in per_bench.values()), "per_benchmark": per_bench}
    result = {
        "command": ("python benchmarks/map_points.py " + shlex.join(sys.argv[1:])).strip(),
        "machine": machine(), "load_start": load_start, "load_end": load(),
        "seconds": time.time() - started, "work": work, "bases": bases, "final": final,
        "truth": {f"{b}|{t}": {**v, "splits": {f"{a}+{m}": s for (a, m), s in v["splits"].items()}}
                  for (b, t), v in truths.items()},
        "schemes": {s: SCHEMES[s] for s in [*schemes, *dict.fromkeys(u["scheme"] for u in borrowed)]},
        "reused_units": {s: args.reuse_from for s in dict.fromkeys(u["scheme"] for u in borrowed)},
        "predictors": PREDICTORS, "rows": rows,
        "oracle": oracle_rows(truths), "units": slim(done), "name": args.name, "sets": args.sets,
    }
    result["choice"] = choose(rows, floors_of(result["oracle"]), deit_b_shares())
    results = write(args.results, args.name, result, markdown(result))
    plot(result, results / f"{args.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
