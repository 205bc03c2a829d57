"""The default compare at an equal MAC target: every row reports the MACs it reached, and a strategy that
cannot reach the target says so in its row (tiny models, one short epoch)."""

from __future__ import annotations

import json

import pytest

from hetprune import BudgetUnreachable
from hetprune.pruning.budget import Budget
from hetprune.cli import main
from hetprune.core.plugins import get_registry

from test_compare import FAST, job_for, model_args


def test_attn_only_refuses_a_mac_target_attention_alone_cannot_reach(tiny_model, digits_data, tmp_path):
    strategy = get_registry().build("strategy", "attn-only")
    # removing every attention site but one still leaves well over 40 % of a tiny ViT's MACs (its MLPs)
    with pytest.raises(BudgetUnreachable, match=r"attn-only cannot meet MACs <= 0.4 of dense: removing attention "
                                                r"sites alone does not reach it .*nearest split that does is \d+\+\d+"):
        strategy.allocate(job_for(tiny_model, digits_data, tmp_path, Budget(target_macs=0.4)))
    # a mild target it can reach stays attention-only
    (a, m), _ = strategy.allocate(job_for(tiny_model, digits_data, tmp_path, Budget(target_macs=0.9)))
    assert a > 0 and m == 0


def test_prune_reports_an_unreachable_target_as_one_error_line(trained_tiny, tmp_path, capsys):
    rc = main(["prune", *model_args(trained_tiny), "--strategy", "attn-only", "--target-macs", "0.4",
               "--out", str(tmp_path / "p"), *FAST])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "attn-only cannot meet" in err
    assert not (tmp_path / "p").exists()


def test_compare_shows_an_unreachable_strategy_in_its_row_and_runs_the_rest(trained_tiny, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", *model_args(trained_tiny), "--speed-budget", "0", "--strategies",
                 "attn-only,act-only", "--target-macs", "0.5", "--batch-sizes", "1,4", "--out", str(out),
                 "--scorer", "magnitude", *FAST]) == 0
    data = json.loads((out / "results.json").read_text())
    rows = {r["strategy"]: r for r in data["rows"]}
    assert "attn-only cannot meet" in rows["attn-only"]["unreachable"] and "metric" not in rows["attn-only"]
    act = rows["act-only"]
    assert act["macs"] <= 0.5 * data["dense"]["macs"] and act["budget_met"] is True
    assert act["speedup_large"] > 0          # timed; the unreachable row has no model to time
    table = (out / "results.md").read_text()
    line = next(x for x in table.splitlines() if x.startswith("| attn-only"))
    assert "cannot reach the budget" in line and "nearest split that does" in line
    line = next(x for x in table.splitlines() if x.startswith("| act-only"))
    assert f"({act['macs'] / data['dense']['macs']:.0%})" in line        # the MACs reached, as a share of dense
    assert "unreachable" in (out / "results.csv").read_text().splitlines()[0]
    # resumed: the unreachable row is reused like any finished row, not run again
    assert main(["compare", *model_args(trained_tiny), "--speed-budget", "0", "--strategies",
                 "attn-only,act-only", "--target-macs", "0.5", "--batch-sizes", "1,4", "--out", str(out),
                 "--scorer", "magnitude", *FAST, "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert [r.get("wall_s") for r in again["rows"]] == [r.get("wall_s") for r in data["rows"]]


def test_the_default_compare_runs_on_the_digit_grid_at_one_mac_target():
    from hetprune.cli import build_parser
    from hetprune.cli.commands.compare_cmd import DEFAULT_TARGET_MACS, DEFAULT_TARGETS, compare_budgets, compare_data

    def parsed(*argv):
        return build_parser().parse_args(["compare", *argv])

    assert compare_budgets(parsed()) == [Budget(target_macs=DEFAULT_TARGET_MACS)]
    assert compare_budgets(parsed("--target-macs", "0.65,0.5")) == [Budget(target_macs=0.65),
                                                                     Budget(target_macs=0.5)]
    assert compare_budgets(parsed("--budgets", "8,12")) == [Budget(sites=8), Budget(sites=12)]
    assert compare_budgets(parsed("--budget", "12")) == [Budget(sites=12)]
    assert compare_data(parsed()) == "digit-grid"
    # each embedded benchmark has its own measured target
    assert compare_budgets(parsed("--data", "digit-pairs")) == [Budget(target_macs=DEFAULT_TARGETS["digit-pairs"])]
    assert compare_data(parsed("--data", "digits")) == "digits"
    assert compare_data(parsed("--model", "vit_tiny_patch16_224")) is None    # a real model names its own data
