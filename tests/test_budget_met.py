"""Issue 26, item 6: a cost target is checked on the pruned model itself, after selection.

A cost target becomes a split with the mean per-site saving, which assumes
identical blocks. Here the blocks differ (a cost model in which one block's
attention costs nine times the others'), the scorer picks the cheap ones, and
the planned split misses the target. The run then removes more sites before
it fine-tunes, or, where no site left saves cost, says so in the log and the
report.
"""

from __future__ import annotations

import pytest

import hetprune
from conftest import PluginOf
from hetprune import Site
from hetprune.core import plugins
from hetprune.pruning.budget import Budget, feasible_pairs
from hetprune.model.surgery import site_removed
from hetprune.harness.testing import tiny_job

BASE = 10.0


def blocky_cost(attn: list[float]):
    """A cost model: ``BASE`` plus the cost of every attention site still present (activations cost nothing)."""

    def cost(model) -> float:
        return BASE + sum(c for b, c in enumerate(attn) if not site_removed(model, Site(b, "attn")))

    class Blocky:
        name = "blocky"
        unit = "units"

        def cost(self, model, example):
            return cost(model)

    return Blocky, cost


class ByBlock:
    """Scores a site by its block index: the lowest blocks go first, whatever they cost."""

    name = "by-block"

    def score(self, model, sites, ctx):
        return {s: float(s.block) for s in sites}


@pytest.fixture
def blocky(monkeypatch):
    """Register the cost model for ``attn`` (one cost per block) and the scorer; yields the cost function."""
    monkeypatch.setattr(plugins, "_extra_objects", [])

    def register(attn):
        model_cls, cost = blocky_cost(attn)
        hetprune.register_plugin(PluginOf("register_cost_models", model_cls), name="blocky-costs")
        hetprune.register_plugin(PluginOf("register_scorers", ByBlock), name="by-block-scorer")
        return cost

    yield register
    plugins.reset()


def run_attn_only(tmp_path, target_speedup: float):
    from hetprune_baselines.strategies import AttnOnly

    logs: list[str] = []
    job = tiny_job(Budget(target_speedup=target_speedup, cost_model="blocky"), tmp_path / "work",
                   settings={"scorer": "by-block", "finetune": {"epochs": 1, "subset": 16}})
    job.log = logs.append
    planned = feasible_pairs(job.dense, job.budget, job.example, merge=True, cost=job.cost)
    return AttnOnly().run(job), job, planned, logs


def test_a_split_planned_with_mean_savings_that_misses_the_target_is_corrected(tmp_path, blocky):
    cost = blocky([1.0, 1.0, 9.0, 1.0])   # block 2's attention is the expensive one
    dense = BASE + 12
    limit = BASE + 6                       # the mean saving (3 a site) says: two attention sites
    result, job, planned, logs = run_attn_only(tmp_path, dense / limit)
    assert planned == [(2, 0)]
    assert cost(result.model) <= limit, "the pruned model misses its cost target"
    r = result.report
    assert r["budget_met"] is True
    assert r["budget_check"]["added_sites"] == ["attn2"] and r["sites"] == ["attn0", "attn1", "attn2"]
    assert r["budget_check"]["reached_as_planned"] == pytest.approx(dense - 2)   # what the plan alone left
    assert r["budget_check"]["reached"] == pytest.approx(cost(result.model))
    assert any("removed attn2 as well" in m for m in logs)


def test_a_target_no_site_left_can_meet_is_reported_as_missed(tmp_path, blocky):
    cost = blocky([1.0, 1.0, 1.0, 9.0])   # the expensive attention is the one a class-token ViT must keep
    dense = BASE + 12
    limit = BASE + 3                       # the mean saving says: three attention sites
    result, job, planned, logs = run_attn_only(tmp_path, dense / limit)
    assert planned == [(3, 0)]
    r = result.report
    assert r["budget_met"] is False
    assert r["budget_check"]["reached"] == pytest.approx(cost(result.model)) and cost(result.model) > limit
    assert r["budget_check"]["limit"] == pytest.approx(limit)
    said = [m for m in logs if "NOT met" in m]
    assert len(said) == 1 and job.budget.describe() in said[0]

