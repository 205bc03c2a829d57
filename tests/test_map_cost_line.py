"""Issue 58, item 1: the MAP study's rule takes the cost where users pay it: a scheme whose points and checks
spend more than 10 % of a DeiT-B run (as ``--plan`` counts it, benchmarks/plan_costs.py) cannot be the
default, whatever it costs at toy scale."""

from __future__ import annotations

import pytest

from benchmark_scripts import script

map_points = script("map_points")


def rows(scheme: str, regret: float, images: float) -> list[dict]:
    return [{"bench": "digit-pairs", "target": "b8", "scheme": scheme, "predictor": "local",
             "mean_regret": regret, "images": images}]


def test_a_scheme_over_the_deit_b_cost_line_is_not_affordable_whatever_its_toy_cost():
    found = rows("oneshot", 5.0, 100) + rows("progressive-pipeline3", 1.0, 150) + rows("oneshot-pipeline3-img", 2.0, 140)
    shares = {"oneshot": 0.02, "progressive-pipeline3": 0.67, "oneshot-pipeline3-img": 0.094}
    choice = map_points.choose(found, {}, shares)
    by = {c["scheme"]: c for c in choice["ranking"]}
    assert by["progressive-pipeline3"]["cost_ratio"] == 1.5 and not by["progressive-pipeline3"]["affordable"]
    assert choice["chosen"]["scheme"] == "oneshot-pipeline3-img" and by["oneshot-pipeline3-img"]["deit_b_share"] == 0.094
    # without the DeiT-B count, the toy cap alone decides (issue 43's rule)
    assert map_points.choose(found, {})["chosen"]["scheme"] == "progressive-pipeline3"


def test_under_the_deit_b_line_the_toy_cost_is_a_column_not_the_rule():
    # issue 58: a scheme at 3.2x the one-shot points' images at toy scale but 9.8 % of a DeiT-B run can be the
    # default; one the DeiT-B count leaves out cannot, however cheap at toy scale
    found = rows("oneshot", 5.0, 100) + rows("oneshot-spread6-floor300", 1.0, 320) + rows("gradual", 0.5, 110)
    choice = map_points.choose(found, {}, {"oneshot": 0.02, "oneshot-spread6-floor300": 0.098})
    by = {c["scheme"]: c for c in choice["ranking"]}
    assert by["oneshot-spread6-floor300"]["cost_ratio"] == pytest.approx(3.2) and by["oneshot-spread6-floor300"]["affordable"]
    assert not by["gradual"]["affordable"] and by["gradual"]["deit_b_share"] is None
    assert choice["chosen"]["scheme"] == "oneshot-spread6-floor300"
    page = map_points.choice_lines({"choice": choice, "rows": found}, [("digit-pairs", "b8")])
    assert any("at most 10% of a DeiT-B run" in line and "not the rule" in line for line in page)
    assert any(line.startswith("| gradual | local | 0.50 |") and "| - | no |" in line for line in page)


def test_the_shares_are_the_committed_plan_costs_deit_b_rows():
    shares = map_points.deit_b_shares()
    assert shares["oneshot"] == pytest.approx(0.02, abs=0.001)
    assert shares["progressive-pipeline3"] > map_points.COST_LINE > shares["oneshot-pipeline3-img"]
    assert set(shares) == set(map_points.PLAN_COSTS_ROWS)   # every named row is in the committed file


def _pass(tmp_path, name: str, target: str, regrets: dict[str, float], floor: float, seeds=(0, 1)) -> None:
    import json

    part = {"rows": [{"bench": "digit-grid", "target": target, "scheme": scheme, "predictor": "local",
                      "mean_regret": regret, "images": 100} for scheme, regret in regrets.items()],
            "oracle": [{"bench": "digit-grid", "target": target, "mean_regret": floor,
                        "seeds": [{"seed": s} for s in seeds]}],
            "truth": {f"digit-grid|{target}": {"note": "every seed fine-tuned here", "splits": {}}}}
    (tmp_path / f"{name}.json").write_text(json.dumps(part))


def test_the_rule_over_several_passes_takes_each_targets_floor_from_its_own_pass(tmp_path):
    # pass a: scheme x is worse than y by 1 point, but its target's floor is 3 points; pass b: y is 2 points worse
    # than x over a floor of 0: over both, x's worst excess (a: 4 - 3 = 1; b: 1) beats y's (b: 3)
    _pass(tmp_path, "a", "b12", {"oneshot": 4.0, "oneshot-pipeline3-img": 3.0}, floor=3.0)
    _pass(tmp_path, "b", "macs0.7", {"oneshot": 1.0, "oneshot-pipeline3-img": 3.0}, floor=0.0)
    result = map_points.combine(["a", "b"], tmp_path)
    by = {c["scheme"]: c for c in result["choice"]["ranking"]}
    assert by["oneshot"]["worst_excess"] == 1.0 and by["oneshot-pipeline3-img"]["worst_excess"] == 3.0
    assert result["choice"]["chosen"]["scheme"] == "oneshot" and by["oneshot"]["targets"] == 2
    page = map_points.combined_markdown({**result, "command": "x"})
    assert "digit-grid budget 12 3.00; digit-grid MACs 0.7 0.00" in page and "[a.md](a.md)" in page


def test_passes_that_share_a_target_or_differ_in_seeds_are_not_combined(tmp_path):
    _pass(tmp_path, "a", "b12", {"oneshot": 1.0}, floor=0.0)
    _pass(tmp_path, "b", "b12", {"oneshot": 2.0}, floor=0.0)
    _pass(tmp_path, "c", "macs0.7", {"oneshot": 2.0}, floor=0.0, seeds=(0, 1, 2))
    with pytest.raises(SystemExit, match="digit-grid b12 is in both a.json and b.json"):
        map_points.combine(["a", "b"], tmp_path)
    with pytest.raises(SystemExit, match="different seeds"):
        map_points.combine(["a", "c"], tmp_path)
