"""benchmarks/check_bound.py: the most checks of a run's candidates can give, each candidate measured by its
seed's own truth row. A stub study whose predictor ranks the line in reverse: more candidates reach the best
split only when the run's own rule (best K, or spread) puts it among them."""

from __future__ import annotations

import pytest

from benchmark_scripts import script

check_bound = script("check_bound")

TRUE = {"0+2": 80.0, "1+1": 90.0, "2+0": 70.0}
OWN = {0: {"0+2": 71.0, "1+1": 89.0, "2+0": 72.0},   # seed 0 alone ranks 2+0 above 0+2
       1: {"0+2": 79.0, "1+1": 91.0, "2+0": 70.0}}
PREDICTED = {"0+2": 60.0, "1+1": 50.0, "2+0": 70.0}   # the truth's worst predicted best, its best predicted worst


def study(floor: float) -> dict:
    return {"truth": {"digit-pairs|b2": {"splits": {k: {"true": v, "per_seed": {str(s): OWN[s][k] for s in OWN}}
                                                    for k, v in TRUE.items()}}},
            "oracle": [{"bench": "digit-pairs", "target": "b2", "mean_regret": floor}],
            "units": [{"bench": "digit-pairs", "seed": s, "scheme": scheme,
                       "per_target": {"b2": {"fits": {"local": {"predicted": PREDICTED}}}}}
                      for s in OWN for scheme in ("oneshot", "oneshot-pipeline3-img")]}


def excess(summ, rule: str, k: int) -> float:
    [s] = [s for s in summ if s["rule"] == rule and s["k"] == k]
    return s["excess"]["digit-pairs b2"]


def test_the_bound_picks_each_seeds_best_among_the_runs_own_candidates():
    rows, floors = check_bound.bounds({"a": study(0.5)})
    assert floors == {"digit-pairs b2": 0.5}
    assert len([r for r in rows if r["rule"] == "best" and r["k"] == 1]) == 2   # one per seed, one-shot units only
    summ = check_bound.summary(rows, floors)
    assert excess(summ, "best", 1) == pytest.approx(20 - 0.5)    # the predictor alone: 2+0
    # 2+0 and 0+2, each seed's better of them by its own row: 2+0 (regret 20) on seed 0, 0+2 (10) on seed 1
    assert excess(summ, "best", 2) == pytest.approx(15 - 0.5)
    assert excess(summ, "spread", 2) == pytest.approx(15 - 0.5)  # runs [0+2] and [1+1, 2+0]: 0+2 and 2+0
    assert excess(summ, "best", 3) == pytest.approx(-0.5)        # every split: the truth's best on both seeds
    [worst] = [s for s in summ if s["rule"] == "best" and s["k"] == 2]
    assert worst["within_goal"] == 0 and worst["worst"] == "digit-pairs b2"


def test_a_target_is_read_from_the_first_study_that_has_it():
    later = study(0.0)
    later["truth"]["digit-pairs|b2"]["splits"]["2+0"]["true"] = 95.0   # would change every pick's regret
    rows, floors = check_bound.bounds({"a": study(0.5), "b": later})
    assert floors == {"digit-pairs b2": 0.5} and len(rows) == 2 * 2 * len(check_bound.KS)
