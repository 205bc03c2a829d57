"""Issue 58: at a target no study used, a near-tie of the predictor is checked rather than trusted
(``hetdpt.verify_when: unsure``): the splits predicted within the predictor's leave-one-out error of the best
are measured, and a pick that stands out by more is taken without checks."""

from __future__ import annotations

import json

import pytest

import hetprune
from hetprune import HetpruneError
from hetprune.harness.testing import tiny_job
from hetprune_hetdpt.options import HetDPTOptions
from hetprune_hetdpt.predictors import LocalPredictor
from hetprune_hetdpt.strategy import HetDPT


def test_near_ties_are_the_splits_within_the_leave_one_out_error_of_the_best():
    value = {(0, 4): 80.0, (1, 3): 79.0, (2, 2): 76.5, (3, 1): 70.0}
    best = sorted(value, key=lambda p: -value[p])[:3]
    assert HetDPT.near_ties(best, value, 1.5, 1)[0] == [(0, 4), (1, 3)]
    assert HetDPT.near_ties(best, value, 4.0, 1)[0] == [(0, 4), (1, 3), (2, 2)]   # at most K, here 3
    near, said = HetDPT.near_ties(best, value, 0.5, 1)
    assert near == [(0, 4)] and said == {"loo_mae": 0.5, "near": [[0, 4]], "checked": False}
    # a loss (lower is better) and a predictor that cannot say its error (unsure of all K)
    loss = {(0, 4): 0.10, (1, 3): 0.12, (2, 2): 0.30}
    assert HetDPT.near_ties([(0, 4), (1, 3), (2, 2)], loss, 0.05, -1)[0] == [(0, 4), (1, 3)]
    assert HetDPT.near_ties([(0, 4), (1, 3)], value, None, 1)[1]["checked"] is True


SETTINGS = {"scorer": "taylor", "hetdpt": {"point_selection": "oneshot", "axis_points": 2, "mixed_points": 1,
                                           "verify": 2, "verify_by": "pipeline", "verify_when": "unsure",
                                           "verify_among": "best", "verify_images": 96, "predictor": "local"}}


@pytest.mark.parametrize("error", [0.0, 1e9])
def test_a_run_checks_a_near_tie_and_trusts_a_clear_pick(error, tmp_path, monkeypatch):
    monkeypatch.setattr(LocalPredictor, "fit_report", lambda self: {"loo_mae": error})
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, SETTINGS)
    logs = []
    job.log = logs.append
    result = HetDPT().run(job)
    alloc = result.report["allocation"]
    checks_file = tmp_path / "map-pipeline-checks.jsonl"
    if error == 0.0:   # the best predicted split stands out: taken, nothing checked
        assert alloc["unsure"]["checked"] is False and len(alloc["unsure"]["near"]) == 1
        assert "pipeline_checks" not in alloc and "verified" not in alloc["pick"] and not checks_file.exists()
        assert any("stands out, taken without checks" in m for m in logs), logs
    else:              # every split is within the error: the two best are checked
        assert alloc["unsure"]["checked"] is True and len(alloc["unsure"]["near"]) == 2
        assert alloc["pipeline_checks"]["winner"] == [result.report["n_attn"], result.report["n_act"]]
        assert "verified" in alloc["pick"] and len(checks_file.read_text().splitlines()) == 2
        assert any("within it of the best, checked" in m for m in logs), logs
    json.dumps(alloc)


def test_verify_when_is_refused_where_it_does_nothing_or_is_unknown(tmp_path):
    with pytest.raises(HetpruneError, match="hetdpt.verify_when shapes the checks of hetdpt.verify, which is 0"):
        tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, {"hetdpt": {"verify": 0, "verify_when": "unsure"}}).options(HetDPTOptions)
    with pytest.raises(HetpruneError, match="verify_when must be one of always, unsure, got 'sometimes'"):
        tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT,
                 {"hetdpt": {"verify": 2, "verify_when": "sometimes"}}).options(HetDPTOptions)


def test_plan_counts_the_checks_as_if_they_run_and_says_they_may_not(tmp_path):
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, SETTINGS)
    [step] = [s for s in HetDPT().plan_allocation(job) if "checks" in s.stage]
    assert step.train_images == 96 and step.what.endswith("only on a near-tie")


def test_spread_checks_the_best_predicted_split_of_each_part_of_the_line():
    # a predictor sure that attention-heavy splits win: the K best would all sit at that end
    value = {(a, 8 - a): 70.0 + a for a in range(9)}
    assert sorted(value, key=lambda p: -value[p])[:3] == [(8, 0), (7, 1), (6, 2)]
    assert HetDPT.spread(list(value), value, 3, 1) == [(8, 0), (5, 3), (2, 6)]
    # the predicted best is always checked, the result best first; a loss picks the lowest of each run
    bumpy = {(0, 8): 71.0, (1, 7): 75.0, (2, 6): 70.0, (3, 5): 72.0, (4, 4): 80.0, (5, 3): 60.0}
    assert HetDPT.spread(list(bumpy), bumpy, 2, 1) == [(4, 4), (1, 7)]
    assert HetDPT.spread(list(bumpy), bumpy, 2, -1) == [(5, 3), (2, 6)]
    # runs of near-equal length, the first the shorter; K above the splits checks each once
    ten = {(a, 10 - a): float(a % 3) for a in range(10)}
    assert sorted(HetDPT.spread(list(ten), ten, 3, 1)) == [(2, 8), (5, 5), (8, 2)]
    assert sorted(HetDPT.spread(list(bumpy), bumpy, 9, 1)) == sorted(bumpy)


def test_a_run_checks_one_split_in_each_part_of_the_line(tmp_path):
    settings = {"scorer": "taylor", "hetdpt": {**SETTINGS["hetdpt"], "verify_when": "always",
                                               "verify_among": "spread"}}
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, settings)
    logs = []
    job.log = logs.append
    result = HetDPT().run(job)
    alloc = result.report["allocation"]
    predicted = {(d["n_attn"], d["n_act"]): d["predicted"] for d in alloc["surface"]}
    expected = HetDPT.spread(list(predicted), predicted, 2, 1)
    first_round = alloc["pipeline_checks"]["rounds"][0]["measured"]
    assert sorted((m["n_attn"], m["n_act"]) for m in first_round) == sorted(expected)
    line = sorted(predicted)   # budget 2 on a 2-block model: the splits 0+2, 1+1, 2+0 in runs [0+2], [1+1, 2+0]
    assert expected[0] == max(predicted, key=lambda p: (predicted[p], -p[0]))
    assert {line[0]} & set(expected) and set(line[1:]) & set(expected)
    assert any("best predicted split of each part of the line" in m for m in logs), logs
    [step] = [s for s in HetDPT().plan_allocation(job) if "checks" in s.stage]
    assert step.what.endswith("one in each part of the line")


def test_spread_is_refused_beside_unsure_and_where_nothing_is_checked(tmp_path):
    with pytest.raises(HetpruneError, match=r"verify_among spread \(the default\) checks one split in every part.*"
                                            "with verify_when unsure, set hetdpt.verify_among best"):
        tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT,
                 {"hetdpt": {"verify": 2, "verify_among": "spread", "verify_when": "unsure"}}).options(HetDPTOptions)
    with pytest.raises(HetpruneError, match="hetdpt.verify_among shapes the checks of hetdpt.verify, which is 0"):
        tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT,
                 {"hetdpt": {"verify": 0, "verify_among": "best"}}).options(HetDPTOptions)
    with pytest.raises(HetpruneError, match="verify_among must be one of best, spread, got 'all'"):
        tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT,
                 {"hetdpt": {"verify": 2, "verify_among": "all"}}).options(HetDPTOptions)


@pytest.mark.parametrize("among,when", [("spread", "always"), ("best", "always"), ("best", "unsure")])
def test_the_map_study_checks_the_splits_a_run_checks(among, when, tmp_path, monkeypatch):
    """benchmarks/map_points.py measures each predictor's checks itself; it once checked the K best predicted
    whatever verify_among said, so a whole pass measured the default twice."""
    from benchmark_scripts import script
    from hetprune_hetdpt.halving import PipelineChecks

    map_points = script("map_points")
    settings = {"scorer": "taylor", "hetdpt": {**SETTINGS["hetdpt"], "verify": 2, "verify_when": when,
                                               "verify_among": among}}
    job = tiny_job(hetprune.Budget(sites=3), tmp_path, HetDPT, settings)
    ran = []
    real_run = PipelineChecks.run
    monkeypatch.setattr(PipelineChecks, "run", lambda self, c, b=None: ran.append(list(c)) or real_run(self, c, b))
    pairs = sorted(job.feasible_pairs())
    value = {p: 70.0 + 3 * p[0] for p in pairs}   # sure that attention-heavy splits win
    fits = {"local": {"predicted": {f"{a}+{m}": v for (a, m), v in value.items()}, "fit": {"loo_mae": 5.0}}}
    with job.serving():
        map_points.pipeline_checks(HetDPT().allocation(job), fits, None)   # the run's own stage-1 object
    expected, _ = HetDPT.to_check(job.options(HetDPTOptions), pairs, value, 5.0)
    assert ran == [expected]
    assert expected == ([(3, 0), (1, 2)] if among == "spread" else [(3, 0), (2, 1)])
    assert fits["local"]["pipeline_pick"] in {f"{a}+{m}" for a, m in expected}


# -- issue 71: small targets, where the checks cover every feasible split ------------------------------------------

@pytest.mark.parametrize("sites, splits", [(1, 2), (2, 3)])
def test_checks_of_every_split_measure_no_point_and_need_no_predictor(sites, splits, tmp_path):
    """hetprune prune --strategy hetdpt --budget 1 was refused ("predictor 'poly' needs at least 5 distinct
    points ... raise hetdpt.axis_points"), though the 6 default checks measure both splits; at budget 2 six MAP
    points were measured that could not change the pick. Now the checks alone decide, and --plan says so."""
    settings = {"scorer": "taylor", "hetdpt": {"predictor": "poly"}}   # poly: at least 5 points, 3 here at best
    job = tiny_job(hetprune.Budget(sites=sites), tmp_path, HetDPT, settings)
    logs = []
    job.log = logs.append
    steps = HetDPT().plan_allocation(job)
    assert [s.stage for s in steps] == ["stage 1: pipeline checks"]
    assert steps[0].what.endswith(f"every one of the {splits} feasible splits: no MAP point measured")
    result = HetDPT().run(job)
    alloc = result.report["allocation"]
    assert alloc["checked_every_split"] and alloc["points"] == [] and alloc["predictor"] is None
    measured = {(m["n_attn"], m["n_act"]) for m in alloc["pipeline_checks"]["rounds"][0]["measured"]}
    assert len(measured) == splits and (result.report["n_attn"], result.report["n_act"]) in measured
    assert any(f"the 6 checks cover all {splits} feasible splits" in m for m in logs), logs


def test_checks_that_leave_a_split_unchecked_still_fit_the_predictor_on_points(tmp_path):
    settings = {"scorer": "taylor", "hetdpt": {"predictor": "local", "verify": 2, "axis_points": 2,
                                               "mixed_points": 1}}
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, settings)   # 3 splits, 2 checks
    assert [s.stage for s in HetDPT().plan_allocation(job)] == ["stage 1: MAP points", "stage 1: pipeline checks"]
    alloc = HetDPT().run(job).report["allocation"]
    assert alloc["predictor"] == "local" and alloc["points"] and "checked_every_split" not in alloc


def test_a_small_target_without_checks_fits_a_plane_through_its_points_and_prunes(tmp_path):
    """Issue 71: with no checks (verify 0, the paper's argmax) a budget of one site has 3 points at most, fewer
    than poly needs: a plane is fitted through them, said in one line, and the run prunes; --plan agrees."""
    settings = {"scorer": "taylor", "hetdpt": {"predictor": "poly", "verify": 0}}
    job = tiny_job(hetprune.Budget(sites=1), tmp_path, HetDPT, settings)
    logs = []
    job.log = logs.append
    assert [s.stage for s in HetDPT().plan_allocation(job)] == ["stage 1: MAP points"]
    result = HetDPT().run(job)
    alloc = result.report["allocation"]
    assert alloc["predictor"] == "poly" and alloc["fit"]["degree"] == 1 and len(alloc["points"]) == 3
    assert alloc["predictor_fallback"] == {"configured": "poly", "plan_points": 3}
    measured = {(p["n_attn"], p["n_act"]): p["metric"] for p in alloc["points"] if p["n_attn"] + p["n_act"] == 1}
    best = max(measured, key=lambda p: (measured[p], -p[0]))   # a plane through 3 points predicts them exactly
    assert (result.report["n_attn"], result.report["n_act"]) == best
    assert sum("fitting a plane (poly of degree 1)" in m for m in logs) == 1, logs
