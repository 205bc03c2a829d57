"""MAP point schemes (progressive paths with inherited weights, one-shot, gradual), their keys, the poly
degree chosen by cross-validation, and budgets with a single feasible split."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import hetprune
import hetprune.training.task  # noqa: F401 - its train is what the stub fine-tunes below replace
from hetprune.pruning.budget import Budget
from hetprune.cli import main
from hetprune.pruning.pipeline import PruneJob
from hetprune.core.plugins import get_registry

from hetprune_hetdpt.paths import paths_for
from hetprune_hetdpt.predictors import PolyPredictor
from hetprune_hetdpt.strategy import HetDPT

PROGRESSIVE = {"hetdpt.point_selection": "progressive", "scoring.subset": 16, "scoring.batches": 1}
GRADUAL = {"hetdpt.point_selection": "gradual"}


def make_job(model, data, folder, budget=Budget(sites=4), **changes):
    settings = hetprune.core.loader.resolve(HetDPT.defaults, overrides=None, sets=[f"{k}={v}" for k, v in changes.items()])
    return PruneJob(dense=model, spec=None, data=data, budget=budget, settings=settings, registry=get_registry(),
                    workdir=folder / "work", shared_dir=folder / "shared", base_info={"hash": "test"},
                    progress=False, log=lambda s: None, strategy_name="hetdpt")


class MarkingFinetune:
    """A stub fine-tune: records how many fine-tunes the model it is given has had (its class token, moved by
    exactly 1 per fine-tune) and the sites it lacks, then marks it as fine-tuned once more."""

    def __init__(self, dense, stop_at: int | None = None):
        self.start = float(dense.cls_token.detach()[0, 0, 0])
        self.seen: list[tuple[int, int]] = []   # (fine-tunes the model had, its removed sites) per call
        self.stop_at = stop_at

    def __call__(self, model, data, cfg, **kwargs):
        from hetprune.model import surgery
        from hetprune.model.sites import sites

        if self.stop_at is not None and len(self.seen) + 1 == self.stop_at:
            self.stop_at = None
            raise KeyboardInterrupt
        gone = sum(surgery.site_removed(model, s) for s in sites(model, present_only=False))
        self.seen.append((round(float(model.cls_token.detach()[0, 0, 0]) - self.start), gone))
        with torch.no_grad():
            model.cls_token.add_(1.0)
        return []


def path_points(points: list[dict], name: str) -> list[dict]:
    return sorted((p for p in points if p.get("path") == name), key=lambda p: p["step"])


def test_each_progressive_point_starts_from_the_previous_points_weights_and_removes_one_more_site(
        tiny_model, digits_data, tmp_path, monkeypatch):
    stub = MarkingFinetune(tiny_model)
    monkeypatch.setattr(hetprune.training.task, "train", stub)
    job = make_job(tiny_model, digits_data, tmp_path, **PROGRESSIVE)
    strategy = HetDPT()
    plan = strategy.point_plan(job, job.feasible_pairs())
    points = strategy.collect_points(job, plan)
    assert [(p["n_attn"], p["n_act"]) for p in points] == plan
    # step k+1 fine-tunes the model its path's step k left (k fine-tunes) with one more site off (k + 1)
    assert stub.seen == [(k, k + 1) for k in range(3)] + [(k, k + 1) for k in range(4)] * 2
    for name in ("attn", "act", "interleaved-act-first"):
        steps = path_points(points, name)
        assert steps, name
        for before, after in zip(steps, steps[1:]):
            assert after["sites"][:-1] == before["sites"] and after["sites"][-1] not in before["sites"]
    inter = path_points(points, "interleaved-act-first")
    assert [(p["n_attn"], p["n_act"]) for p in inter] == [(1, 1), (1, 2), (2, 2)]
    assert inter[0]["sites"][0].startswith("act") and inter[0]["fine_tunes"] == 2   # its first sub-step is paid here
    [dense] = [p for p in points if (p["n_attn"], p["n_act"]) == (0, 0)]
    assert dense["images"] == 0 and dense["sites"] == []


def test_an_interrupted_path_resumes_at_its_third_point_from_the_seconds_weights(tiny_model, digits_data, tmp_path,
                                                                                  monkeypatch):
    strategy = HetDPT()
    stub = MarkingFinetune(tiny_model, stop_at=3)
    monkeypatch.setattr(hetprune.training.task, "train", stub)
    job = make_job(tiny_model, digits_data, tmp_path, **PROGRESSIVE)
    plan = strategy.point_plan(job, job.feasible_pairs())
    with pytest.raises(KeyboardInterrupt):
        strategy.collect_points(job, plan)
    lines = [json.loads(line) for line in (tmp_path / "shared" / "map-points.jsonl").read_text().splitlines()]
    first_two = [p for p in lines if p.get("path") == "attn"]
    assert [p["step"] for p in first_two] == [1, 2]
    again = make_job(tiny_model, digits_data, tmp_path, **PROGRESSIVE)
    stub.seen.clear()
    points = strategy.collect_points(again, strategy.point_plan(again, again.feasible_pairs()))
    assert stub.seen[0] == (2, 3)                                   # step 3 from step 2's fine-tuned weights
    assert len(stub.seen) == 3 - 2 + 4 + 4                          # nothing of the first two is measured again
    assert path_points(points, "attn")[:2] == first_two             # reused, identical


def test_verify_checks_the_best_predicted_splits_from_the_nearest_path_point_they_contain(
        tiny_model, digits_data, tmp_path, monkeypatch):
    stub = MarkingFinetune(tiny_model)
    monkeypatch.setattr(hetprune.training.task, "train", stub)
    job = make_job(tiny_model, digits_data, tmp_path, budget=Budget(sites=3), **PROGRESSIVE,
                   **{"hetdpt.checks": "points", "hetdpt.checks_options": {"points": {"count": 2}},
                      "hetdpt.predictor": "gp"})
    pick, info = HetDPT().allocate(job)
    points = {(p["n_attn"], p["n_act"]): p for p in info["points"]}
    checked = info["verified"]
    assert len(checked) == 2
    for c in checked:
        a, m = c["n_attn"], c["n_act"]
        base = tuple(c["verified_from"])
        assert base[0] <= a and base[1] <= m and (base == (0, 0) or base in points)
        # the deepest path point it contains: none on the paths holds more of its removals
        assert not [p for p in points if p[0] <= a and p[1] <= m and sum(p) > sum(base)]
        assert c["sites"][:sum(base)] == points[base]["sites"] and len(c["sites"]) == a + m   # inherited order
        assert c["images"] == c["extra_steps"] * 150 * 2 + 300 * 3     # the steps, then the final schedule
    best = max(checked, key=lambda c: (c["metric"], -c["n_attn"]))
    assert pick == (best["n_attn"], best["n_act"]) and info["pick"]["verified"] == best["metric"]
    # as many fine-tunes as the paths' steps, each check's extra steps and one final fine-tune per check
    assert len(stub.seen) == 3 + 3 + 3 + sum(c["extra_steps"] + 1 for c in checked)
    # one-shot points: a check is a point of that split, reused where the plan measured it
    oneshot = make_job(tiny_model, digits_data, tmp_path / "oneshot", budget=Budget(sites=3),
                       **{"hetdpt.checks": "points", "hetdpt.checks_options": {"points": {"count": 2}},
                          "hetdpt.point_selection": "oneshot", "hetdpt.predictor": "gp"})
    stub.seen.clear()
    pick, info = HetDPT().allocate(oneshot)
    plan = {(p["n_attn"], p["n_act"]) for p in info["points"]}
    extra = {(c["n_attn"], c["n_act"]) for c in info["verified"]} - plan
    assert len(stub.seen) == len(plan) + len(extra) and pick in {(c["n_attn"], c["n_act"]) for c in info["verified"]}


def test_a_points_key_changes_with_everything_that_shapes_the_points(tiny_model, digits_data, tmp_path):
    def keys(**changes) -> dict:
        job = make_job(tiny_model, digits_data, tmp_path, **changes)
        scheme = HetDPT().scheme(job)
        out = {"points": scheme.key}
        if scheme.name == "progressive":
            scheme.plan(job.feasible_pairs())
            out.update({path.name.split("-")[0]: scheme.path_key(path) for path in scheme._paths})
        return out

    base = keys(**PROGRESSIVE)
    assert set(base) == {"points", "attn", "act", "interleaved"}
    for change in ({"short_finetune.lr": 1e-4}, {"hetdpt.point_scorer": "magnitude"}, {"scoring.subset": 32},
                   {"hetdpt.point_finetune": "finetune"}, {"seed": 1}):
        changed = keys(**{**PROGRESSIVE, **change})
        assert all(changed[p] != base[p] for p in ("attn", "act", "interleaved")), change
    order = keys(**{**PROGRESSIVE, "hetdpt.interleave_first": "attn"})   # the order shapes the interleaved path only
    assert order["interleaved"] != base["interleaved"] and (order["attn"], order["act"]) == (base["attn"], base["act"])
    schemes = {name: keys(**{"hetdpt.point_selection": name})["points"] for name in ("oneshot", "progressive",
                                                                                       "gradual")}
    assert len(set(schemes.values())) == 3
    # one-shot points do not depend on the run's scorer
    assert keys(**{"scorer_options": "{gate-taylor: {score_decay: 0.5}}"})["points"] == keys()["points"]


def test_gradual_points_are_keyed_by_the_selectors_own_schedule_not_point_finetune(tiny_model, digits_data, tmp_path):
    """Issue 34: gate-taylor's gradual points train with short_finetune on scoring.subset images; the key once
    hashed the point_finetune section instead (auto: finetune), so another short_finetune.lr reused them."""
    def key(**changes) -> str:
        return HetDPT().points_key(make_job(tiny_model, digits_data, tmp_path, **{**GRADUAL, **changes}))

    g = key()
    for change in ({"short_finetune.lr": 1e-4}, {"short_finetune.batch_size": 16}, {"scoring.subset": 32},
                   {"scorer": "loss-drop"}, {"scorer_options": "{gate-taylor: {score_decay: 0.5}}"}):
        assert key(**change) != g, change
    assert key(**{"finetune.lr": 1e-4}) == g   # no gradual point trains with the final schedule


def test_progressive_paths_reach_what_the_feasible_splits_need():
    sites12 = [(a, 12 - a) for a in range(12)]
    attn, act, inter = paths_for(sites12, "act")
    assert attn.steps[-1] == (11, 0) and act.steps[-1] == (0, 12)
    assert inter.steps[:4] == [(0, 1), (1, 1), (1, 2), (2, 2)] and inter.steps[-1] == (6, 6)
    assert inter.recorded == inter.steps[1:]
    macs = [(0, 12), (1, 11), (3, 10), (5, 9), (6, 8), (8, 7), (10, 6)]   # digit pairs at MACs 0.45
    *_, inter = paths_for(macs, "attn")
    assert inter.steps[:3] == [(1, 0), (1, 1), (2, 1)] and inter.steps[-1] == (8, 7)   # stops on the budget line
    assert [p.name for p in paths_for([(0, 3)], "act")] == ["act"]                     # one kind: one path
    attn, act, inter = paths_for(macs, "act", stride=3)          # three sites per step, one fine-tune each
    assert attn.steps == [(3, 0), (6, 0), (9, 0), (10, 0)] and act.steps[-1] == (0, 12)
    assert inter.steps == [(1, 2), (3, 3), (4, 5), (6, 6), (7, 8)] and inter.recorded == inter.steps


@pytest.mark.parametrize("degree", [2, 3])
def test_leave_two_out_cross_validation_finds_the_degree_of_a_noisy_polynomial(degree):
    rng = np.random.default_rng(0)

    def truth(a, m):
        quadratic = 90 - 1.0 * a - 0.5 * m - 0.4 * a * a + 0.2 * a * m - 0.1 * m * m
        return quadratic + (0.05 * a ** 3 - 0.04 * a * m * m if degree == 3 else 0.0)

    pts = [(a, m, truth(a, m) + rng.normal(0, 0.3)) for a in range(8) for m in range(8) if a + m <= 9]
    predictor = PolyPredictor(degree="auto").fit(pts)
    report = predictor.fit_report()
    assert report["degree"] == degree, report["cv_rmse"]
    assert set(report["cv_rmse"]) == {"1", "2", "3", "4"}
    assert report["cv_rmse"][str(degree)] == min(report["cv_rmse"].values())
    with pytest.raises(hetprune.HetpruneError, match="degree must be an integer >= 1 or 'auto'"):
        PolyPredictor(degree="best")


def test_a_budget_with_a_single_feasible_split_takes_it_without_map_points(tiny_model, digits_data, tmp_path,
                                                                          monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("one feasible split needs no MAP point")

    monkeypatch.setattr(HetDPT, "collect_points", never)
    strategy = HetDPT()
    (split, info) = strategy.allocate(make_job(tiny_model, digits_data, tmp_path, budget=Budget(sites=0)))
    assert split == (0, 0) and info["single_split"] and info["points"] == []
    job = make_job(tiny_model, digits_data, tmp_path / "one", budget=Budget(target_macs=0.9))
    monkeypatch.setattr(job, "feasible_pairs", lambda: [(2, 1)])   # any budget whose only split is 2+1
    assert strategy.allocate(job)[0] == (2, 1)


def test_compare_with_a_budget_of_zero_does_not_stop_at_hetdpt(trained_tiny, tmp_path):
    _, spec, ckpt = trained_tiny
    out = tmp_path / "cmp"
    args = ["compare", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
            "--strategies", "hetdpt", "--budget", "0", "--speed-budget", "0", "--batch-sizes", "1",
            "--scorer", "magnitude", "--set", "finetune.epochs=0", "--out", str(out)]
    assert main(args) == 0
    [row] = json.loads((out / "results.json").read_text())["rows"]
    assert (row["n_attn"], row["n_act"]) == (0, 0) and "unreachable" not in row


def test_a_points_trip_reads_its_device_and_removers_from_the_job(tiny_model, digits_data, tmp_path, monkeypatch):
    """Issue 35: a point's route once resolved the device name again in every fine-tune and evaluation and built
    the removers at every removal; the job carries both, resolved once."""
    from hetprune.core import devices

    job = make_job(tiny_model, digits_data, tmp_path, budget=Budget(sites=2),
                   **{**PROGRESSIVE, "short_finetune.epochs": 1, "short_finetune.subset": 16,
                      "short_finetune.batch_size": 8, "hetdpt.checks": "none"})
    resolved, built = [], []
    real_canonical, real_build = devices.canonical, job.registry.build
    monkeypatch.setattr(devices, "canonical", lambda name: resolved.append(name) or real_canonical(name))
    monkeypatch.setattr(job.registry, "build", lambda kind, name, **o: built.append(kind) or real_build(kind, name, **o))
    strategy = HetDPT()
    points = strategy.collect_points(job, strategy.point_plan(job, job.feasible_pairs()))
    assert len(points) == 6 and resolved == []                       # every fine-tune and evaluation: job.device
    assert built.count("remover") == 2 and built.count("scorer") == 1   # built once per job
