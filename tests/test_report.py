"""The run report as a dataclass (issue 41, item 3): its JSON form, and the old ``top1*`` names read in one place."""

from __future__ import annotations

import pytest

from hetprune.pruning.pipeline import REPORT_KEYS, Report, legacy_metric

CORE = dict(strategy="hetdpt", n_attn=1, n_act=2, sites=["attn0", "act1", "act2"], params=10, macs=20.0,
            dense_params=12, dense_macs=30.0, macs_convention="fvcore", seconds=1.5)


def test_a_report_round_trips_through_its_json_form_with_its_own_entries():
    report = Report(**CORE, metric_name="mIoU", metric=40.0, metric_before_finetune=30.0, metric_dense=45.0,
                    higher_is_better=True, budget={"sites": 3}, seed=0, settings={"seed": 0},
                    extra={"allocation": {"pick": [1, 2]}})
    d = report.to_dict()
    assert set(REPORT_KEYS) <= set(d) and d["allocation"] == {"pick": [1, 2]}
    assert not [k for k in d if k.startswith("top1")], "another metric is not top-1: no key may say it is"
    assert Report.from_dict(d) == report


def test_a_top1_report_writes_the_old_names_beside_the_metric():
    d = Report(**CORE, metric_name="top1", metric=80.0, metric_before_finetune=70.0, metric_dense=90.0).to_dict()
    assert (d["top1"], d["top1_before_finetune"], d["top1_dense"]) == (80.0, 70.0, 90.0)


def test_a_report_from_before_tasks_had_metrics_is_read_by_its_top1_names():
    old = {**CORE, "top1": 81.0, "top1_before_finetune": 60.0, "top1_dense": 88.0}
    report = Report.from_dict(old)
    assert (report.metric_name, report.metric, report.metric_before_finetune, report.metric_dense) == \
        ("top1", 81.0, 60.0, 88.0)
    assert not [k for k in report.extra if k.startswith("top1")]
    assert legacy_metric({"metric": 1.0, "top1": 2.0}) == 1.0 and legacy_metric({}) is None


@pytest.mark.parametrize("name, row", [("top1", "| top-1 | 90.00 % | 80.00 %"), ("mIoU", "| mIoU | 45 | 40 ")])
def test_the_model_card_names_the_tasks_metric(name, row):
    from hetprune.harness import testing
    from hetprune.measure.export.hub import model_card
    from hetprune.model.recipe import Recipe

    recipe = Recipe(base=testing.TINY_SPEC, arch={})
    report = Report(**CORE, metric_name=name, metric=40.0 if name != "top1" else 80.0,
                    metric_before_finetune=30.0, metric_dense=45.0 if name != "top1" else 90.0).to_dict()
    costs = {"dense_params": 12, "params": 10, "dense_macs": 30.0, "macs": 20.0, "macs_convention": "fvcore"}
    card = model_card(recipe, report, costs, None, {"export": "hetprune export"}, "tiny")
    assert row in card
