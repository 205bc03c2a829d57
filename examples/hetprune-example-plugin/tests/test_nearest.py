"""Tests of the ``nearest`` predictor: the contract (hetprune's conformance kit), then its own behaviour.

Run from this folder with ``python -m pytest tests`` (hetprune installed, and
this package installed or on ``PYTHONPATH``).
"""

import pytest

from hetprune import HetpruneError
from hetprune.harness.testing import check_predictor
from hetprune_example.predictor import NearestPredictor


@pytest.mark.parametrize("options", [{}, {"k": 1}, {"k": 5, "power": 1.0}])
def test_nearest_keeps_the_predictor_contract(options):
    check_predictor(NearestPredictor, **options)


def test_nearest_is_exact_at_measured_points_and_interpolates_between():
    points = [(0, 0, 98.0), (4, 0, 90.0), (0, 4, 96.0), (2, 2, 94.0), (2, 2, 92.0)]
    p = NearestPredictor(k=2).fit(points)
    assert p.predict(0, 0) == 98.0 and p.predict(2, 2) == 93.0  # exact, repeats averaged
    assert 90.0 < p.predict(3, 1) < 94.0  # between its two nearest measurements
    assert p.predict(4, 0) == pytest.approx(90.0)
    report = p.fit_report()
    assert report["points"] == 4 and report["mae"] == 0.0 and report["loo_mae"] > 0


def test_nearest_refuses_what_it_cannot_do():
    with pytest.raises(HetpruneError, match="at least 1"):
        NearestPredictor().fit([])
    with pytest.raises(HetpruneError, match="fitted"):
        NearestPredictor().predict(1, 1)
    with pytest.raises(HetpruneError, match="k must be"):
        NearestPredictor(k=0)
