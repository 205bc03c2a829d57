"""The hetdpt plugin: predictor, allocation, gates, point collection, KD, config."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hetprune
import hetprune.training.task  # noqa: F401 - its train is what the tests below spy on
from hetprune import HetpruneError, Site
from hetprune.model import surgery
from hetprune.pruning.budget import Budget, feasible_pairs, site_savings
from hetprune.model.macs import count_macs
from hetprune.pruning.pipeline import PruneJob
from hetprune.core.plugins import get_registry
from hetprune.training.train import TrainConfig, kd_loss, train
from conftest import tiny_example

from hetprune_hetdpt import gates
from hetprune_hetdpt.predictors import PolyPredictor
from hetprune_hetdpt.scorers import GateTaylorScorer
from hetprune_hetdpt.strategy import HetDPT
from hetprune.pruning.point_store import PointStore


# the one-shot machinery these tests check, pinned (the defaults are one-shot points with local and no checks
# too, but poly's degree is pinned and a later default may differ; progressive points: tests/test_point_schemes.py)
ONESHOT = {"hetdpt.point_selection": "oneshot", "hetdpt.checks": "none", "hetdpt.predictor": "local",
           "hetdpt.predictor_options": "{poly: {degree: 2}}"}


def make_job(model, data, tmp_path, budget=Budget(sites=3), **settings_changes):
    strategy = HetDPT()
    changes = {**ONESHOT, **settings_changes}
    settings = hetprune.core.loader.resolve(strategy.defaults, overrides=None, sets=[f"{k}={v}" for k, v in changes.items()])
    return PruneJob(dense=model, spec=None, data=data, budget=budget, settings=settings, registry=get_registry(),
                    workdir=tmp_path / "work", base_info={"hash": "test"}, progress=False, log=lambda s: None,
                    strategy_name="hetdpt")


# -- predictor ----------------------------------------------------------------

def test_poly_recovers_known_polynomial_exactly():
    def truth(a, m):
        return 90 - 1.5 * a - 0.5 * m - 0.25 * a * a + 0.1 * a * m - 0.05 * m * m

    pts = [(a, m, truth(a, m)) for a in range(4) for m in range(4)]
    p = PolyPredictor(degree=2).fit(pts)
    for a in range(6):
        for m in range(6):
            assert p.predict(a, m) == pytest.approx(truth(a, m), abs=1e-9)
    rep = p.fit_report()
    assert rep["mae"] < 1e-9 and rep["rmse"] < 1e-9 and rep["loo_mae"] < 1e-9
    assert rep["points"] == 16


def test_poly_reports_nonzero_error_on_noisy_points():
    rng = np.random.default_rng(0)
    pts = [(a, m, 80 - a - m + rng.normal()) for a in range(4) for m in range(4)]
    rep = PolyPredictor(degree=1).fit(pts).fit_report()
    assert rep["rmse"] > 0.1 and rep["loo_mae"] > rep["mae"]


def test_poly_refuses_too_few_points_and_says_how_many():
    with pytest.raises(HetpruneError, match="needs at least 6"):
        PolyPredictor(degree=2).fit([(0, 0, 90), (1, 0, 89), (0, 1, 88), (1, 1, 87), (2, 0, 85)])
    # repeated pairs do not count twice: 12 points, but only 3 distinct pairs
    with pytest.raises(HetpruneError, match="got 3"):
        PolyPredictor(degree=2).fit([(0, 0, 1), (0, 0, 2), (1, 0, 1), (0, 1, 1)] * 3)
    with pytest.raises(HetpruneError):
        PolyPredictor(degree=0)


# -- allocation ----------------------------------------------------------------

def test_site_budget_pairs_respect_budget_and_class_token(tiny_model):
    pairs = feasible_pairs(tiny_model, Budget(sites=5))
    assert all(a + m == 5 for a, m in pairs)
    # depth 4: at most 3 attention sites may go from a class-token model, at most 4 activations
    assert sorted(pairs) == [(1, 4), (2, 3), (3, 2)]
    with pytest.raises(HetpruneError, match="more than this model can lose"):
        feasible_pairs(tiny_model, Budget(sites=8))


def test_cost_budget_pairs_meet_target_and_are_minimal(tiny_model):
    x = tiny_example(2)
    dense = count_macs(tiny_model, x)
    save = site_savings(tiny_model, x)
    limit = 0.7 * dense
    pairs = feasible_pairs(tiny_model, Budget(target_macs=0.7), x)
    assert pairs
    for a, m in pairs:
        assert dense - a * save["attn"] - m * save["act"] <= limit
        if a:
            assert dense - (a - 1) * save["attn"] - m * save["act"] > limit
        if m:
            assert dense - a * save["attn"] - (m - 1) * save["act"] > limit
    # the per-site savings are real: removing the sites of a pair gives the counted MACs
    a, m = pairs[0]
    model = copy.deepcopy(tiny_model)
    for b in range(a):
        hetprune.model.surgery.remove_attention(model, b)
    for b in range(m):
        hetprune.model.surgery.remove_activation(model, b)
    hetprune.model.surgery.merge_all(model)
    assert count_macs(model, x) == dense - a * save["attn"] - m * save["act"]


def test_a_model_pruned_before_counts_only_the_sites_it_still_has(tiny_model):
    """hetdpt-plus interleaved runs depth pruning again on a depth-pruned model: the limits and the
    per-site savings must come from the sites still there (a second removal of a site is an error)."""
    from hetprune.pruning.budget import max_per_kind

    x = tiny_example(2)
    model = copy.deepcopy(tiny_model)
    surgery.remove_attention(model, 0)
    surgery.remove_activation(model, 1)
    surgery.merge_all(model)
    assert max_per_kind(model) == {"attn": 2, "act": 3}   # class token: 3 attention sites may go, 1 went
    pairs = feasible_pairs(model, Budget(sites=5))
    assert sorted(pairs) == [(2, 3)]
    dense = count_macs(model, x)
    save = site_savings(model, x)
    assert save == site_savings(tiny_model, x)   # uniform widths: a present site saves what it did before
    twin = copy.deepcopy(model)
    surgery.remove_attention(twin, 2)
    surgery.remove_activation(twin, 3)
    surgery.merge_all(twin)
    assert count_macs(twin, x) == dense - save["attn"] - save["act"]
    for a, m in feasible_pairs(model, Budget(target_macs=0.8), x):
        assert a <= 2 and m <= 3 and dense - a * save["attn"] - m * save["act"] <= 0.8 * dense


@pytest.mark.parametrize("budget", [Budget(sites=5), Budget(target_macs=0.7)])
def test_allocation_is_argmax_over_feasible_pairs(tiny_model, digits_data, tmp_path, monkeypatch, budget):
    def truth(a, m):  # best is at a ~ 1.5 along any line: a quadratic with a known peak
        return 90 - (a - 1.5) ** 2 - 0.3 * m

    def fake_collect(self, job, plan):
        return [{"n_attn": a, "n_act": m, "metric": truth(a, m)} for a, m in plan]

    monkeypatch.setattr(HetDPT, "collect_points", fake_collect)
    # the paper's quadratic recovers a quadratic surface exactly
    job = make_job(tiny_model, digits_data, tmp_path, budget=budget, **{"hetdpt.predictor": "poly"})
    (a, m), info = HetDPT().allocate(job)
    pairs = job.feasible_pairs()
    assert (a, m) in pairs
    assert truth(a, m) == max(truth(*p) for p in pairs)
    assert info["pick"] == {"n_attn": a, "n_act": m, "predicted": pytest.approx(truth(a, m), abs=1e-6)}
    assert len(info["surface"]) == len(pairs)


# -- gates ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["attn", "act"])
def test_gate_gradient_is_first_order_taylor_estimate(tiny_model, kind):
    model = tiny_model.double()
    x = tiny_example(3).double()
    y = torch.tensor([1, 2, 3])
    site = Site(1, kind)
    block = model.blocks[1]

    # by hand: f(x) - x of the site, and dL/dy at its output, on the ungated model
    captured = {}
    if kind == "attn":
        def pre(mod, inputs):
            captured["x"] = inputs[0]

        def post(mod, inputs, output):
            output.retain_grad()
            captured["y"] = output
        h1 = block.register_forward_pre_hook(pre)
        h2 = block.ls1.register_forward_hook(post)   # y - x of the site = ls1(attn(norm1(x)))
    else:
        def act_hook(mod, inputs, output):
            output.retain_grad()
            captured["x"], captured["y"] = inputs[0], output
        h1 = block.mlp.act.register_forward_hook(act_hook)
        h2 = None
    F.cross_entropy(model(x), y).backward()
    if kind == "attn":
        # the site maps x -> x + b with b = ls1(...); dL/d(site output) equals dL/db
        expected = (captured["y"] * captured["y"].grad).sum().item()
    else:
        expected = ((captured["y"] - captured["x"]) * captured["y"].grad).sum().item()
    h1.remove()
    if h2:
        h2.remove()
    model.zero_grad()

    bank, handles = gates.install(model, [site])
    out_gated = model(x)
    F.cross_entropy(out_gated, y).backward()
    got = bank.scores.grad[0].item()
    gates.uninstall(model, handles)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert expected != 0.0


def test_gate_forward_is_identity_while_on_and_removal_when_off(tiny_model):
    x = tiny_example()
    ref = tiny_model(x)
    sites = [Site(0, "attn"), Site(2, "act")]
    bank, handles = gates.install(tiny_model, sites)
    assert torch.allclose(tiny_model(x), ref)
    for s in sites:
        bank.switch_off(s)
    gated = tiny_model(x)
    gates.uninstall(tiny_model, handles)
    pruned = copy.deepcopy(tiny_model)
    hetprune.model.surgery.remove_attention(pruned, 0)
    hetprune.model.surgery.remove_activation(pruned, 2)
    assert torch.allclose(gated, pruned(x), atol=1e-6)


@pytest.mark.parametrize("key", ["vit", "cait", "beit", "swin"])
def test_gates_off_simulate_the_configured_attention_removal(key):
    """With attn-ln-residual configured, an off gate must give x + norm1(x) (not x), LayerScale or not."""
    from families import example, make

    model, x = make(key, torch.float64), example(dtype=torch.float64)
    pruned = copy.deepcopy(model)
    hetprune.model.surgery.remove_attention(pruned, 1, "ln-residual")
    identity = copy.deepcopy(model)
    hetprune.model.surgery.remove_attention(identity, 1, "identity")
    bank, handles = gates.install(model, [Site(1, "attn")], attn_mode="ln-residual")
    bank.switch_off(Site(1, "attn"))
    gated = model(x).detach()
    gates.uninstall(model, handles)
    out = pruned(x).detach()
    scale = out.abs().max()
    assert (gated - out).abs().max() <= 1e-10 * scale
    assert (out - identity(x).detach()).abs().max() > 1e-2 * scale  # the removals differ: the test means something


def test_gate_phase_uses_the_fine_tune_parameter_groups(tiny_model, digits_data, tmp_path, monkeypatch):
    """No weight decay on norms, biases and LayerScale in the gate phase either (timm's grouping, as in train())."""
    import timm.optim

    seen = []
    real = timm.optim.create_optimizer_v2

    def spy(model_or_params, *args, **kwargs):
        opt = real(model_or_params, *args, **kwargs)
        seen.append(opt)
        return opt

    monkeypatch.setattr(timm.optim, "create_optimizer_v2", spy)
    job = make_job(tiny_model, digits_data, tmp_path, **{"scoring.subset": 32, "short_finetune.batch_size": 32,
                                                          "short_finetune.epochs": 1})
    from hetprune.pruning.pipeline import select_sites

    select_sites(job, copy.deepcopy(tiny_model), {"attn": 1, "act": 0})
    def layout(opt):
        return [(g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in opt.param_groups]

    fine_tune = real(copy.deepcopy(tiny_model), opt="adamw", lr=1e-3, weight_decay=0.05)  # what train() builds
    assert layout(seen[0]) == [(wd if wd == 0.0 else seen[0].param_groups[i]["weight_decay"], shapes)
                               for i, (wd, shapes) in enumerate(layout(fine_tune))]
    assert any(g["weight_decay"] == 0.0 for g in seen[0].param_groups)  # norms, biases, LayerScale: no decay


def test_gate_state_lives_in_state_dict(tiny_model):
    bank, handles = gates.install(tiny_model, [Site(0, "attn")])
    state = tiny_model.state_dict()
    assert "hetprune_gates.scores" in state and "hetprune_gates.mask" in state
    gates.uninstall(tiny_model, handles)
    assert not any(k.startswith("hetprune_gates") for k in tiny_model.state_dict())


def test_gate_taylor_schedule_alternates_kinds():
    assert GateTaylorScorer.schedule({"attn": 2, "act": 4}) == ["attn", "act", "attn", "act", "act", "act"]
    assert GateTaylorScorer.schedule({"attn": 0, "act": 2}) == ["act", "act"]


def test_gate_taylor_selects_asked_counts_and_resumes(tiny_model, digits_data, tmp_path):
    job = make_job(tiny_model, digits_data, tmp_path, **{"scoring.subset": 64, "short_finetune.batch_size": 32})
    from hetprune.pruning.pipeline import select_sites

    model = copy.deepcopy(tiny_model)
    chosen = select_sites(job, model, {"attn": 1, "act": 2})
    assert sorted(s.kind for s in chosen) == ["act", "act", "attn"]
    assert not hasattr(model, gates.GATE_ATTR)
    assert (tmp_path / "work" / "scoring" / "gate-checkpoint.pt").is_file()
    # resuming a finished selection repeats no step and returns the same sites
    job.resume = True
    again = select_sites(job, copy.deepcopy(tiny_model), {"attn": 1, "act": 2})
    assert again == chosen


def test_gate_phase_trains_through_the_fine_tunes_step_under_amp(tiny_model, tmp_path, monkeypatch):
    """gate-taylor's gate phase takes train()'s own step, so --amp (part of its resume key) reaches it: the
    forwards run under autocast and both optimizers (weights, gate scores) step through the GradScaler."""
    import hetprune.training.train as train_mod
    from hetprune.harness.testing import scoring_context

    steps, heads = [], []
    real_step = train_mod.optimisation_step

    def spy(loss, optimizers, scaler, *args, **kwargs):
        steps.append(len(optimizers))
        return real_step(loss, optimizers, scaler, *args, **kwargs)

    monkeypatch.setattr(train_mod, "optimisation_step", spy)
    model = copy.deepcopy(tiny_model)
    model.head.register_forward_hook(lambda m, i, out: heads.append((torch.is_autocast_enabled("cpu"), out.dtype)))
    ctx = scoring_context(tiny_model, tmp_path, {"amp": "bf16", "scoring": {"subset": 32},
                                                 "short_finetune": {"batch_size": 16, "kd": "none"}})
    removed = GateTaylorScorer(warmup_epochs=0).select(model, {"attn": 1, "act": 1}, ctx)
    assert sorted(s.kind for s in removed) == ["act", "attn"]
    assert steps == [2, 2, 2, 2]            # 2 removals x 32 images at batch 16, weights and scores together
    assert heads and set(heads) == {(True, torch.bfloat16)}
    assert model.cls_token.dtype == torch.float32    # autocast, not a cast of the weights


def test_gate_phase_refuses_a_nan_loss_and_skips_an_fp16_overflow(tiny_model, tmp_path, monkeypatch):
    import hetprune.training.train as train_mod
    from hetprune.harness.testing import scoring_context

    def run(poison, scaler=None):
        calls, real_loss = [], train_mod.training_loss

        def loss(*args):
            calls.append(1)
            return real_loss(*args) * (poison if len(calls) == 2 else 1.0)

        monkeypatch.setattr(train_mod, "training_loss", loss)
        if scaler is not None:   # fp16 needs CUDA: the CPU's GradScaler stands in for the one it would get
            monkeypatch.setattr(train_mod, "grad_scaler", lambda device, amp: scaler)
        ctx = scoring_context(tiny_model, tmp_path / str(poison), {"scoring": {"subset": 32},
                                                                    "short_finetune": {"batch_size": 16, "kd": "none"}})
        return GateTaylorScorer(warmup_epochs=0).select(copy.deepcopy(tiny_model), {"attn": 1, "act": 0}, ctx)

    with pytest.raises(HetpruneError, match="gate-taylor: loss became nan; lower short_finetune.lr"):
        run(float("nan"))
    with pytest.raises(HetpruneError, match="gate-taylor: loss became inf"):
        run(float("inf"))                                        # no fp16: nothing absorbs an overflow
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    assert len(run(float("inf"), scaler)) == 1
    assert scaler.get_scale() == 2.0 ** 7                        # the one overflowing step was skipped


# -- MAP points: resume --------------------------------------------------------------

def test_interrupted_point_collection_resumes_without_remeasuring(tiny_model, digits_data, tmp_path, monkeypatch):

    calls = []
    real_train = hetprune.training.task.train

    def counting_train(model, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3 and not getattr(counting_train, "done", False):
            counting_train.done = True
            raise KeyboardInterrupt
        kwargs["progress"] = False
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(hetprune.training.task, "train", counting_train)
    job = make_job(tiny_model, digits_data, tmp_path, budget=Budget(sites=3),
                   **{"finetune.epochs": 1, "finetune.subset": 32, "hetdpt.axis_points": 2,
                      "hetdpt.mixed_points": 1})
    strategy = HetDPT()
    plan = strategy.point_plan(job, job.feasible_pairs())
    with pytest.raises(KeyboardInterrupt):
        strategy.collect_points(job, plan)
    store = PointStore(job.shared_dir / "map-points.jsonl", strategy.points_key(job))
    assert len(store.load()) == 2
    calls.clear()
    points = strategy.collect_points(job, plan)
    assert len(calls) == len(plan) - 2
    assert [(p["n_attn"], p["n_act"]) for p in points] == plan
    # a changed schedule must not reuse the stale points
    job = dataclasses.replace(job, settings=job.settings.replace_in("finetune", lr=1e-4))
    assert strategy.points_key(job) != store.key


def test_points_are_fine_tuned_with_the_chosen_schedule_and_keyed_by_it(tiny_model, digits_data, tmp_path,
                                                                       monkeypatch):

    used = []
    monkeypatch.setattr(hetprune.training.task, "train", lambda model, data, cfg, **kw: used.append((cfg.epochs, cfg.subset)))
    small = {"finetune.epochs": 1, "finetune.subset": 40, "short_finetune.epochs": 2, "short_finetune.subset": 20}
    strategy = HetDPT()
    # auto, the default: finetune (1 epoch on 40 images) costs less than 4 short ones (2 epochs on 20)
    full = make_job(tiny_model, digits_data, tmp_path / "full", **small)
    short = make_job(tiny_model, digits_data, tmp_path / "short", **small, **{"hetdpt.point_finetune": "short_finetune"})
    [p] = strategy.collect_points(full, [(1, 1)])
    assert used == [(1, 40)] and p["point_finetune"] == "finetune" and p["schedule"]["subset"] == 40
    used.clear()
    strategy.collect_points(short, [(1, 1)])
    assert used == [(2, 20)]
    assert strategy.points_key(full) != strategy.points_key(short)
    # each key follows its own schedule only
    before = strategy.points_key(full), strategy.points_key(short)
    full, short = (dataclasses.replace(job, settings=job.settings.replace_in("short_finetune", lr=1e-4))
                   for job in (full, short))
    assert strategy.points_key(full) == before[0] and strategy.points_key(short) != before[1]
    bad = make_job(tiny_model, digits_data, tmp_path / "bad", **{"hetdpt.point_finetune": "long"})
    with pytest.raises(HetpruneError, match="point_finetune must be one of auto, finetune, short_finetune"):
        strategy.collect_points(bad, [(0, 1)])


def test_auto_gives_points_the_final_schedule_only_where_it_is_affordable():
    resolve = HetDPT.point_finetune
    embedded = {"hetdpt": {"point_finetune": "auto"}, "finetune": {"epochs": 3, "subset": 300},
                "short_finetune": {"epochs": 2, "subset": 150}}
    assert resolve(embedded, train_size=4000) == "finetune"            # 900 images against 4 x 300
    paper = {"hetdpt": {"point_finetune": "auto"}, "finetune": {"epochs": 400, "subset": None},
             "short_finetune": {"epochs": 3, "subset": 100000}}
    assert resolve(paper, train_size=1281167) == "short_finetune"      # 400 epochs of ImageNet: never per point
    # subsets larger than the training set count what is there
    small = {"hetdpt": {"point_finetune": "auto"}, "finetune": {"epochs": 4, "subset": None},
             "short_finetune": {"epochs": 1, "subset": 1000}}
    assert resolve(small, train_size=100) == "finetune"                # 400 images against 4 x 100
    assert resolve({**small, "finetune": {"epochs": 5, "subset": None}}, train_size=100) == "short_finetune"
    assert resolve({**paper, "hetdpt": {"point_finetune": "finetune"}}, train_size=10) == "finetune"  # as asked


def test_corrupt_points_file_is_reported_by_name(tmp_path):
    path = tmp_path / "map-points.jsonl"
    path.write_text('{"n_attn": 1, "n_act": 0, "accuracy": 50, "key": "k"}\n{"n_attn": 2, "n_a')
    with pytest.raises(HetpruneError, match="map-points.jsonl line 2"):
        PointStore(path, "k").load()


def test_a_points_file_from_before_the_metric_field_is_read(tmp_path):
    """Points were stored under ``accuracy`` (whatever the metric); they are named ``metric`` now, and an old
    file still reads, its value under the new name."""
    path = tmp_path / "map-points.jsonl"
    path.write_text('{"n_attn": 1, "n_act": 0, "accuracy": 0.11342, "key": "k"}\n')
    store = PointStore(path, "k")
    store.append({"n_attn": 2, "n_act": 1, "metric": 0.25})
    found = store.load()
    assert found[(1, 0)]["metric"] == 0.11342 and found[(2, 1)]["metric"] == 0.25
    assert "accuracy" not in json.loads(path.read_text().splitlines()[1])


def test_a_metric_is_written_with_the_digits_its_scale_needs():
    """Two decimals made every value of an MSE task read 0.11 in the points log and the ablation tables."""
    from hetprune.training.task import format_metric, metric_number

    assert [metric_number("mse", v) for v in (0.11342, 0.11871)] == ["0.11342", "0.11871"]
    assert metric_number("top1", 97.7777) == "97.78" and format_metric("top1", 97.7777) == "top-1 97.78%"
    from hetprune.harness.ablate import markdown

    split = {"n_attn": 1, "n_act": 1, "true": 0.11342, "true_std": 0.00012, "cheap": 0.11871,
             "predicted": {"poly": 0.11555}}
    result = {"budget": 2, "seeds": [0], "finetune": {}, "short_finetune": {}, "metric_name": "mse",
              "predictors": {"poly": {"pick": [1, 1], "pick_predicted": 0.11555, "pick_true": 0.11342,
                                      "best": [1, 1], "best_true": 0.11342, "regret": 0.0, "spearman": None,
                                      "kendall": None, "within_tolerance": True}},
              "splits": [split]}
    table = markdown(result)
    assert "| 1+1 | 0.11342 ± 0.00012 | 0.11871 | 0.11555 |" in table


# -- KD and fine-tune ----------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_soft_kd_is_kl_of_tempered_distributions_times_t_squared(temperature):
    """KL(p_t || p_s) at temperature T, by hand, scaled by T² (so gradients keep their size as T grows)."""
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(8, 10, generator=gen, dtype=torch.float64), torch.randn(8, 10, generator=gen,
                                                                                        dtype=torch.float64)
    p_t = torch.softmax(teacher / temperature, dim=-1)
    p_s = torch.softmax(student / temperature, dim=-1)
    by_hand = (p_t * (p_t.log() - p_s.log())).sum(dim=-1).mean() * temperature ** 2
    assert kd_loss(student, teacher, "soft", temperature).item() == pytest.approx(by_hand.item(), rel=1e-12)
    assert kd_loss(student, student.clone(), "soft", temperature).item() == pytest.approx(0.0, abs=1e-12)


def test_hard_kd_is_cross_entropy_on_the_teachers_argmax_and_none_is_zero():
    gen = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(8, 10, generator=gen), torch.randn(8, 10, generator=gen)
    expected = torch.nn.functional.cross_entropy(student, teacher.argmax(dim=-1))
    assert kd_loss(student, teacher, "hard", 4.0).item() == pytest.approx(expected.item(), rel=1e-6)
    assert kd_loss(student, teacher, "none").item() == 0.0


def test_nan_loss_stops_with_message_and_keeps_last_checkpoint(tiny_model, digits_data, tmp_path):
    cfg = TrainConfig(epochs=3, subset=32, batch_size=16, kd="none")
    calls = {"n": 0}
    real_forward = tiny_model.forward

    def forward(x):
        calls["n"] += 1
        out = real_forward(x)
        return out * float("nan") if calls["n"] > 2 else out   # 2 steps = 1 epoch is fine

    tiny_model.forward = forward
    with pytest.raises(HetpruneError, match="loss became nan at epoch 2.*last good checkpoint"):
        train(tiny_model, digits_data, cfg, checkpoint_dir=tmp_path, progress=False)
    ckpt = torch.load(tmp_path / "finetune-checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_finetune_resume_matches_uninterrupted(tiny_model, digits_data, tmp_path):
    cfg = TrainConfig(epochs=2, subset=48, batch_size=16, kd="none", seed=3)
    full = copy.deepcopy(tiny_model)
    train(full, digits_data, cfg, progress=False)
    part = copy.deepcopy(tiny_model)
    first = TrainConfig(**{**cfg.to_dict()})
    # run one epoch by stopping after the first epoch's checkpoint
    class Stop(Exception):
        pass

    def stop_after_first(epoch, metrics):
        raise Stop

    with pytest.raises(Stop):
        train(part, digits_data, first, checkpoint_dir=tmp_path, progress=False, on_epoch_end=stop_after_first)
    resumed = copy.deepcopy(tiny_model)
    train(resumed, digits_data, cfg, checkpoint_dir=tmp_path, resume=True, progress=False)
    x = tiny_example()
    assert torch.allclose(resumed(x), full(x), atol=1e-6)


# -- config ----------------------------------------------------------------------

def test_unknown_config_key_names_key_and_file(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("finetune:\n  epochs: 2\n  epochz: 3\n")
    with pytest.raises(HetpruneError, match=r"'finetune.epochz' in config file .*cfg.yaml"):
        hetprune.core.loader.resolve(HetDPT.defaults, str(path))
    path.write_text("hetdpt:\n  degree: 3\n")
    with pytest.raises(HetpruneError, match="hetdpt.degree"):
        hetprune.core.loader.resolve(HetDPT.defaults, str(path))
    path.write_text("hetdpt:\n  predictor_options: {poly: {degree: 3}}\nfinetune: {epochs: 7}\n")
    s = hetprune.core.loader.resolve(HetDPT.defaults, str(path), sets=["short_finetune.lr=0.01"])
    assert s["hetdpt"]["predictor_options"] == {"poly": {"degree": 3}}
    assert s["finetune"]["epochs"] == 7 and s["short_finetune"]["lr"] == 0.01


# -- end to end -------------------------------------------------------------------

@pytest.mark.slow
def test_prune_cli_end_to_end_with_outside_predictor_name_check(trained_tiny, tmp_path, capsys):
    from hetprune.cli import main

    model, spec, ckpt = trained_tiny
    common = ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt)]
    rc = main(["prune", *common, "--predictor", "no-such", "--budget", "3", "--out", str(tmp_path / "x")])
    assert rc == 2 and "no predictor named 'no-such'" in capsys.readouterr().err
    out = tmp_path / "pruned"
    rc = main(["prune", *common, "--strategy", "hetdpt", "--budget", "3", "--out", str(out),
               "--set", "finetune.epochs=1", "--set", "short_finetune.epochs=1", "--set", "scoring.subset=64",
               "--set", "finetune.subset=64", "--set", "short_finetune.subset=64", "--set", "hetdpt.checks=points",
               "--set", "hetdpt.checks_options={points: {count: 3, among: best}}"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["n_attn"] + report["n_act"] == 3
    assert {"points", "fit", "surface", "pick"} <= set(report["allocation"])
    alloc = report["allocation"]
    # the reported fit is the predictor's fit of the reported points; the pick is the best of the checks of the
    # 3 best predicted splits, each measured as a point (hetdpt.checks points, count 3)
    name = alloc["predictor"]
    assert name == report["settings"]["hetdpt"]["predictor"] == "poly"    # the default
    refit = get_registry().build("predictor", name,
                                 **report["settings"]["hetdpt"]["predictor_options"].get(name, {})).fit(
        [(p["n_attn"], p["n_act"], p["metric"]) for p in alloc["points"]])
    assert alloc["fit"]["rmse"] == pytest.approx(refit.fit_report()["rmse"], abs=1e-9)
    ranked = sorted(alloc["surface"], key=lambda d: (-d["predicted"], d["n_attn"]))
    checked = alloc["verified"]
    assert [(c["n_attn"], c["n_act"]) for c in checked] == [(d["n_attn"], d["n_act"]) for d in ranked[:3]]
    best = max(checked, key=lambda c: (c["metric"], -c["n_attn"]))
    assert (alloc["pick"]["n_attn"], alloc["pick"]["n_act"]) == (best["n_attn"], best["n_act"])
    # the saved model reloads to the model whose accuracy the report gives
    from hetprune.training.embedded_data import digits
    from hetprune.training.train import evaluate_dataset

    loaded = hetprune.load(out)
    assert evaluate_dataset(loaded, digits().val) == pytest.approx(report["top1"], abs=1e-9)
    recipe = hetprune.model.recipe.load_recipe(out)
    assert recipe.n_attn == report["n_attn"] and recipe.n_act == report["n_act"]


def test_a_point_plan_too_small_for_the_predictor_falls_back_to_a_plane_or_is_refused_with_what_helps(
        tiny_model, digits_data, tmp_path, monkeypatch):
    """Issue 71: a plan with fewer points than the predictor needs was refused with "Raise hetdpt.axis_points /
    hetdpt.mixed_points", which on a budget line of two splits changes nothing. Now a plane (poly of degree 1)
    is fitted instead, said in a line; only a plan too small for a plane is refused, and every change the
    error names would give the points."""
    def never(*a, **k):
        raise AssertionError("no point may be measured")

    monkeypatch.setattr(HetDPT, "collect_points", never)
    job = make_job(tiny_model, digits_data, tmp_path, budget=Budget(sites=1),
                   **{"hetdpt.axis_points": 1, "hetdpt.mixed_points": 0, "hetdpt.predictor": "poly"})
    logs = []
    job = dataclasses.replace(job, log=logs.append)
    plan = HetDPT().point_plan(job, job.feasible_pairs())
    assert plan == [(0, 0), (0, 1), (1, 0)]   # every point a budget of one site has: no setting gives more
    need = HetDPT.predictor(job).min_points
    assert need > len(plan)
    fitted = HetDPT().predictor_for(job, plan)
    assert (fitted.name, fitted.degree) == ("poly", 1)
    [line] = logs
    assert f"needs at least {need} distinct points and this budget and model give 3: fitting a plane" in line
    assert "axis_points" not in line   # raising it cannot help here
    HetDPT().check_settings(job)   # the pre-flight takes it, and says nothing
    assert len(logs) == 1
    # too few for a plane (no dense point): refused, naming the change that gives the points and the checks
    job = dataclasses.replace(job, settings=job.settings.replace_in("hetdpt", dense_point=False))
    with pytest.raises(HetpruneError, match=f"needs at least {need} distinct points, and a plane .* 3, but this "
                                            "budget and model give a plan of 2") as info:
        HetDPT().allocate(job)
    said = str(info.value)
    assert "Setting hetdpt.dense_point true" in said and "hetdpt.checks all" in said and "axis_points" not in said
    # where more axis points would give the predictor its points, the line says so
    wide = make_job(tiny_model, digits_data, tmp_path / "wide", budget=Budget(sites=3),
                    **{"hetdpt.axis_points": 1, "hetdpt.mixed_points": 0, "hetdpt.predictor": "poly",
                       "hetdpt.checks": "none"})
    assert HetDPT().allocation(wide).plan_could_give(5) == "raising hetdpt.axis_points / hetdpt.mixed_points"


# -- MAP refinement -------------------------------------------------------------------

def _bump(a: int, m: int) -> float:
    """A synthetic accuracy surface with a narrow optimum at 2+10 that a quadratic through the
    planned points misses (its argmax is 0+12, 2.75 points worse)."""
    import math

    return 90 + 3 * math.exp(-((a - 2) ** 2)) - 0.4 * a - 0.3 * m * (a + m) / 12


@pytest.mark.parametrize("refine, expected", [(0, (0, 12)), (2, (2, 10))])
def test_refinement_finds_the_optimum_the_one_shot_fit_misses(tiny_model, digits_data, tmp_path, monkeypatch,
                                                             refine, expected):
    import hetprune_hetdpt.strategy as strat

    measured: list[tuple[int, int]] = []

    def fake_points(self, job, plan):
        measured.extend(p for p in plan if p not in measured)
        return [{"n_attn": a, "n_act": m, "metric": _bump(a, m)} for a, m in plan]

    monkeypatch.setattr(strat.HetDPT, "collect_points", fake_points)
    job = make_job(tiny_model, digits_data, tmp_path, budget=Budget(sites=12),
                   **{"hetdpt.refine": refine, "hetdpt.predictor": "poly"})
    monkeypatch.setattr(job, "feasible_pairs", lambda: [(a, 12 - a) for a in range(12)])
    pick, info = strat.HetDPT().allocate(job)
    assert pick == expected
    assert len(info["refinement"]) == refine
    one_shot = 12  # the planned points
    assert len(measured) <= one_shot + 3 * refine  # each round: the best unmeasured split and its two neighbours
    if refine:
        assert (2, 10) in measured and info["pick"]["measured"] == pytest.approx(_bump(2, 10))


def test_refinement_pairs_are_the_best_unmeasured_split_and_its_neighbours():
    from hetprune_hetdpt.strategy import HetDPT

    pairs = [(a, 6 - a) for a in range(7)]
    predicted = {p: -abs(p[0] - 3) for p in pairs}
    assert HetDPT.refinement_pairs(pairs, predicted, set()) == [(2, 4), (3, 3), (4, 2)]
    # 2+4 beats 4+2 on the tie (fewer attention removals); its unmeasured neighbour 1+5 comes along
    assert HetDPT.refinement_pairs(pairs, predicted, {(3, 3)}) == [(1, 5), (2, 4)]
    assert HetDPT.refinement_pairs(pairs, predicted, set(pairs)) == []


def test_local_predictor_recovers_a_plane_anywhere_and_weights_near_points_more():
    from hetprune_hetdpt.predictors import LocalPredictor

    plane = [(a, m, 80 + 2 * a - 0.5 * m) for a in range(3) for m in range(3)]
    lp = LocalPredictor(bandwidth=1.5).fit(plane)
    assert lp.predict(7, 1) == pytest.approx(80 + 14 - 0.5, abs=1e-9)  # a plane is fitted exactly, far away too
    assert lp.fit_report()["rmse"] < 1e-9
    # one point that breaks the plane pulls nearby predictions much more than far ones
    bent = [p for p in plane if p[:2] != (2, 2)] + [(2, 2, 70.0)]
    lp = LocalPredictor(bandwidth=1.0).fit(bent)
    near, far = lp.predict(2, 2) - (80 + 4 - 1), lp.predict(0, 0) - 80
    assert near < -3 and abs(far) < abs(near) / 3


def test_local_predictor_refuses_too_few_points_and_a_bad_bandwidth():
    from hetprune_hetdpt.predictors import LocalPredictor

    with pytest.raises(HetpruneError, match="needs at least 3 distinct"):
        LocalPredictor().fit([(0, 0, 90.0), (1, 0, 80.0), (1, 0, 81.0)])
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(HetpruneError, match="bandwidth"):
            LocalPredictor(bandwidth=bad)


def test_gp_predictor_interpolates_reports_uncertainty_and_refuses_too_few_points():
    from hetprune_hetdpt.predictors import GPPredictor

    def f(a, m):   # a plane with a dip the plane alone cannot follow
        return 90 - 1.5 * a - 0.3 * m - 4 * np.exp(-((a - 3) ** 2 + (m - 6) ** 2) / 4)

    grid = [(0, 0), (0, 3), (0, 6), (0, 9), (3, 0), (6, 0), (9, 0), (2, 7), (4, 5), (6, 3), (3, 6)]
    gp = GPPredictor().fit([(a, m, f(a, m)) for a, m in grid])
    report = gp.fit_report()
    assert report["lengthscale"] in GPPredictor.LENGTHS and report["noise"] in GPPredictor.NOISES
    assert report["mae"] < 0.2 and report["loo_mae"] is not None
    assert abs(gp.predict(3, 6) - f(3, 6)) < 0.5                 # the dip is followed where it was measured
    near, far = gp.uncertainty(3, 6), gp.uncertainty(9, 9)
    assert 0 <= near < far                                      # less sure away from the points
    with pytest.raises(HetpruneError, match="at least 3 distinct"):
        GPPredictor().fit([(0, 0, 90.0), (0, 0, 91.0), (1, 0, 89.0)])
    with pytest.raises(HetpruneError, match="positive number"):
        GPPredictor(lengthscale=-1)
    fixed = GPPredictor(lengthscale=2.0, noise=0.01).fit([(a, m, f(a, m)) for a, m in grid])
    assert fixed.fit_report()["lengthscale"] == 2.0 and fixed.fit_report()["noise"] == 0.01


def test_loss_drop_scores_are_the_loss_increase_of_the_real_removal(tiny_model, tmp_path):
    import torch.nn.functional as F

    from hetprune.harness.testing import scoring_context
    from hetprune_hetdpt.scorers import LossDropScorer

    ctx = scoring_context(tiny_model, tmp_path)
    batches = list(ctx.batches())

    def loss(model):
        model.eval()
        with torch.no_grad():
            return sum(float(F.cross_entropy(model(x), y)) for x, y in batches) / len(batches)

    sites = hetprune.sites(tiny_model, "act") + hetprune.sites(tiny_model, "attn")
    scores = LossDropScorer().score(tiny_model, sites, ctx)
    base = loss(tiny_model)
    for site in sites:   # the gate at 0 is the removal: the score is what removing the site costs
        cut = copy.deepcopy(tiny_model)
        (surgery.remove_attention if site.kind == "attn" else surgery.remove_activation)(cut, site.block)
        assert scores[site] == pytest.approx(loss(cut) - base, abs=1e-5)


def test_loss_drop_selects_greedily_re_measuring_after_each_removal(tiny_model, tmp_path, monkeypatch):
    from hetprune.harness.testing import scoring_context
    from hetprune_hetdpt import scorers

    ctx = scoring_context(tiny_model, tmp_path)
    measured = []
    real = scorers.LossDropScorer._losses

    def spy(self, model, bank, batches, sites, ctx):
        measured.append(sorted(str(s) for s in sites))
        return real(self, model, bank, batches, sites, ctx)

    monkeypatch.setattr(scorers.LossDropScorer, "_losses", spy)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    chosen = scorers.LossDropScorer().select(tiny_model, {"attn": 1, "act": 2}, ctx)
    assert sorted(s.kind for s in chosen) == ["act", "act", "attn"]
    assert len(measured) == 3                                   # one measurement round per removal ...
    acts = [m for m in measured if m[0].startswith("act")]
    assert len(acts[1]) == len(acts[0]) - 1                     # ... of the sites still present
    assert all(torch.equal(v, tiny_model.state_dict()[k]) for k, v in before.items())
    assert not hasattr(tiny_model, gates.GATE_ATTR)


def test_gate_taylor_score_decay(tiny_model, digits_data, tmp_path):
    from hetprune.harness.testing import scoring_context

    with pytest.raises(HetpruneError, match="score_decay must be within"):
        GateTaylorScorer(score_decay=1.5)
    ctx = scoring_context(tiny_model, tmp_path, {"scoring": {"subset": 32}, "short_finetune": {"batch_size": 16}})
    kept = GateTaylorScorer(warmup_epochs=0, score_decay=1.0)
    kept.select(copy.deepcopy(tiny_model), {"attn": 1, "act": 1}, ctx)
    reset = GateTaylorScorer(warmup_epochs=0, score_decay=0.0)
    reset.select(copy.deepcopy(tiny_model), {"attn": 1, "act": 1}, scoring_context(tiny_model, tmp_path / "b", {
        "scoring": {"subset": 32}, "short_finetune": {"batch_size": 16}}))
    assert any(v != 0 for v in kept.last_scores.values())     # the paper's: evidence accumulates
    assert all(v == 0 for v in reset.last_scores.values())    # reset after every removal (the last included)


# -- MAP points chosen gradually ------------------------------------------------------

GRADUAL = {"hetdpt.point_selection": "gradual", "scoring.subset": 64, "short_finetune.batch_size": 32}


def test_a_gradual_point_is_what_the_runs_own_selection_makes_of_that_split(tiny_model, digits_data, tmp_path,
                                                                           monkeypatch):
    from hetprune.pruning.pipeline import remove_sites, select_sites
    from hetprune.training.train import evaluate_dataset

    def no_short_finetune(*a, **k):
        raise AssertionError("a gradual point gets no short fine-tune: the selector already trained it")

    monkeypatch.setattr(hetprune.training.task, "train", no_short_finetune)
    job = make_job(tiny_model, digits_data, tmp_path, **GRADUAL)
    [dense, point] = HetDPT().collect_points(job, [(0, 0), (1, 2)])
    # a point is measured on the selection split (held out of the training data), never on val
    assert dense["split"] == "selection"
    assert dense["metric"] == pytest.approx(evaluate_dataset(tiny_model, digits_data.selection, torch.device("cpu")))
    assert point["selection"] == "gradual" and point["scorer"] == "gate-taylor"
    # the final run's selection stage, from the same dense model and seed, in another folder
    again = make_job(tiny_model, digits_data, tmp_path / "again", **GRADUAL)
    model = copy.deepcopy(tiny_model)
    chosen = select_sites(again, model, {"attn": 1, "act": 2})
    remove_sites(again, model, chosen)
    assert point["sites"] == [str(s) for s in chosen]
    assert point["metric"] == pytest.approx(evaluate_dataset(model, digits_data.selection, torch.device("cpu")))


def test_gradual_points_have_their_own_key_and_a_bad_choice_is_refused(tiny_model, digits_data, tmp_path):
    strategy = HetDPT()

    def key(**changes):
        return strategy.points_key(make_job(tiny_model, digits_data, tmp_path, **changes))

    gradual = {"hetdpt.point_selection": "gradual"}
    assert key() != key(**gradual)
    # one-shot points do not depend on the run's scorer; gradual ones do, options included
    decay = {"scorer_options": "{gate-taylor: {score_decay: 0.5}}"}
    assert key(**decay) == key() and key(**gradual, **decay) != key(**gradual)
    bad = make_job(tiny_model, digits_data, tmp_path, **{"hetdpt.point_selection": "greedy"})
    with pytest.raises(HetpruneError, match="point_selection must be one of oneshot, progressive, gradual, got 'greedy'"):
        strategy.collect_points(bad, [(0, 1)])


def test_one_check_is_refused_as_it_would_change_nothing():
    """Issue 71: hetdpt.verify=1 was accepted and checked nothing (the pick stayed the predictor's) while the log
    said images were spent. A count of 1 is refused as the settings are read, in either spelling."""
    from hetprune.core import config
    from hetprune.core import loader
    from hetprune.core.plugins import get_registry

    hetdpt = get_registry().build("strategy", "hetdpt")
    for policy in ("spread", "best", "near-ties", "points"):
        with pytest.raises(HetpruneError, match=rf"hetdpt.checks_options.{policy}.count must be a count of splits "
                                                ">= 2"):
            loader.resolve(hetdpt, sets=[f"hetdpt.checks={policy}", f"hetdpt.checks_options.{policy}.count=1"])
    with pytest.raises(HetpruneError, match=r"hetdpt.verify must be 0 \(no checks\) or a count of splits >= 2"):
        loader.resolve(hetdpt, sets=["hetdpt.verify=1"])
    for count in (2, 6):
        s = loader.resolve(hetdpt, sets=[f"hetdpt.checks_options.spread.count={count}"])
        assert config.keyed(s)["hetdpt"]["verify"] == count


def test_one_recorder_keeps_every_point_the_map_points_share_points_and_checks(tmp_path):
    """Issue 71, item 6: MAP points, HetDPT+'s share points and the pipeline checks are kept by one recorder
    (`PointStore.record`): stored, held by split, announced; no plugin appends to a store itself."""
    import ast
    from pathlib import Path

    events = []

    class Job:
        def event(self, name, **fields):
            events.append((name, fields["point"]["n_attn"]))

    store, have = PointStore(tmp_path / "points.jsonl", "k"), {}
    kept = store.record(Job(), have, {"n_attn": 1, "n_act": 2, "metric": 90.0})
    store.record(Job(), have, {"n_attn": 2, "n_act": 1, "metric": 80.0}, event=False)
    assert have[(1, 2)] == kept and store.load()[(2, 1)]["metric"] == 80.0
    assert events == [("on_point_collected", 1)]   # a check is kept, not announced as a point
    plugins = Path(__file__).resolve().parent.parent / "plugins"
    appends = [f"{p.name}:{n.lineno}" for p in plugins.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "append"
               and "store" in ast.unparse(n.func.value).lower()]
    assert not appends, appends
    recorded = {p.name for p in plugins.rglob("*.py") if ".record(job, have," in p.read_text()}
    assert recorded == {"point_schemes.py", "share_search.py", "halving.py"}
