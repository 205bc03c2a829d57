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


def test_the_shares_are_the_committed_plan_costs_deit_b_rows():
    shares = map_points.deit_b_shares()
    assert shares["oneshot"] == pytest.approx(0.02, abs=0.001)
    assert shares["progressive-pipeline3"] > map_points.COST_LINE > shares["oneshot-pipeline3-img"]
    assert set(shares) == set(map_points.PLAN_COSTS_ROWS)   # every named row is in the committed file
