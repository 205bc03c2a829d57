"""Baseline strategies and the compare harness (tiny models, one short epoch)."""

from __future__ import annotations

import csv
import json

import pytest

import hetprune
from hetprune import HetpruneError, Site
from hetprune.pruning.budget import Budget
from hetprune.cli import main
from hetprune.pruning.pipeline import DepthStrategy, PruneJob
from hetprune.core.plugins import get_registry

from hetprune_baselines.strategies import BlockDrop, Mix, closest_pair

FAST = ["--set", "finetune.epochs=1", "--set", "finetune.subset=48", "--set", "short_finetune.epochs=1",
        "--set", "short_finetune.subset=48", "--set", "scoring.subset=48", "--set", "scoring.batches=1",
        "--set", "scorer_options={gate-taylor: {epochs_per_removal: 1, warmup_epochs: 0}}",
        ]
HETDPT_FAST = ["--set", "hetdpt.axis_points=2", "--set", "hetdpt.mixed_points=2"]


def model_args(trained_tiny):
    _, spec, ckpt = trained_tiny
    return ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt)]


def job_for(model, data, tmp_path, budget, **sets):
    settings = hetprune.core.loader.resolve(Mix.defaults, sets=[f"{k}={v}" for k, v in sets.items()])
    return PruneJob(dense=model, spec=None, data=data, budget=budget, settings=settings, registry=get_registry(),
                    workdir=tmp_path, base_info={"hash": "t"}, progress=False, log=lambda s: None)


@pytest.mark.parametrize("name,budget,split", [
    ("attn-only", 3, (3, 0)), ("act-only", 3, (0, 3)), ("mix50", 4, (2, 2)), ("mix50", 3, (1, 2)),
    ("act-only", 4, (0, 4)),
])
def test_fixed_splits_honour_budget(tiny_model, digits_data, tmp_path, name, budget, split):
    strategy = get_registry().build("strategy", name)
    (a, m), info = strategy.allocate(job_for(tiny_model, digits_data, tmp_path, Budget(sites=budget)))
    assert (a, m) == split


def test_mix_ratio_setting_and_validation(tiny_model, digits_data, tmp_path):
    job = job_for(tiny_model, digits_data, tmp_path, Budget(sites=4), **{"mix.ratio": 0.25})
    assert Mix().allocate(job)[0] == (1, 3)
    job = job_for(tiny_model, digits_data, tmp_path, Budget(sites=4), **{"mix.ratio": 1.5})
    with pytest.raises(HetpruneError, match="mix.ratio"):
        Mix().allocate(job)


def test_attn_only_says_when_budget_needs_the_other_kind(tiny_model, digits_data, tmp_path):
    strategy = get_registry().build("strategy", "attn-only")
    (a, m), info = strategy.allocate(job_for(tiny_model, digits_data, tmp_path, Budget(sites=5)))
    assert (a, m) == (3, 2) and "cannot be met with one kind" in info["note"]


def test_closest_pair_rounds_odd_budget_towards_activations():
    assert closest_pair([(0, 5), (1, 4), (2, 3), (3, 2), (4, 1)], 0.5) == (2, 3)


def test_block_drop_removes_whole_blocks(tiny_model, digits_data, tmp_path):
    job = job_for(tiny_model, digits_data, tmp_path, Budget(sites=5), scorer="magnitude",
                  **{"finetune.epochs": 1, "finetune.subset": 16})
    job.strategy_name = "block-drop"
    result = BlockDrop().run(job)
    assert result.report["n_attn"] == result.report["n_act"] == 2
    assert len(result.recipe.dropped) == 2 and "odd budget 5" in result.report["allocation"]["note"]
    assert sum(type(b).__name__ == "DroppedBlock" for b in result.model.blocks) == 2


def test_block_drop_selects_with_the_same_machinery_as_every_strategy(tiny_model, digits_data, tmp_path):
    """A learning scorer's select() runs for block-drop too (same training as the others); blocks whose
    two sites it picked are dropped first."""
    calls = []

    class Picky:
        name = "picky"

        def select(self, model, counts, ctx):
            calls.append(dict(counts))
            return [Site(2, "attn"), Site(2, "act"), Site(0, "attn"), Site(3, "act")][:2 * counts["attn"]]

        def score(self, model, sites, ctx):
            return {s: float(s.block) for s in sites}  # would rank block 0 first

    from types import SimpleNamespace

    hetprune.register_plugin(SimpleNamespace(register_scorers=hetprune.hookimpl(lambda register: register(Picky))),
                             name="picky-plugin")
    try:
        job = job_for(tiny_model, digits_data, tmp_path, Budget(sites=2), scorer="picky",
                      **{"finetune.epochs": 0})
        job.strategy_name = "block-drop"
        result = BlockDrop().run(job)
    finally:
        hetprune.unregister_plugin("picky-plugin")
    assert calls == [{"attn": 1, "act": 1}]
    assert result.recipe.dropped == [2]


class CountingStrategy(DepthStrategy):
    """Test strategy: a fixed 1+1 split that counts how often it runs."""

    name = "counting"
    runs: list = []

    def allocate(self, job):
        CountingStrategy.runs.append((job.strategy_name, job.seed))
        return (1, 1), {}


class CountingPlugin:
    @hetprune.hookimpl
    def register_strategies(self, register):
        register(CountingStrategy)


@pytest.fixture
def counting_plugin():
    name = hetprune.register_plugin(CountingPlugin(), name="counting-test")
    CountingStrategy.runs.clear()
    yield
    hetprune.unregister_plugin(name)


def test_compare_writes_files_holds_settings_equal_and_resumes(trained_tiny, tmp_path, counting_plugin, capsys):
    out = tmp_path / "cmp"
    args = ["compare", *model_args(trained_tiny), "--speed-budget", "0",
            "--strategies", "counting,act-only,hetdpt", "--budget", "2",
            "--seeds", "0,1", "--batch-sizes", "1,8", "--out", str(out), "--scorer", "magnitude", *FAST, *HETDPT_FAST]
    assert main(args) == 0
    assert len(CountingStrategy.runs) == 2
    for name in ("results.md", "results.csv", "results.json", "pareto.png"):
        assert (out / name).stat().st_size > 0
    data = json.loads((out / "results.json").read_text())
    assert len(data["rows"]) == 6 and data["dense"]["top1"] > 0
    assert {r["seed"] for r in data["rows"]} == {0, 1}
    for r in data["rows"]:
        assert r["n_attn"] + r["n_act"] == 2
        assert r["speedup_large"] > 0 and r["throughput_b1"] > 0
    # every strategy of one seed ran with the very same settings and schedule
    reports = {}
    for r in data["rows"]:
        rep = json.loads((out / r["model_dir"] / "report.json").read_text())
        reports.setdefault(r["seed"], []).append(rep["settings"])
    for seed, settings in reports.items():
        assert all(s == settings[0] for s in settings) and settings[0]["seed"] == seed
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 6
    assert "counting" in (out / "results.md").read_text()
    agg = {a["strategy"]: a for a in data["aggregates"]}
    assert agg["act-only"]["seeds"] == 2 and agg["act-only"]["top1_std"] is not None

    # without --resume an existing result is refused
    capsys.readouterr()
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err
    # with --resume nothing is run again
    CountingStrategy.runs.clear()
    assert main(args + ["--resume"]) == 0
    assert CountingStrategy.runs == []
    assert "reused" in capsys.readouterr().out


def test_compare_interrupted_loses_only_row_in_progress(trained_tiny, tmp_path, counting_plugin, monkeypatch):
    out = tmp_path / "cmp"
    args = ["compare", *model_args(trained_tiny), "--speed-budget", "0",
            "--strategies", "counting,act-only", "--budget", "2",
            "--batch-sizes", "1,4", "--out", str(out), "--scorer", "magnitude", *FAST]
    real = hetprune.get_registry().component("strategy", "act-only").factory.run

    def boom(self, job):
        raise KeyboardInterrupt

    monkeypatch.setattr(hetprune.get_registry().component("strategy", "act-only").factory, "run", boom)
    assert main(args) == 130
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["strategy"] == "counting"
    monkeypatch.setattr(hetprune.get_registry().component("strategy", "act-only").factory, "run", real)
    CountingStrategy.runs.clear()
    assert main(args + ["--resume"]) == 0
    assert CountingStrategy.runs == []
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2


def test_compare_bad_input(trained_tiny, tmp_path, capsys):
    base = ["compare", *model_args(trained_tiny), "--speed-budget", "0", "--out", str(tmp_path / "o")]
    assert main(base + ["--strategies", "hetdpt,nope", "--budget", "2"]) == 2
    assert "no strategy named 'nope'" in capsys.readouterr().err
    assert main(base + ["--budgets", "2,x"]) == 2
    assert "--budgets" in capsys.readouterr().err
    assert main(base + ["--strategies", "mix50,mix50", "--budget", "2"]) == 2
    assert "twice" in capsys.readouterr().err


def test_parallel_jobs_give_the_same_rows_as_sequential(trained_tiny, tmp_path):
    common = ["compare", *model_args(trained_tiny), "--speed-budget", "0",
              "--strategies", "act-only,mix50", "--budget", "2",
              "--batch-sizes", "1,4", "--scorer", "magnitude", *FAST]
    assert main(common + ["--out", str(tmp_path / "seq")]) == 0
    assert main(common + ["--out", str(tmp_path / "par"), "--jobs", "2"]) == 0

    def rows(folder):
        data = json.loads((folder / "results.json").read_text())
        return {r["id"]: (r["sites"], r["top1"], r["macs"]) for r in data["rows"]}

    assert rows(tmp_path / "seq") == rows(tmp_path / "par")


# -- issue 34: rows that keep to their own models, speed columns named by what was timed, any adapter --------

def _quiet_compare(model, task, out, **kw):
    kw.setdefault("batch_sizes", (2,))
    return hetprune.compare(model, task, speed_budget_s=0, out=out, progress=False, log=lambda m: None, **kw)


def test_a_resumed_row_keeps_its_own_model_when_another_run_changed_the_settings(trained_tiny, digits_data, tmp_path):
    from hetprune.harness.testing import TINY_SETTINGS

    model = trained_tiny[0]
    runs = {}
    for scorer, resume in (("magnitude", False), ("random", True), ("magnitude", True)):
        result = _quiet_compare(model, digits_data, tmp_path / "c", strategies=["attn-only"], budgets=[1],
                                settings={**TINY_SETTINGS, "scorer": scorer}, resume=resume)
        runs.setdefault(scorer, []).append(result.rows[0])
    first, again = runs["magnitude"]
    assert again["sites"] == first["sites"] and again["model_dir"] == first["model_dir"]
    assert runs["random"][0]["model_dir"] != first["model_dir"]   # another run's model went beside it
    for row in (again, runs["random"][0]):
        recipe = hetprune.model.recipe.load_recipe(tmp_path / "c" / row["model_dir"])
        assert [f"attn{b}" for b in recipe.attn_removed] == row["sites"]


def test_speed_columns_are_named_by_the_batch_sizes_that_were_timed(trained_tiny, digits_data, tmp_path):
    from hetprune.harness.testing import TINY_SETTINGS

    result = _quiet_compare(trained_tiny[0], digits_data, tmp_path / "c", strategies=["act-only"], budgets=[2],
                            settings=TINY_SETTINGS, batch_sizes=(3,))
    row = result.rows[0]
    assert row["throughput_b3"] > 0 and row["speedup_b3"] == row["speedup_large"] and row["large_batch"] == 3
    assert not any(k.endswith("_b1") for k in row)
    table = (tmp_path / "c" / "results.md").read_text()
    assert "img/s b3" in table and "b1" not in table
    header = (tmp_path / "c" / "results.csv").read_text().splitlines()[0].split(",")
    assert {"throughput_b3", "speedup_b3", "speedup_b3_spread"} <= set(header) and "speedup_b1" not in header
    assert "Command: `hetprune.compare(model, task, strategies=['act-only'], budgets=[2], seeds=[0]," in table


def test_seeds_that_made_the_very_same_model_say_so(trained_tiny, digits_data, tmp_path):
    from hetprune.harness.testing import TINY_SETTINGS

    no_training = {**TINY_SETTINGS, "finetune": {**TINY_SETTINGS["finetune"], "epochs": 0}, "scorer": "magnitude"}
    result = _quiet_compare(trained_tiny[0], digits_data, tmp_path / "c", strategies=["act-only"], budgets=[2],
                            seeds=[0, 1], settings=no_training)
    assert result.aggregates[0]["identical_seeds"] and result.rows[0]["weights"] == result.rows[1]["weights"]
    assert "every seed made the very same model" in (tmp_path / "c" / "results.md").read_text()
    trained = _quiet_compare(trained_tiny[0], digits_data, tmp_path / "d", strategies=["act-only"], budgets=[2],
                             seeds=[0, 1], settings={**TINY_SETTINGS, "scorer": "magnitude"})
    assert not trained.aggregates[0]["identical_seeds"]


def test_compare_and_ablate_run_end_to_end_on_a_model_only_a_generic_adapter_serves(digits_data, tmp_path):
    from hetprune.model.adapters import generic
    from hetprune.harness.testing import TINY_SETTINGS
    from test_api import LAYOUT, MyTransformer, user_task

    adapter = generic(blocks="encoder.layers", layout=LAYOUT)
    settings = {**TINY_SETTINGS, "scorer": "magnitude", "hetdpt": {"axis_points": 2, "mixed_points": 1}}
    result = _quiet_compare(MyTransformer(), user_task(digits_data), tmp_path / "c", strategies=["act-only", "hetdpt"],
                            budgets=[2], settings=settings, adapter=adapter)
    assert result.rows[0]["speedup_large"] > 0 and (tmp_path / "c" / "results.md").is_file()
    assert result.dense["macs"] > result.rows[0]["macs"]
    ablation = hetprune.ablate(MyTransformer(), user_task(digits_data), budget=2, settings=settings,
                               adapter=adapter, out=tmp_path / "a", progress=False, log=lambda m: None)
    assert len(ablation["splits"]) == 3 and (tmp_path / "a" / "ablation.md").is_file()
    assert "hetprune.ablate(model, task, strategy='hetdpt'" in (tmp_path / "a" / "ablation.md").read_text()
