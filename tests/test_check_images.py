"""Issue 58, item 2: pipeline checks sized in training images (a checks policy's ``budget`` with ``unit:
images``, the default), like the MAP points,
instead of in final fine-tunes: each check fine-tunes on the points' schedule cut to its share, and what they
spend is what the setting says, whatever the final schedule."""

from __future__ import annotations

import pytest

import hetprune
from hetprune import HetpruneError
from hetprune.harness.testing import tiny_job
from hetprune.pruning.plan import val_size
from hetprune_hetdpt.halving import PipelineChecks, checks_run, most_spent
from hetprune_hetdpt.options import HetDPTOptions
from hetprune_hetdpt.strategy import HetDPT

POINTS = {"point_selection": "oneshot", "point_finetune": "short_finetune"}


def spread_checks(budget="auto", count: int = 4, **options) -> dict:
    """``count`` spread checks within ``budget`` images, the candidates selected as the final run selects (the
    default: 7 % of it, at least 300 images)."""
    return {**POINTS, "checks": "spread",
            "checks_options": {"spread": {"count": count, "selection": 1.0, "budget": budget, **options}}}


# tiny schedules: the final fine-tune 1 epoch x 48 images, the points' (short_finetune) 1 epoch x 32, batch 16
SHORT_LR = 3e-4


def sized(tmp_path, images: int, scorer: str = "taylor", **options):
    return tiny_job(hetprune.Budget(sites=4), tmp_path, HetDPT,
                    {"scorer": scorer, "short_finetune": {"lr": SHORT_LR}, "hetdpt": spread_checks(images, **options)})


def test_checks_sized_in_images_fine_tune_on_the_points_schedule_and_spend_what_they_say(tmp_path, monkeypatch):
    job = sized(tmp_path, 128)
    seen = []

    def fit(model, teacher, cfg, *args, **kwargs):   # a stub fine-tune: what it was asked to train on
        seen.append(cfg)

    monkeypatch.setattr(job.task, "fit", fit)
    checks = PipelineChecks(job)
    assert (checks.unit.section, checks.unit.images) == ("short_finetune", 32)
    out = checks.run([(0, 4), (1, 3), (2, 2), (3, 1)])
    # 128 images in 2 rounds: 4 checks at half the points' 32 images, then 2 at all of them (the final
    # fine-tune's 48 are never used)
    assert [(c.epochs, c.subset) for c in seen] == [(1, 16)] * 4 + [(1, 32)] * 2
    assert all(c.lr == SHORT_LR for c in seen)
    assert sum(c.epochs * c.subset for c in seen) == 128
    report = out.to_dict()
    assert (report["unit"], report["unit_images"], report["budget_images"], report["spent_images"]) == \
        ("short_finetune", 32, 128, 128)
    # a budget the rounds cannot fill (each check at most the whole schedule) spends less, never more; the
    # round that gives the whole schedule is the last: a second would re-ask its checks and train nothing, so
    # what is counted spent is what the fine-tunes trained on
    seen.clear()
    more = PipelineChecks(sized(tmp_path / "more", 1000))
    monkeypatch.setattr(more.job.task, "fit", fit)
    halved = more.run([(0, 4), (1, 3), (2, 2), (3, 1)]).to_dict()
    assert [(c.epochs, c.subset) for c in seen] == [(1, 32)] * 4
    assert halved["spent_images"] == sum(c.epochs * c.subset for c in seen) == 4 * 32
    assert [r["fraction"] for r in halved["rounds"]] == [1.0] and len(halved["rounds"][0]["kept"]) == 1


def test_a_learning_selectors_phase_is_counted_in_images(tmp_path):
    checks = PipelineChecks(sized(tmp_path, 10_000, scorer="gate-taylor"))
    # gate-taylor's phase of 2+2: warm-up + 4 removals, one epoch each over the scoring subset's 16 images
    assert checks.selection_cost((2, 2)) * checks.unit.images == pytest.approx(5 * 16)
    assert checks.unit.said(checks.selection_cost((2, 2))) == "80 images"


def test_the_candidates_can_be_selected_on_a_number_of_images_per_gate_epoch(tmp_path):
    checks = PipelineChecks(sized(tmp_path, 10_000, scorer="gate-taylor", selection=8))
    assert checks.select_job.config.scoring_batches.subset == 8 and not checks.own_selection
    assert checks.job.config.scoring_batches.subset == 16   # the final run's own selection keeps its subset
    assert checks.selection_cost((2, 2)) * checks.unit.images == pytest.approx(5 * 8)
    with pytest.raises(HetpruneError, match=r"spread.selection 16 images per gate epoch is not fewer than the 16 "):
        PipelineChecks(sized(tmp_path / "b", 10_000, scorer="gate-taylor", selection=16))


def test_a_floor_under_the_share_raises_a_selection_to_that_many_images_or_to_the_runs_own(tmp_path):
    # the scoring subset is 16 images: a quarter is 4, the floor 8 lifts it; three quarters (12) stay above it
    floored = PipelineChecks(sized(tmp_path, 10_000, scorer="gate-taylor", selection=0.25, selection_at_least=8))
    assert floored.select_job.config.scoring_batches.subset == 8 and not floored.own_selection
    assert floored.selection_cost((2, 2)) * floored.unit.images == pytest.approx(5 * 8)
    above = PipelineChecks(sized(tmp_path / "b", 10_000, scorer="gate-taylor", selection=0.75, selection_at_least=8))
    assert above.select_job.config.scoring_batches.subset == 12
    # a floor of the whole subset or more is the final run's own selection: the winner's reused, its key too
    own = PipelineChecks(sized(tmp_path / "c", 10_000, scorer="gate-taylor", selection=0.25, selection_at_least=16))
    assert own.select_job is own.job and own.own_selection
    assert own.key == PipelineChecks(sized(tmp_path / "d", 10_000, scorer="gate-taylor")).key   # selection 1
    assert floored.key != own.key != above.key
    # --plan says what each candidate's gate phase sees, and says nothing where it is the run's own
    [step] = [s for s in HetDPT().plan_allocation(floored.job) if "pipeline checks" in s.stage]
    assert "; each candidate selected on 8 images a gate epoch" in step.what, step.what
    [step] = [s for s in HetDPT().plan_allocation(own.job) if "pipeline checks" in s.stage]
    assert "selected on" not in step.what


def test_plan_counts_the_images_the_setting_gives(tmp_path):
    job = sized(tmp_path, 128)   # 4 checks at half the points' 32 images, then 2 at all of them: 128 in all
    [step] = [s for s in HetDPT().plan_allocation(job) if "pipeline checks" in s.stage]
    assert step.train_images == 128 and "at most 128 images" in step.what
    # with the run's own gate-taylor selection, the winner's is the select stage's gate phase: counted there
    sites = HetDPT().plan_sites(job)
    one = PipelineChecks(sized(tmp_path / "probe", 10_000, scorer="gate-taylor")).selection_cost(
        (sites - sites // 2, sites // 2)) * 32
    own = sized(tmp_path / "own", round(4 * one) + 128, scorer="gate-taylor")
    [step] = [s for s in HetDPT().plan_allocation(own) if "pipeline checks" in s.stage]
    # the 4 feasible splits are the candidates, known before stage 1: their selections counted exactly (the
    # removals they share once), the rest of the budget for the fine-tunes, each at most a whole schedule
    checks = PipelineChecks(own)
    selections = checks.selections_cost(sorted(own.feasible_pairs()))
    budget = (round(4 * one) + 128) / 32
    most = most_spent(4, budget, selections, checks.unit, checks.check_units)
    assert one > 0 and selections * 32 < 4 * one
    assert step.train_images == int((most - one / 32) * 32)


def test_checks_sized_in_images_are_stored_apart_from_checks_of_the_final_schedule(tmp_path):
    final = PipelineChecks(tiny_job(hetprune.Budget(sites=4), tmp_path / "a", HetDPT,
                                    {"scorer": "taylor", "short_finetune": {"lr": SHORT_LR},
                                     "hetdpt": spread_checks(4.0, unit="finetunes")}))
    assert final.unit.section == "finetune" and final.key != PipelineChecks(sized(tmp_path / "b", 128)).key


def test_bad_image_budgets_are_refused_before_anything_trains(tmp_path, monkeypatch):
    # (a budget in images and one in final fine-tunes together, once refused by hand, has no spelling: one
    # budget, one unit)
    for images, changes, words in (
            (0, {}, r"spread.budget must be auto \(the selections and one whole point's fine-tune per check\) or a "
                    "whole number of training images >= 1"),
            (128, {"selection": 2.5}, r"spread.selection must be a share of scoring.subset within \(0, 1\] .*, or "
                                      "a whole number of images per gate epoch above 1")):
        with pytest.raises(HetpruneError, match=words):
            sized(tmp_path, images, **changes).options(HetDPTOptions)
    # too few images for the candidates' gate phases: refused by the run's checks, before any point trains
    job = sized(tmp_path, 100, scorer="gate-taylor")
    monkeypatch.setattr(job.task, "fit", lambda *a, **k: pytest.fail("a point trained before the refusal"))
    # (4 checks of the 4 feasible splits: the candidates are known, and their selections' cost exactly)
    words = (r"hetdpt.checks_options.spread.budget 100 does not pay for the 4 candidates' selections "
             r"\([\d,]+ images\): raise it, lower hetdpt.checks_options.spread.count, or select the candidates on "
             r"fewer images \(hetdpt.checks_options.spread.selection\)")
    with pytest.raises(HetpruneError, match=words):
        HetDPT().check_settings(job)


def test_a_run_with_checks_sized_in_images_reports_them_in_images(tmp_path):
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT,
                   {"scorer": "taylor", "hetdpt": {**spread_checks(48, count=2), "axis_points": 2, "mixed_points": 1}})
    logs = []
    job.log = logs.append
    result = HetDPT().run(job)
    checks = result.report["allocation"]["pipeline_checks"]
    assert checks["budget_images"] == 48 and 0 < checks["spent_images"] <= 48 and checks["unit"] == "short_finetune"
    assert checks["winner"] == [result.report["n_attn"], result.report["n_act"]]
    assert any("pipeline checks of" in m and "at most 48 images in all" in m for m in logs), logs
    assert any(m.startswith("[hetdpt] pipeline checks: ") and "of 48 images spent" in m for m in logs), logs


def test_plan_counts_what_the_rounds_can_spend_where_the_budget_is_more():
    from hetprune_hetdpt.halving import most_spent

    # 4 candidates, 100 units after no selections: 4 checks of one whole schedule each, the last round
    assert most_spent(4, 100.0, 0.0) == 4.0
    assert most_spent(4, 2.0, 0.0) == pytest.approx(2.0)   # 4 x 0.25 + 2 x 0.5: the budget binds
    assert most_spent(3, 10.0, 1.5) == pytest.approx(1.5 + 3 * 1.0)
    assert most_spent(1, 10.0, 0.5) == 0.0   # one candidate is the pick: nothing selected, nothing checked


def test_plan_of_a_generous_image_budget_counts_the_most_the_checks_can_spend(tmp_path):
    job = sized(tmp_path, 10_000)   # 4 checks, taylor (no selection phase): 4 whole points' fine-tunes
    [step] = [s for s in HetDPT().plan_allocation(job) if "pipeline checks" in s.stage]
    assert step.train_images == 4 * 32 and "128 images at most" in step.what
    # each of the 4 is measured once on the selection split
    assert step.fine_tunes == 4 and step.eval_images == 4 * val_size(job.task, job.choice_split) > 0


def test_auto_gives_every_check_one_whole_points_fine_tune_at_any_scale(tmp_path, monkeypatch):
    job = sized(tmp_path, "auto", scorer="gate-taylor", selection=8)
    seen = []
    monkeypatch.setattr(job.task, "fit", lambda model, teacher, cfg, *a, **k: seen.append(cfg))
    checks = PipelineChecks(job)
    candidates = [(0, 4), (1, 3), (2, 2), (3, 1)]
    out = checks.run(candidates).to_dict()
    # 4 checks, each on all of the points' 32 images, in one round: the best of them kept
    assert [(c.epochs, c.subset) for c in seen] == [(1, 32)] * 4
    assert [r["fraction"] for r in out["rounds"]] == [1.0]
    selections = checks.selections_cost(candidates) * 32
    assert out["spent_images"] == out["budget_images"] == round(selections + 4 * 32)
    # --plan counts what the run spent: these 4 candidates (every feasible split, known before stage 1) are
    # selected with the removals they share trained once, less than 4 whole gate phases, then 4 whole fine-tunes
    [step] = [s for s in HetDPT().plan_allocation(job) if "pipeline checks" in s.stage]
    sites = HetDPT().plan_sites(job)
    one = checks.selection_cost((sites - sites // 2, sites // 2)) * 32
    assert step.train_images == out["spent_images"] == round(selections + 4 * 32) < round(4 * one + 4 * 32)
    assert "the removals they share counted once" in step.what
    HetDPT().check_settings(job)   # auto pays for the selections by design: nothing to refuse


def test_auto_is_the_only_word_a_budget_takes(tmp_path):
    with pytest.raises(HetpruneError, match=r"spread.budget must be auto \(.*\) or a whole number of training "
                                            "images >= 1 .*, got 'lots'"):
        sized(tmp_path, "lots").options(HetDPTOptions)


def test_the_default_checks_on_a_task_of_unknown_size_are_refused_before_training_with_every_way_out(
        tiny_model, digits_data, tmp_path):
    """A user's Task of plain batches has no known training size; with no subset on the points' schedule the
    default checks cannot be sized in images: refused before anything trains, naming each way out."""
    import torch

    xs = torch.stack([digits_data.train[i][0] for i in range(32)])
    ys = torch.tensor([digits_data.train[i][1] for i in range(32)])
    batches = [(xs[i:i + 16], ys[i:i + 16]) for i in (0, 16)]
    task = hetprune.Task(batches, batches, loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                         metric=lambda m, bs: 1.0, metric_name="top1")
    trained = []
    task.fit = lambda *a, **k: trained.append(1)   # nothing may train before the refusal
    settings = {"finetune": {"epochs": 1, "subset": None}, "short_finetune": {"epochs": 1, "subset": None}}
    with pytest.raises(HetpruneError, match=r"set finetune\.subset, use hetdpt\.checks_options\.spread\.unit "
                                            r"finetunes, or pick without checks with hetdpt\.checks none"):
        hetprune.prune(tiny_model, task, strategy="hetdpt", budget=2, out=tmp_path / "out", settings=settings)
    assert not trained


def test_a_budget_that_cannot_pay_for_known_candidates_is_refused_before_stage_1(tmp_path, monkeypatch):
    """Issue 71: where the checks cover every feasible split the candidates are known before any point, so
    their selections' cost is too; a budget between the floor (any k of the splits) and that cost passed the
    pre-flight and was refused after stage 1."""
    probe = sized(tmp_path / "probe", 10_000, scorer="gate-taylor")
    pairs = sorted(probe.feasible_pairs())
    assert len(pairs) == 4 and HetDPT().allocation(probe).covered
    checks = PipelineChecks(probe)
    floor, exact = checks.least_selections_cost(pairs, 4), checks.selections_cost(pairs)
    assert floor < exact   # a budget between them passed the floor's check
    images = round((floor + exact) / 2 * checks.unit.images)
    job = sized(tmp_path / "run", images, scorer="gate-taylor")
    monkeypatch.setattr(job.task, "fit", lambda *a, **k: pytest.fail("something trained before the refusal"))
    words = (rf"hetdpt.checks_options.spread.budget {images:,} does not pay for the 4 candidates' selections "
             rf"\({round(exact * checks.unit.images):,} images\)")
    with pytest.raises(HetpruneError, match=words):
        HetDPT().check_settings(job)


def test_candidates_whose_selections_the_budget_cannot_pay_are_fewer_not_a_refusal_after_stage_1(tmp_path,
                                                                                              monkeypatch):
    """Which candidates the predictor picks is known only after stage 1: where their selections cost more than
    the budget (the pre-flight checks a floor), the best predicted that it pays for are checked, said in a
    line, and stage 1's points are not thrown away by a refusal."""
    job = sized(tmp_path, 10_000, scorer="gate-taylor")
    logs, trained = [], []
    job.log = logs.append
    monkeypatch.setattr(job.task, "fit", lambda model, teacher, cfg, *a, **k: trained.append(cfg))
    checks = PipelineChecks(job)
    candidates = [(0, 4), (3, 1), (2, 2), (1, 3)]
    two = checks.selections_cost(candidates[:2])
    budget = (two + checks.selections_cost(candidates[:3])) / 2   # pays for the first two, not the third
    assert budget > two
    out = checks.run(candidates, budget)
    assert [(m["n_attn"], m["n_act"]) for m in out.rounds[0]["measured"]] == candidates[:2]
    assert any("pays for the selections of 2 of the 4 candidates" in m and "checking the 2 best predicted" in m
               for m in logs), logs
    assert len(trained) == checks_run(2, budget, two, checks.unit)
    # spent: the two selections and what the checks trained on (at least one batch each: counted as trained)
    assert out.spent * checks.unit.images == pytest.approx(
        two * checks.unit.images + sum(c.epochs * c.subset for c in trained))
    # a budget that pays for no second selection checks nothing: the best predicted is the pick, nothing spent
    alone = PipelineChecks(sized(tmp_path / "alone", 10_000, scorer="gate-taylor"))
    alone.job.log = logs.append
    single = alone.run(candidates, alone.selections_cost(candidates[:1]) * 0.5)
    assert single.winner == candidates[0] and single.rounds == [] and single.spent == 0
