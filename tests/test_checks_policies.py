"""The checks policies (``hetdpt.checks``, issue 71): which splits stage 1 checks after the fit. Issue 58: at a
target no study used, a near-tie of the predictor is checked rather than trusted (``near-ties``): the splits
predicted within the predictor's leave-one-out error of the best are measured, and a pick that stands out by
more is taken without checks; ``spread`` checks one split in each part of the budget line; ``all`` (or as many
checks as splits) needs no point."""

from __future__ import annotations

import json

import pytest

import hetprune
from hetprune import HetpruneError
from hetprune.harness.testing import tiny_job
from hetprune_hetdpt.checks import NearTieChecks, near_ties
from hetprune_hetdpt.options import HetDPTOptions
from hetprune_hetdpt.predictors import LocalPredictor
from hetprune_hetdpt.strategy import HetDPT
from hetprune.core import loader


def test_near_ties_are_the_splits_within_the_leave_one_out_error_of_the_best():
    value = {(0, 4): 80.0, (1, 3): 79.0, (2, 2): 76.5, (3, 1): 70.0}
    best = sorted(value, key=lambda p: -value[p])[:3]
    assert near_ties(best, value, 1.5, 1) == [(0, 4), (1, 3)]
    assert near_ties(best, value, 4.0, 1) == [(0, 4), (1, 3), (2, 2)]   # at most K, here 3
    policy = NearTieChecks(count=3)
    assert policy.candidates(list(value), value, 0.5, 1) == [(0, 4)]
    assert policy.unsure(list(value), value, 0.5, 1) == {"loo_mae": 0.5, "near": [[0, 4]], "checked": False}
    assert NearTieChecks(count=2).candidates(list(value), value, 4.0, 1) == [(0, 4), (1, 3)]   # of the 2 best
    # a loss (lower is better) and a predictor that cannot say its error (unsure of all K)
    loss = {(0, 4): 0.10, (1, 3): 0.12, (2, 2): 0.30}
    assert near_ties([(0, 4), (1, 3), (2, 2)], loss, 0.05, -1) == [(0, 4), (1, 3)]
    assert NearTieChecks(count=2).unsure(list(value), value, None, 1)["checked"] is True


POINTS = {"point_selection": "oneshot", "axis_points": 2, "mixed_points": 1, "predictor": "local"}


def policy(name: str, **options) -> dict:
    return {"checks": name, "checks_options": {name: options} if options else {}}


SETTINGS = {"scorer": "taylor", "hetdpt": {**POINTS, **policy("near-ties", count=2, budget=96)}}


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


def test_a_policys_options_are_refused_where_another_policy_runs_or_it_has_no_such_option(tmp_path):
    def options(hetdpt):
        return tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, {"hetdpt": hetdpt}).options(HetDPTOptions)

    with pytest.raises(HetpruneError, match="hetdpt.checks_options gives options of near-ties, and hetdpt.checks is "
                                            "none: give only none's, or set hetdpt.checks near-ties"):
        options({"checks": "none", "checks_options": {"near-ties": {"count": 3}}})
    # a combination the old flags refused by hand has no spelling: spread has no "when", near-ties no "among"
    with pytest.raises(HetpruneError, match=r"hetdpt.checks_options.spread has no option\(s\) when; its options: "
                                            "budget, count, selection, selection_at_least, unit"):
        options(policy("spread", when="unsure"))
    with pytest.raises(HetpruneError, match=r"near-ties has no option\(s\) among"):
        options(policy("near-ties", among="spread"))
    with pytest.raises(HetpruneError, match="hetdpt.checks_options.points.among must be one of spread, best, "
                                            "near-ties, got 'all'"):
        options(policy("points", among="all"))
    with pytest.raises(HetpruneError, match="hetdpt.checks_options.all.unit must be images .* or finetunes"):
        options(policy("all", unit="epochs"))
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, {"hetdpt": {"checks": "sometimes"}})
    with pytest.raises(HetpruneError, match="sometimes"):   # a name no plugin registers: refused before stage 1
        HetDPT().check_settings(job)


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
    settings = {"scorer": "taylor", "hetdpt": {**POINTS, **policy("spread", count=2, budget=96)}}
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


@pytest.mark.parametrize("name", ["spread", "best", "near-ties"])
def test_the_map_study_checks_the_splits_a_run_checks(name, tmp_path, monkeypatch):
    """benchmarks/map_points.py measures each predictor's checks itself; it once checked the K best predicted
    whatever verify_among said, so a whole pass measured the default twice."""
    from benchmark_scripts import script
    from hetprune_hetdpt.halving import PipelineChecks

    map_points = script("map_points")
    settings = {"scorer": "taylor", "hetdpt": {**POINTS, **policy(name, count=2, budget=96)}}
    job = tiny_job(hetprune.Budget(sites=3), tmp_path, HetDPT, settings)
    ran = []
    real_run = PipelineChecks.run
    monkeypatch.setattr(PipelineChecks, "run", lambda self, c, b=None: ran.append(list(c)) or real_run(self, c, b))
    pairs = sorted(job.feasible_pairs())
    value = {p: 70.0 + 3 * p[0] for p in pairs}   # sure that attention-heavy splits win
    fits = {"local": {"predicted": {f"{a}+{m}": v for (a, m), v in value.items()}, "fit": {"loo_mae": 5.0}}}
    with job.serving():
        map_points.pipeline_checks(HetDPT().allocation(job), fits, None)   # the run's own stage-1 object
    expected = HetDPT.checks_policy(job).candidates(pairs, value, 5.0, 1)
    assert ran == [expected]
    assert expected == ([(3, 0), (1, 2)] if name == "spread" else [(3, 0), (2, 1)])
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
    assert any(f"the checks (spread) cover all {splits} feasible splits" in m for m in logs), logs


def test_checks_that_leave_a_split_unchecked_still_fit_the_predictor_on_points(tmp_path):
    settings = {"scorer": "taylor", "hetdpt": {**POINTS, **policy("spread", count=2)}}
    job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT, settings)   # 3 splits, 2 checks
    assert [s.stage for s in HetDPT().plan_allocation(job)] == ["stage 1: MAP points", "stage 1: pipeline checks"]
    alloc = HetDPT().run(job).report["allocation"]
    assert alloc["predictor"] == "local" and alloc["points"] and "checked_every_split" not in alloc


def test_a_small_target_without_checks_fits_a_plane_through_its_points_and_prunes(tmp_path):
    """Issue 71: with no checks (checks none, the paper's argmax) a budget of one site has 3 points at most, fewer
    than poly needs: a plane is fitted through them, said in one line, and the run prunes; --plan agrees."""
    settings = {"scorer": "taylor", "hetdpt": {"predictor": "poly", "checks": "none"}}
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


# -- issue 71, item 2: the checks a registered policy, the old verify_* names read for one release ---------------

# every combination the old names allowed (beside their defaults), and the policy it is now
OLD_SPELLINGS = [
    ({}, "spread", {}),
    ({"verify": 0}, "none", {}),
    ({"verify": 3}, "spread", {"count": 3}),
    ({"verify_among": "best"}, "best", {}),
    ({"verify_among": "best", "verify_when": "unsure", "verify": 4}, "near-ties", {"count": 4}),
    ({"verify_by": "points"}, "points", {}),
    ({"verify_by": "points", "verify_among": "best", "verify": 3}, "points", {"count": 3, "among": "best"}),
    ({"verify_by": "points", "verify_among": "best", "verify_when": "unsure"}, "points", {"among": "near-ties"}),
    ({"verify_images": 5000, "verify_selection": 0.15, "verify_selection_at_least": None}, "spread",
     {"budget": 5000, "selection": 0.15, "selection_at_least": None}),
    ({"verify_images": None, "verify_selection": 1, "verify_selection_at_least": None}, "spread",
     {"unit": "finetunes", "selection": 1, "selection_at_least": None}),
    ({"verify_budget": 3.0}, "spread", {"unit": "finetunes", "budget": 3.0}),
]


@pytest.mark.parametrize("old, name, options", OLD_SPELLINGS, ids=[str(o) for o, _, _ in OLD_SPELLINGS])
def test_each_old_spelling_is_read_as_its_policy_said_once_and_keyed_as_before(old, name, options):
    """The old names are read as the policy they spell, with one deprecation line giving the new spelling, and
    a compare row's key (which holds the whole settings) is the one the old names made: stored rows are found."""
    from hetprune.core import config
    from hetprune.core import loader
    from hetprune_hetdpt.verify_names import LEGACY

    hetdpt = hetprune.get_registry().build("strategy", "hetdpt")
    sets = [f"hetdpt.{k}={'null' if v is None else v}" for k, v in old.items()]
    with pytest.warns(FutureWarning) as said:
        s = loader.resolve(hetdpt, sets=sets or ["hetdpt.verify=6"]).as_settings()
    [line] = [str(w.message) for w in said]
    assert "deprecated (read for one release): write hetdpt.checks: " + name in line
    assert (s["hetdpt"]["checks"], s["hetdpt"]["checks_options"]) == (name, {name: options} if options else {})
    assert not set(LEGACY) & set(s["hetdpt"])
    # the key: as the old section (every old name, the given ones changed) hashed it
    keyed = config.keyed(s)["hetdpt"]
    assert {k: keyed[k] for k in LEGACY} == {**LEGACY, **old} and "checks" not in keyed
    # and the new spelling resolves to the same settings, silently
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = loader.resolve(hetdpt, overrides={"hetdpt": {"checks": name,
                                                           "checks_options": s["hetdpt"]["checks_options"]}}).as_settings()
    assert new == s


def test_the_old_names_are_read_over_earlier_layers_and_not_beside_the_new_ones(tmp_path):

    hetdpt = hetprune.get_registry().build("strategy", "hetdpt")
    path = tmp_path / "run.yaml"
    path.write_text("hetdpt:\n  checks: best\n  checks_options: {best: {count: 3}}\n")
    with pytest.warns(FutureWarning, match="write hetdpt.checks: near-ties"):
        s = loader.resolve(hetdpt, config_file=str(path), sets=["hetdpt.verify_when=unsure"]).as_settings()
    assert (s["hetdpt"]["checks"], s["hetdpt"]["checks_options"]) == ("near-ties", {"near-ties": {"count": 3}})
    with pytest.raises(HetpruneError, match="gives hetdpt.checks and the old hetdpt.verify: write the checks policy"):
        loader.resolve(hetdpt, sets=["hetdpt.checks=best", "hetdpt.verify=3"])
    with pytest.raises(HetpruneError, match="write hetdpt.checks near-ties"):
        loader.resolve(hetdpt, sets=["hetdpt.verify_when=unsure"])   # spread beside unsure: no such policy
    # a stored section in the old names (a compare row's settings from the last release) is read too
    with pytest.warns(FutureWarning):
        assert HetDPTOptions.from_dict({"verify": 0}).checks == "none"


def test_a_policy_the_old_names_cannot_spell_is_keyed_by_its_own():
    from hetprune.core import config

    hetdpt = hetprune.get_registry().build("strategy", "hetdpt")
    s = loader.resolve(hetdpt, sets=["hetdpt.checks=all"])
    keyed = config.keyed(s)["hetdpt"]
    assert keyed["checks"] == "all" and "verify" not in keyed
    spread4 = config.keyed(loader.resolve(hetdpt, sets=["hetdpt.checks_options.spread.count=4"]))["hetdpt"]
    assert spread4["verify"] == 4 and keyed != spread4


def test_the_built_in_policies_pass_the_kit_and_a_broken_one_fails_it():
    from hetprune.harness import testing
    from hetprune_hetdpt.checks import POLICIES

    for cls in POLICIES:
        testing.check("checks", cls)

    class Stray:
        name, measure = "stray", "pipeline"

        def most(self, pairs):
            return 2

        def known(self, pairs):
            return None

        def candidates(self, pairs, value, loo_mae, sign):
            return [(99, 0)]

    with pytest.raises(testing.ConformanceError, match=r"candidates\(\) returned \(99, 0\), which is not one of the "
                                                       "feasible splits"):
        testing.check("checks", Stray)


class AxisEnds:
    """An outside policy: the two ends of the budget line, known before any point."""

    name, measure = "axis-ends", "pipeline"
    budget, unit, selection, selection_at_least = "auto", "images", 1.0, None

    def most(self, pairs):
        return min(2, len(pairs))

    def known(self, pairs):
        line = sorted(pairs)
        return [line[0], line[-1]] if len(line) > 1 else None

    def candidates(self, pairs, value, loo_mae, sign):
        return self.known(pairs) or []


def test_an_outside_policy_registered_as_a_plugin_decides_stage_1(tmp_path):
    """A package adds a checks policy with one hook: the kit passes it, the run builds it by name, and where it
    knows its splits before any point no point is measured and --plan says what the run does."""
    from conftest import PluginOf
    from hetprune.harness import testing

    testing.check("checks", AxisEnds)
    name = hetprune.register_plugin(PluginOf("register_checks", AxisEnds), name="ends-policy")
    try:
        job = tiny_job(hetprune.Budget(sites=2), tmp_path, HetDPT,
                       {"scorer": "taylor", "hetdpt": {**POINTS, "checks": "axis-ends"}})
        steps = HetDPT().plan_allocation(job)
        assert [s.stage for s in steps] == ["stage 1: pipeline checks"] and steps[0].fine_tunes == 2
        alloc = HetDPT().run(job).report["allocation"]
        measured = {(m["n_attn"], m["n_act"]) for m in alloc["pipeline_checks"]["rounds"][0]["measured"]}
        assert measured == {(0, 2), (2, 0)} and alloc["points"] == [] and alloc["predictor"] is None
    finally:
        hetprune.unregister_plugin(name)


def test_all_checks_every_split_without_points_on_any_budget(tmp_path):
    job = tiny_job(hetprune.Budget(sites=3), tmp_path, HetDPT, {"scorer": "taylor", "hetdpt": {**POINTS,
                                                                                             **policy("all")}})
    pairs = job.feasible_pairs()
    assert len(pairs) == 4 > 2   # more splits than a count of 2 would check
    [step] = HetDPT().plan_allocation(job)
    assert step.what.endswith(f"every one of the {len(pairs)} feasible splits: no MAP point measured")
    alloc = HetDPT().run(job).report["allocation"]
    assert {(m["n_attn"], m["n_act"]) for m in alloc["pipeline_checks"]["rounds"][0]["measured"]} == set(pairs)


class Greedy(AxisEnds):
    """A broken outside policy: it says it checks 2 splits and hands back 3."""

    name = "greedy"

    def known(self, pairs):
        return None

    def candidates(self, pairs, value, loo_mae, sign):
        return sorted(pairs)[:3]


def test_a_policy_that_breaks_its_word_is_a_plugin_error_naming_it(tmp_path):
    """Every call into a policy goes through the contract's rules: more candidates than ``most`` (what --plan
    counted) stops the run with an error naming the plugin, the policy and the method."""
    from conftest import PluginOf
    from hetprune import PluginError

    name = hetprune.register_plugin(PluginOf("register_checks", Greedy), name="greedy-policy")
    try:
        job = tiny_job(hetprune.Budget(sites=3), tmp_path, HetDPT,
                       {"scorer": "taylor", "hetdpt": {**POINTS, "checks": "greedy"}})
        with pytest.raises(PluginError, match=r"greedy.*candidates\(\) returned 3 splits and most\(\) says 2"):
            HetDPT().allocate(job)
    finally:
        hetprune.unregister_plugin(name)
