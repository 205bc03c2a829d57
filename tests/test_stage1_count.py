"""Issue 71, item 3: ``--plan`` counts stage 1 as the run does it. For several check settings and budgets on a
tiny model, the plan's stage-1 rows equal what the run then trained and evaluated, counted as it happens
(every fine-tune's images and every evaluation on the choice split), not estimated."""

from __future__ import annotations

import pytest

import hetprune
from hetprune.harness.testing import tiny_job
from hetprune.pruning.plan import epoch_images, val_size
from hetprune_hetdpt.halving import PipelineChecks
from hetprune_hetdpt.predictors import LocalPredictor
from hetprune_hetdpt.strategy import HetDPT

POINTS = {"point_selection": "oneshot", "point_finetune": "short_finetune", "axis_points": 2, "mixed_points": 1}


def checks(policy: str, **options) -> dict:
    """A pipeline checks policy whose candidates select as the final run does (the whole scoring subset)."""
    return {"checks": policy, "checks_options": {policy: {"selection": 1.0, **options}}}


CASES = {
    "checks of every split, auto": (4, checks("all")),
    "checks of every split, 100 images": (4, checks("all", budget=100)),
    "spread checks as many as the splits": (4, checks("spread", count=4)),
    "spread checks, auto": (4, {**POINTS, **checks("spread", count=2)}),
    "best checks, a budget that halves": (4, {**POINTS, **checks("best", count=3, budget=60)}),
    "no checks": (2, {**POINTS, "checks": "none", "predictor": "local"}),
    "no checks, a plane": (1, {**POINTS, "checks": "none"}),
    "progressive points, the paper's": (3, {"point_selection": "progressive", "checks": "none", "predictor": "local"}),
    "progressive points, spread checks": (3, {"point_selection": "progressive", **checks("spread", count=2)}),
    "checks of every split, gate-taylor selections": (4, checks("all"), "gate-taylor"),
    # near ties: counted as if they run, which they do where the predictor is unsure of every split
    "near-ties checks, all unsure": (4, {**POINTS, "predictor": "local", **checks("near-ties", count=3, budget=60)}),
    "progressive points, checks as points": (3, {"point_selection": "progressive", "predictor": "local",
                                                 "checks": "points", "checks_options": {"points": {"count": 2}}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_plans_stage_1_rows_are_what_the_run_trains_and_evaluates(case, tmp_path, monkeypatch):
    sites, hetdpt, scorer = (*CASES[case], "taylor")[:3]
    if hetdpt["checks"] == "near-ties":   # unsure of every split: the near ties are all the candidates
        monkeypatch.setattr(LocalPredictor, "fit_report", lambda self: {"loo_mae": 1e9})
    job = tiny_job(hetprune.Budget(sites=sites), tmp_path, HetDPT,
                   {"scorer": scorer, "hetdpt": hetdpt})
    planned = [s for s in HetDPT().plan_allocation(job) if s.stage.startswith("stage 1")]
    counted = {"fine_tunes": 0, "train_images": 0, "eval_images": 0}
    task = job.task
    evaluate = task.evaluate

    def fit(model, teacher, cfg, *args, **kwargs):   # the fine-tune's images, as its loader would read them
        counted["fine_tunes"] += 1
        counted["train_images"] += cfg.epochs * epoch_images(cfg, task.train_size)

    def evaluated(model, *args, split="val", **kwargs):
        counted["eval_images"] += val_size(task, split)
        return evaluate(model, *args, split=split, **kwargs)

    monkeypatch.setattr(task, "fit", fit)
    monkeypatch.setattr(task, "evaluate", evaluated)
    HetDPT().allocate(job)
    assert counted["train_images"] > 0 and counted["eval_images"] > 0
    if scorer == "gate-taylor":   # its gate phases train in its own loop, not task.fit: counted as it plans them,
        # the removals the candidates share once, less the winner's (the select stage's gate phase, counted there)
        checks = PipelineChecks(job)
        sites = HetDPT().plan_sites(job)
        gates = checks.selections_cost(sorted(job.feasible_pairs())) - checks.selection_cost(
            (sites - sites // 2, sites // 2))
        assert gates > 0
        counted["train_images"] += int(gates * checks.unit.images)
    plan = {"fine_tunes": sum(s.fine_tunes for s in planned), "train_images": sum(s.train_images for s in planned),
            "eval_images": sum(s.eval_images for s in planned)}
    if hetdpt["checks"] == "points":   # which splits, and so how many path steps, is known only after the fit:
        # counted at the most they cost, which the run reaches where its candidates are the costliest
        assert all(counted[k] <= plan[k] for k in plan) and counted["eval_images"] == plan["eval_images"], planned
        return
    assert counted == plan, planned
