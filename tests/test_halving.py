"""hetdpt.verify_by pipeline (issue 43, item 2): the K best predicted splits through the final run's own
selection and fine-tune, by successive halving within a budget in final-fine-tune units."""

from __future__ import annotations

import json

import pytest

import hetprune
from hetprune import HetpruneError
from hetprune.harness.testing import tiny_job
from hetprune_hetdpt.halving import fractions, halving
from hetprune_hetdpt.options import HetDPTOptions
from hetprune_hetdpt.strategy import HetDPT


def test_each_round_splits_its_share_of_the_budget_among_fewer_candidates():
    assert fractions(4, 2.0, 0.0) == [0.25, 0.5]          # rounds of 4 and 2 candidates, 1 unit each
    assert fractions(8, 3.0, 0.0) == [0.125, 0.25, 0.5]
    assert fractions(3, 3.0, 1.5) == [0.5]                # 3 -> 1: one round, after 1.5 units of selections
    assert fractions(2, 10.0, 0.0) == [1.0]               # never more than the whole final schedule
    assert fractions(1, 1.0, 0.0) == []
    with pytest.raises(HetpruneError, match=r"verify_budget 1 .* does not pay for the 3 candidates' selections"):
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
    settings = {"hetdpt": {"point_selection": "oneshot", "axis_points": 2, "mixed_points": 1, "verify": 2,
                           "verify_by": "pipeline", "verify_budget": 6.0},
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
    assert again.report["allocation"]["pipeline_checks"] == checks
    assert len((tmp_path / "map-pipeline-checks.jsonl").read_text().splitlines()) == 2


def test_bad_verify_settings_are_refused_with_what_is_allowed(tmp_path):
    for changes, words in (({"verify_by": "grid"}, "verify_by must be one of points, pipeline"),
                           ({"verify_budget": 0}, "verify_budget must be a number of final fine-tunes > 0, or null")):
        with pytest.raises(HetpruneError, match=words):
            tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, {"hetdpt": changes}).options(HetDPTOptions)


def test_a_learning_selectors_phase_is_counted_against_the_budget(tmp_path):
    from hetprune_hetdpt.halving import PipelineChecks

    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, {"scorer": "gate-taylor"})
    checks = PipelineChecks(job)
    # the gate phase of a 1+1 split: warm-up + one epoch per removal over the scoring subset, against the
    # final fine-tune's images (tiny settings: 1 epoch x 48)
    cost = checks.selection_cost((1, 1))
    assert cost == pytest.approx((1 + 2 * 1) * 16 / 48)
    with pytest.raises(HetpruneError, match="does not pay for the 2 candidates' selections"):
        checks.run([(1, 1), (2, 0)], budget=2 * cost)


def test_the_default_budget_pays_for_the_selections_and_two_final_finetunes(tmp_path, monkeypatch):
    from hetprune_hetdpt import halving as module

    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, {"scorer": "gate-taylor"})
    checks = module.PipelineChecks(job)
    seen = {}

    def record(candidates, run, budget, selection_cost=0.0, sign=1):
        seen.update(budget=budget, cost=selection_cost)
        return module.Halving(budget=budget)

    monkeypatch.setattr(module, "halving", record)
    checks.run([(1, 1), (2, 0)])
    cost = checks.selection_cost((1, 1)) + checks.selection_cost((2, 0))
    assert cost > 0 and seen == {"budget": pytest.approx(cost + module.FINETUNES_BEYOND_SELECTION),
                                 "cost": pytest.approx(cost)}
    checks.run([(1, 1), (2, 0)], budget=5.0)
    assert seen["budget"] == 5.0
    assert HetDPTOptions.defaults()["verify_budget"] is None
