"""hetprune ablate: metrics against hand-computed values, and resume."""

from __future__ import annotations

import json

import pytest

import hetprune
from hetprune.harness.ablate import argmax_pair, predictor_metrics
from hetprune.cli import main


def test_metrics_match_hand_computed_values():
    true = {(0, 4): 90.0, (1, 3): 92.0, (2, 2): 91.0, (3, 1): 85.0}
    predicted = {(0, 4): 88.0, (1, 3): 87.0, (2, 2): 89.0, (3, 1): 80.0}
    m = predictor_metrics(predicted, true)
    assert m["pick"] == [2, 2] and m["best"] == [1, 3]
    assert m["regret"] == pytest.approx(1.0)
    assert m["within_tolerance"] is False
    # ranks: true (0,4)=2 (1,3)=4 (2,2)=3 (3,1)=1 ; predicted 3, 2, 4, 1 -> d^2 = 1+4+1+0 = 6
    assert m["spearman"] == pytest.approx(1 - 6 * 6 / (4 * (16 - 1)))
    # pairs: concordant 4, discordant 2 -> (4 - 2) / 6
    assert m["kendall"] == pytest.approx(2 / 6)


def test_perfect_and_tolerated_picks():
    true = {(0, 2): 90.0, (1, 1): 90.2, (2, 0): 80.0}
    assert predictor_metrics(true, true)["regret"] == 0 and predictor_metrics(true, true)["spearman"] == 1
    near = {(0, 2): 95.0, (1, 1): 94.0, (2, 0): 70.0}   # picks (0,2), 0.2 below the best
    m = predictor_metrics(near, true)
    assert m["pick"] == [0, 2] and m["regret"] == pytest.approx(0.2) and m["within_tolerance"] is True
    assert argmax_pair({(0, 2): 1.0, (1, 1): 1.0}) == (0, 2)
    with pytest.raises(hetprune.HetpruneError, match="no value for splits"):
        predictor_metrics({(0, 2): 1.0}, true)


def test_ablate_end_to_end_with_fake_cheap_points_and_resume(trained_tiny, tmp_path, monkeypatch, capsys):
    """Cheap points come from a fake evaluator (a known curve): no short fine-tune is run."""
    from hetprune_hetdpt.strategy import HetDPT

    import hetprune.pruning.pipeline as pipeline

    def fake_points(self, job, plan):
        return [{"n_attn": a, "n_act": m, "metric": 90.0 - 2.0 * a - 0.5 * m} for a, m in plan]

    monkeypatch.setattr(HetDPT, "collect_points", fake_points)
    runs = []
    real_run = pipeline.DepthStrategy.run

    def counting_run(self, job):
        runs.append((job.strategy_name, job.seed))
        return real_run(self, job)

    monkeypatch.setattr(pipeline.DepthStrategy, "run", counting_run)
    _, spec, ckpt = trained_tiny
    out = tmp_path / "abl"
    args = ["ablate", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
            "--budget", "2", "--seeds", "0,1", "--scorer", "magnitude", "--scorers", "magnitude,random",
            "--predictors", "poly", "--out", str(out), "--set", "finetune.epochs=1", "--set", "finetune.subset=32",
            "--set", "hetdpt.predictor_options={poly: {degree: 1}}"]
    assert main(args) == 0
    result = json.loads((out / "ablation.json").read_text())
    splits = {(s["n_attn"], s["n_act"]) for s in result["splits"]}
    assert splits == {(0, 2), (1, 1), (2, 0)}
    assert len(runs) == 3 * 2 + 2 * 2            # every split x seed, then every scorer x seed
    poly = result["predictors"]["poly"]
    assert poly["pick"] == [0, 2]                # the fake curve prefers activations
    assert poly["fit"]["mae"] == pytest.approx(0, abs=1e-9)
    true = {(s["n_attn"], s["n_act"]): s["true"] for s in result["splits"]}
    assert poly["regret"] == pytest.approx(max(true.values()) - true[(0, 2)])
    assert set(result["scorers"]) == {"magnitude", "random"} and result["scorer_split"] == [0, 2]
    for name in ("ablation.md", "splits.png", "scorers.png"):
        assert (out / name).stat().st_size > 0
    assert "| poly | 0+2 |" in (out / "ablation.md").read_text()

    # a rerun without --resume is refused; with --resume no split is fine-tuned again
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err
    runs.clear()
    assert main(args + ["--resume"]) == 0
    assert runs == []
    again = json.loads((out / "ablation.json").read_text())
    assert again["predictors"] == result["predictors"]
    # another setting of the allocating strategy (its points) shares the ground truth: nothing fine-tuned again
    assert main(args + ["--resume", "--set", "hetdpt.point_selection=gradual", "--set", "hetdpt.refine=1"]) == 0
    assert runs == []
    assert json.loads((out / "ablation.json").read_text())["point_selection"] == "gradual"
    # a setting the fine-tune reads is a new ground truth
    assert main(args + ["--resume", "--set", "finetune.lr=1e-4", "--scorers", ""]) == 0
    assert len(runs) == 3 * 2


def test_a_predictor_whose_fit_returns_nothing_is_read_after_fitting(trained_tiny, tmp_path, monkeypatch):
    """Issue 71: plugins.md says fit()'s return value is ignored and the conformance kit passes a predictor whose
    fit() returns None; ablate used the return value and died after every point was measured. One rule now:
    every caller keeps the object it fitted."""
    from hetprune_hetdpt.strategy import HetDPT

    from hetprune import hookimpl, register_plugin, unregister_plugin

    class Flat:
        name = "flat-none"

        def fit(self, points):
            self.mean = sum(m for _, _, m in points) / len(points)   # returns None, as the contract allows

        def predict(self, n_attn, n_act):
            return self.mean - 0.1 * n_attn

    class Plugin:
        @hookimpl
        def register_predictors(self, register):
            register(Flat)

    def fake_points(self, job, plan):
        return [{"n_attn": a, "n_act": m, "metric": 90.0 - 2.0 * a - 0.5 * m} for a, m in plan]

    monkeypatch.setattr(HetDPT, "collect_points", fake_points)
    plugin = Plugin()
    register_plugin(plugin, "flat-none")
    try:
        _, spec, ckpt = trained_tiny
        out = tmp_path / "abl"
        assert main(["ablate", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint",
                     str(ckpt), "--budget", "1", "--scorer", "magnitude", "--predictors", "flat-none,poly",
                     "--set", "hetdpt.predictor_options={poly: {degree: 1}}", "--out", str(out),
                     "--set", "finetune.epochs=1", "--set", "finetune.subset=32"]) == 0
        assert json.loads((out / "ablation.json").read_text())["predictors"]["flat-none"]["pick"] == [0, 1]
    finally:
        unregister_plugin("flat-none")


def test_the_compared_predictors_are_built_and_sized_before_any_cheap_point(trained_tiny, tmp_path, monkeypatch,
                                                                           capsys):
    """Issue 71: every refusal that can be known before stage 1 is made there. A predictor named in
    --predictors that breaks its Protocol, or needs more points than the budget's plan has, was found only
    after every cheap point was measured."""
    from hetprune_hetdpt.strategy import HetDPT

    from hetprune import hookimpl, register_plugin, unregister_plugin

    class NoPredict:
        name = "no-predict"

        def fit(self, points):
            return self

    class Plugin:
        @hookimpl
        def register_predictors(self, register):
            register(NoPredict)

    def never(self, job, plan):
        raise AssertionError("a cheap point was measured before the refusal")

    monkeypatch.setattr(HetDPT, "collect_points", never)
    _, spec, ckpt = trained_tiny
    args = ["ablate", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
            "--budget", "1", "--scorer", "magnitude", "--set", "finetune.epochs=1", "--set", "finetune.subset=32"]
    register_plugin(Plugin(), "no-predict")
    try:
        assert main([*args, "--predictors", "no-predict", "--out", str(tmp_path / "a")]) != 0
    finally:
        unregister_plugin("no-predict")
    assert "predictor 'no-predict' lacks predict() method" in capsys.readouterr().err
    # poly of degree 2 needs 6 distinct points; a budget of one site plans 3
    assert main([*args, "--predictors", "poly", "--set", "hetdpt.predictor_options={poly: {degree: 2}}",
                 "--out", str(tmp_path / "b")]) != 0
    assert "predictor 'poly' needs at least 6 distinct points and this budget's plan has 3" in capsys.readouterr().err


def test_every_library_entry_point_closes_the_loaders_it_opened():
    """ablate lost its closing_loaders decorator when a helper was written between the two (a run's loader
    workers outlived the call); each entry point is wrapped by it."""
    from hetprune.harness.ablate import ablate
    from hetprune.harness.api import prune
    from hetprune.harness.compare import compare

    for entry in (ablate, prune, compare):   # the context manager's wrapper, over the function itself
        assert entry.__wrapped__.__name__ == entry.__name__ and entry.__code__ is not entry.__wrapped__.__code__
