"""Pipeline checks (issue 43, item 2; since issue 71 any pipeline checks policy of ``hetdpt.checks``): the
candidate splits through the final run's own selection and fine-tune, by successive halving within a budget in
final-fine-tune units (``unit: finetunes``)."""

from __future__ import annotations

import json

import pytest

import hetprune
from hetprune import HetpruneError
from hetprune.harness.testing import tiny_job
from hetprune_hetdpt.checks import SpreadChecks
from hetprune_hetdpt.halving import checks_run, fractions, halving
from hetprune_hetdpt.options import HetDPTOptions
from hetprune_hetdpt.strategy import HetDPT

# checks in final fine-tunes on the final run's own selection (the defaults before checks were sized in images;
# test_check_images.py tests those)
IN_FINAL_FINETUNES = {"scorer": "gate-taylor", "hetdpt": {"checks_options": {"spread": {"selection": 1.0,
                                                                                     "unit": "finetunes"}}}}


def spread(**options) -> dict:
    """Spread checks in final fine-tunes, with ``options``."""
    return {"checks": "spread", "checks_options": {"spread": {"unit": "finetunes", **options}}}


def test_each_round_splits_its_share_of_the_budget_among_fewer_candidates():
    assert fractions(4, 2.0, 0.0) == [0.25, 0.5]          # rounds of 4 and 2 candidates, 1 unit each
    assert fractions(8, 3.0, 0.0) == [0.125, 0.25, 0.5]
    assert fractions(3, 3.0, 1.5) == [0.5]                # 3 -> 1: one round, after 1.5 units of selections
    assert fractions(2, 10.0, 0.0) == [1.0]               # never more than the whole final schedule
    # a round that gives the whole schedule is the last: a later one would re-ask its checks, training nothing
    assert fractions(8, 15.0, 0.0) == [0.625, 1.0]        # 8 at 5/8, then 4 at the whole: no round of 2
    assert fractions(6, 12.0, 0.0) == [1.0]
    assert checks_run(8, 15.0, 0.0) == 8 + 4 and checks_run(8, 3.0, 0.0) == 8 + 4 + 2 and checks_run(1, 9.0, 0.0) == 0
    lasts = halving([(0, 2), (1, 1), (2, 0)], lambda s, f: float(s[0]), budget=9.0)
    assert [len(r["measured"]) for r in lasts.rounds] == [3] and lasts.winner == (2, 0) and lasts.spent == 3.0
    assert fractions(1, 1.0, 0.0) == []
    with pytest.raises(HetpruneError, match=r"budget 1 .* does not pay for the 3 candidates' selections"):
        fractions(3, 1.0, 1.2)


def test_successive_halving_keeps_the_better_half_and_spends_at_most_its_budget():
    truth = {(0, 8): 70.0, (2, 6): 80.0, (4, 4): 75.0, (6, 2): 60.0, (8, 0): 90.0, (1, 7): 50.0, (3, 5): 85.0,
             (5, 3): 65.0}
    calls = []

    def run(split, fraction):   # a longer fine-tune recovers more, the ranking stays the truth's
        calls.append((split, fraction))
        return truth[split] * (0.5 + fraction / 2)

    candidates = list(truth)
    out = halving(candidates, run, budget=4.0, selection_cost=1.0)
    assert [len(r["measured"]) for r in out.rounds] == [8, 4, 2]
    assert [r["kept"] for r in out.rounds] == [[[8, 0], [3, 5], [2, 6], [4, 4]], [[8, 0], [3, 5]], [[8, 0]]]
    assert out.winner == (8, 0)
    assert out.spent <= out.budget + 1e-9 and out.spent == pytest.approx(1.0 + sum(f for _, f in calls))
    # each round's candidates run longer than the last's
    per_round = [r["fraction"] for r in out.rounds]
    assert per_round == sorted(per_round) and per_round[0] < per_round[-1]
    # a lower-is-better metric keeps the lowest; ties keep the better predicted (earlier) candidate
    low = halving([(0, 1), (1, 0)], lambda s, f: 5.0, budget=1.0, sign=-1)
    assert low.winner == (0, 1)
    worst = halving(candidates, lambda s, f: truth[s], budget=4.0, sign=-1)
    assert worst.winner == (1, 7)
    assert json.loads(json.dumps(out.to_dict()))["winner"] == [8, 0]


def test_the_checks_run_the_final_pipeline_on_the_selection_split_and_go_into_the_report(tmp_path):
    settings = {"hetdpt": {"point_selection": "oneshot", "axis_points": 2, "mixed_points": 1,
                           **spread(count=2, budget=6.0, selection=1.0)},
                "scorer": "taylor"}
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, settings)
    result = HetDPT().run(job)
    alloc = result.report["allocation"]
    checks = alloc["pipeline_checks"]
    assert checks["budget"] == 6.0 and 0 < checks["spent"] <= 6.0
    [round1] = checks["rounds"]
    assert len(round1["measured"]) == 2 and len(round1["kept"]) == 1
    assert checks["winner"] == [result.report["n_attn"], result.report["n_act"]]
    assert alloc["pick"]["verified"] == next(m["metric"] for m in round1["measured"]
                                             if [m["n_attn"], m["n_act"]] == checks["winner"])
    # stored, measured on the selection split, and reused by a rerun instead of fine-tuned again
    rows = [json.loads(line) for line in (tmp_path / "map-pipeline-checks.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {r["split"] for r in rows} == {"selection"}
    again = HetDPT().run(tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, settings))
    assert again.report["allocation"]["pipeline_checks"] == checks and "selection_subset" not in checks
    assert len((tmp_path / "map-pipeline-checks.jsonl").read_text().splitlines()) == 2


def test_bad_budgets_are_refused_with_what_is_allowed(tmp_path):
    for changes, words in ((spread(unit="grid"), "spread.unit must be images .* or finetunes"),
                           (spread(budget=0), r"spread.budget must be auto \(the selections and 2 final fine-tunes\) "
                                              "or a number of final fine-tunes > 0")):
        with pytest.raises(HetpruneError, match=words):
            tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, {"hetdpt": changes}).options(HetDPTOptions)


def test_a_learning_selectors_phase_is_counted_against_the_budget(tmp_path):
    from hetprune_hetdpt.halving import PipelineChecks

    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, IN_FINAL_FINETUNES)
    checks = PipelineChecks(job)
    # the gate phase of a 1+1 split: warm-up + one epoch per removal over the scoring subset, against the
    # final fine-tune's images (tiny settings: 1 epoch x 48)
    cost = checks.selection_cost((1, 1))
    assert cost == pytest.approx((1 + 2 * 1) * 16 / 48)
    # a budget that does not pay for both selections, known only once the candidates are: the best predicted
    # is the pick unchecked (said in a line), not a refusal after stage 1 (the pre-flight refuses what it can)
    out = checks.run([(1, 1), (2, 0)], budget=2 * cost)
    assert out.winner == (1, 1) and out.rounds == [] and out.spent == 0


def test_the_default_budget_pays_for_the_selections_and_two_final_finetunes(tmp_path, monkeypatch):
    from hetprune_hetdpt import halving as module

    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, IN_FINAL_FINETUNES)
    checks = module.PipelineChecks(job)
    seen = {}

    def record(candidates, run, budget, selection_cost=0.0, sign=1, unit=module.FINAL, cost=None):
        seen.update(budget=budget, cost=selection_cost)
        return module.Halving(budget=budget)

    monkeypatch.setattr(module, "halving", record)
    logs = []
    job.log = logs.append
    checks.run([(1, 1), (2, 0)])
    cost = checks.selection_cost((1, 1)) + checks.selection_cost((2, 0))
    assert cost > 0 and seen == {"budget": pytest.approx(cost + module.FINETUNES_BEYOND_SELECTION),
                                 "cost": pytest.approx(cost)}
    # the run says what the checks may cost before they start
    said = (f"[hetdpt] pipeline checks of 1+1, 2+0: selections {cost:.2f} final fine-tunes, at most {cost + 2:.2f} "
            "final fine-tunes in all")
    assert said in logs, logs
    checks.run([(1, 1), (2, 0)], budget=5.0)
    assert seen["budget"] == 5.0
    assert SpreadChecks().finetunes is None   # the default is sized in images (test_check_images.py)


def test_gate_taylor_says_which_first_removals_two_selections_share():
    from hetprune_hetdpt.scorers import GateTaylorScorer

    share = GateTaylorScorer.shared_removals
    # alternating, attention first: 5+9 and 6+8 remove attn, act, ... alike for their first 10 removals
    assert share({"attn": 5, "act": 9}, {"attn": 6, "act": 8}) == 10
    assert share({"attn": 1, "act": 2}, {"attn": 2, "act": 2}) == 2
    assert share({"attn": 3, "act": 3}, {"attn": 3, "act": 3}) == 6
    # other kinds gated (an act-only or attn-only split): nothing shared, though the first removal's kind agrees
    assert share({"attn": 0, "act": 3}, {"attn": 1, "act": 2}) == 0
    assert share({"attn": 2, "act": 0}, {"attn": 1, "act": 1}) == 0


def _gate_select(job, counts, workdir, shared):
    """gate-taylor's selection of ``counts`` from the job's dense model: (sites, weights, removals trained)."""
    import copy

    from hetprune.pruning.pipeline import scoring_context, select_sites

    model = job.place(copy.deepcopy(job.dense))
    ctx = scoring_context(job, workdir)
    trained = []
    ctx.progress, ctx.on_epoch_end = False, lambda step, metrics: trained.append(step)
    ctx.shared_states, ctx.keep_states_at = shared
    chosen = select_sites(job, model, counts, ctx=ctx)
    return sorted(map(str, chosen)), model.state_dict(), trained


def test_a_selection_continuing_from_a_kept_state_is_the_one_made_from_scratch(tmp_path):
    import torch

    job = tiny_job(hetprune.Budget(sites=3), tmp_path / "job", HetDPT, {"scorer": "gate-taylor"})
    logs = []
    job.log = logs.append
    alone = _gate_select(job, {"attn": 1, "act": 2}, tmp_path / "alone", (None, ()))
    assert alone[2] == [1, 2, 3]
    shared = tmp_path / "shared"
    first = _gate_select(job, {"attn": 2, "act": 2}, tmp_path / "a", (shared, (2, 4)))
    assert first[2] == [1, 2, 3, 4] and len(list(shared.glob("gate-*.pt"))) == 2
    second = _gate_select(job, {"attn": 1, "act": 2}, tmp_path / "b", (shared, ()))
    assert second[2] == [3]   # removals 1-2 (attn, act) were the 2+2 selection's
    assert any("removals 1-2 of 3 are another selection's" in m for m in logs)
    assert second[0] == alone[0]
    assert second[1].keys() == alone[1].keys() and all(torch.equal(second[1][k], alone[1][k]) for k in alone[1])
    # the kept state of all 4 removals: the same selection again trains nothing (the final select stage after
    # the checks); the 1+2 selection kept nothing, so another 1+2 trains its last removal again
    again = _gate_select(job, {"attn": 2, "act": 2}, tmp_path / "c", (shared, ()))
    assert again[2] == [] and again[0] == first[0]
    assert all(torch.equal(again[1][k], first[1][k]) for k in first[1])


def test_a_kept_state_from_another_start_or_setting_is_not_taken(tmp_path):
    job = tiny_job(hetprune.Budget(sites=3), tmp_path / "job", HetDPT, {"scorer": "gate-taylor"})
    shared = tmp_path / "shared"
    _gate_select(job, {"attn": 2, "act": 2}, tmp_path / "a", (shared, (2,)))
    other = tiny_job(hetprune.Budget(sites=3), tmp_path / "job2", HetDPT,
                     {"scorer": "gate-taylor", "short_finetune": {"lr": 1e-5}})
    assert _gate_select(other, {"attn": 1, "act": 2}, tmp_path / "b", (shared, ()))[2] == [1, 2, 3]
    seeded = tiny_job(hetprune.Budget(sites=3), tmp_path / "job3", HetDPT, {"scorer": "gate-taylor", "seed": 1})
    assert _gate_select(seeded, {"attn": 1, "act": 2}, tmp_path / "c", (shared, ()))[2] == [1, 2, 3]


def test_shared_removals_are_counted_once_against_the_budget(tmp_path):
    from hetprune_hetdpt.halving import PipelineChecks

    job = tiny_job(hetprune.Budget(sites=4), tmp_path, HetDPT, IN_FINAL_FINETUNES)
    checks = PipelineChecks(job)
    per_epoch = 16 / 48   # one gate epoch over the scoring subset, in final fine-tunes (1 epoch x 48)
    assert checks.selection_cost((2, 2)) == pytest.approx((1 + 4) * per_epoch)        # warm-up + 4 removals
    assert checks.selection_cost((1, 2), shared=2) == pytest.approx(1 * per_epoch)     # its third removal only
    assert checks.selections_cost([(2, 2), (1, 2), (0, 4)]) == pytest.approx((5 + 1 + 5) * per_epoch)
    assert checks.selections_cost([(1, 2), (2, 2)]) == pytest.approx((4 + 2) * per_epoch)


def test_the_final_select_stage_continues_from_the_winners_kept_selection(tmp_path):
    settings = {"hetdpt": {"point_selection": "oneshot", "axis_points": 2, "mixed_points": 1,
                           **spread(count=2, budget=12.0, selection=1.0)},
                "scorer": "gate-taylor"}
    job = tiny_job(hetprune.Budget(sites=3), tmp_path, HetDPT, settings)
    logs = []
    job.log = logs.append
    result = HetDPT().run(job)
    winner = result.report["allocation"]["pipeline_checks"]["winner"]
    n = sum(winner)
    said = [m for m in logs if f"removals 1-{n} of {n} are another selection's" in m]
    assert len(said) == 1, logs   # the final select trained nothing: the winner's check had made it


def test_cheaper_checks_select_on_a_share_of_the_scoring_subset_and_cost_that_share(tmp_path):
    from hetprune_hetdpt.halving import PipelineChecks

    full = PipelineChecks(tiny_job(hetprune.Budget(sites=4), tmp_path / "a", HetDPT, IN_FINAL_FINETUNES))
    half = PipelineChecks(tiny_job(hetprune.Budget(sites=4), tmp_path / "b", HetDPT,
                                   {"scorer": "gate-taylor", "hetdpt": spread(count=2, selection=0.5,
                                                                              selection_at_least=None)}))
    assert full.select_job is full.job and half.select_job.config.scoring_batches.subset == 8   # of 16
    assert half.job.config.scoring_batches.subset == 16   # the run's own selection keeps its subset
    assert half.selection_cost((2, 2)) == pytest.approx((1 + 4) * 8 / 48)
    assert half.selections_cost([(2, 2), (1, 2)]) == pytest.approx(full.selections_cost([(2, 2), (1, 2)]) / 2)
    assert half.key != full.key   # checks stored at one share are not taken for another's
    # no subset: the share is of the training set
    whole = PipelineChecks(tiny_job(hetprune.Budget(sites=4), tmp_path / "c", HetDPT,
                                    {"scorer": "gate-taylor", "scoring": {"subset": None},
                                     "hetdpt": spread(count=2, selection=0.25, selection_at_least=None)}))
    assert whole.select_job.config.scoring_batches.subset == round(whole.job.task.train_size / 4)


def test_a_bad_selection_is_refused_with_what_is_allowed(tmp_path):
    share = r"hetdpt.checks_options.spread.selection must be a share of scoring.subset within \(0, 1\]"
    for bad in (0, 1.5, -0.5, "half"):
        with pytest.raises(HetpruneError, match=share + f".*got {bad!r}"):
            tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT,
                     {"hetdpt": spread(selection=bad)}).options(HetDPTOptions)


def test_after_cheaper_checks_the_final_select_stage_selects_the_winner_on_the_whole_subset(tmp_path):
    settings = {"hetdpt": {"point_selection": "oneshot", "axis_points": 2, "mixed_points": 1,
                           **spread(count=2, budget=12.0, selection=0.5, selection_at_least=None)},
                "scorer": "gate-taylor"}
    job = tiny_job(hetprune.Budget(sites=3), tmp_path, HetDPT, settings)
    logs = []
    job.log = logs.append
    result = HetDPT().run(job)
    checks = result.report["allocation"]["pipeline_checks"]
    n = sum(checks["winner"])
    assert not [m for m in logs if f"removals 1-{n} of {n} are another selection's" in m], logs
    assert checks["spent"] <= 12.0 and checks["selection_subset"] == 8   # half of the tiny run's 16
    # the final selection is the run's own, from scratch on the whole subset
    fresh = tiny_job(hetprune.Budget(sites=3), tmp_path / "fresh", HetDPT, settings)
    alone = _gate_select(fresh, {"attn": checks["winner"][0], "act": checks["winner"][1]}, tmp_path / "alone",
                         (None, ()))
    assert alone[2] == list(range(1, n + 1)) and alone[0] == sorted(result.report["sites"])
