"""Issue 71, item 3: ``--plan`` counts stage 1 as the run does it. For several check settings and budgets on a
tiny model, the plan's stage-1 rows equal what the run then trained and evaluated, counted as it happens
(every fine-tune's images and every evaluation on the choice split), not estimated."""

from __future__ import annotations

import pytest

import hetprune
from hetprune.harness.testing import tiny_job
from hetprune.plugin_api import epoch_images, val_size
from hetprune_hetdpt.halving import PipelineChecks
from hetprune_hetdpt.strategy import HetDPT

POINTS = {"point_selection": "oneshot", "point_finetune": "short_finetune", "axis_points": 2, "mixed_points": 1}
CASES = {
    "checks of every split, auto": (4, {"verify": 4, "verify_images": "auto"}),
    "checks of every split, 100 images": (4, {"verify": 4, "verify_images": 100}),
    "spread checks, auto": (4, {**POINTS, "verify": 2}),
    "best checks, a budget that halves": (4, {**POINTS, "verify": 3, "verify_among": "best", "verify_images": 60}),
    "no checks": (2, {**POINTS, "verify": 0, "predictor": "local"}),
    "no checks, a plane": (1, {**POINTS, "verify": 0}),
    "progressive points, the paper's": (3, {"point_selection": "progressive", "verify": 0, "predictor": "local"}),
    "progressive points, spread checks": (3, {"point_selection": "progressive", "verify": 2}),
    "checks of every split, gate-taylor selections": (4, {"verify": 4, "verify_images": "auto"}, "gate-taylor"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_plans_stage_1_rows_are_what_the_run_trains_and_evaluates(case, tmp_path, monkeypatch):
    sites, hetdpt, scorer = (*CASES[case], "taylor")[:3]
    job = tiny_job(hetprune.Budget(sites=sites), tmp_path, HetDPT,
                   {"scorer": scorer, "hetdpt": {**({"verify_selection": 1.0} if hetdpt["verify"] else {}),
                                                   **hetdpt}})
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
    assert counted == {"fine_tunes": sum(s.fine_tunes for s in planned),
                       "train_images": sum(s.train_images for s in planned),
                       "eval_images": sum(s.eval_images for s in planned)}, planned
