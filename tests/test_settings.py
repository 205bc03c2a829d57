"""Settings are typed by their defaults; NaN and infinities are refused wherever a number is read;
``--help`` is fast because it never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hetprune import HetpruneError
from hetprune.core import config
from hetprune.core import loader
from hetprune.pruning.budget import Budget, parse_macs
from hetprune.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_numbers_given_as_text_are_converted_to_the_defaults_type(tmp_path):
    # YAML reads 1e-5 (no dot) as text; the default 0.0005 says it is a number
    s = loader.resolve({}, sets=["finetune.lr=1e-5", "finetune.epochs='4'", "finetune.weight_decay=0",
                                 "scoring.batches=2.0", "short_finetune.subset=null", "seed=+3"])
    assert s["finetune"]["lr"] == 1e-5 and isinstance(s["finetune"]["lr"], float)
    assert s["finetune"]["epochs"] == 4 and isinstance(s["finetune"]["epochs"], int)
    assert s["finetune"]["weight_decay"] == 0.0 and isinstance(s["finetune"]["weight_decay"], float)
    assert s["scoring"]["batches"] == 2 and isinstance(s["scoring"]["batches"], int)
    assert s["short_finetune"]["subset"] is None and s["seed"] == 3
    cfg = tmp_path / "c.yaml"
    cfg.write_text("finetune: {lr: 3e-4, kd_temperature: 1}\n")
    s = loader.resolve({}, str(cfg))
    assert s["finetune"]["lr"] == 3e-4 and s["finetune"]["kd_temperature"] == 1.0


@pytest.mark.parametrize("item,message", [
    ("scoring.batches=two", "--set options: scoring.batches = 'two' is not a whole number"),
    ("finetune.lr=fast", "--set options: finetune.lr = 'fast' is not a number"),
    ("finetune.epochs=1.5", "finetune.epochs = 1.5 is not a whole number"),
    ("finetune.subset=all", "finetune.subset = 'all' is not a whole number or null"),
    ("finetune.lr=.nan", "finetune.lr = nan is not a finite number"),
    ("finetune.lr=nan", "finetune.lr = 'nan' is not a number"),
    ("finetune.kd_alpha=.inf", "finetune.kd_alpha = inf is not a finite number"),
    ("hetdpt.dense_point=2", "hetdpt.dense_point = 2 is not true or false"),
    ("scorer=3", "scorer = 3 is not text"),
    ("mergers=linear-merge", "mergers = 'linear-merge' is not a list"),
    ("scorer_options={taylor: {x: .nan}}", "scorer_options.taylor.x = nan is not a finite number"),
])
def test_wrong_types_name_key_value_and_expected_type(item, message):
    from hetprune_hetdpt.strategy import HetDPT

    with pytest.raises(HetpruneError) as exc:
        loader.resolve(HetDPT.defaults, sets=[item])
    assert message in str(exc.value)


def test_declared_types_cover_null_defaults():
    defaults = {"extra": {"depth_sites": None, "note": None}}
    s = loader.resolve(defaults, sets=["extra.depth_sites='3'", "extra.note=anything"],
                       types={"extra.depth_sites": (int, None)})
    assert s["extra"] == {"depth_sites": 3, "note": "anything"}
    with pytest.raises(HetpruneError, match="extra.depth_sites = 'three' is not a whole number or null"):
        loader.resolve(defaults, sets=["extra.depth_sites=three"], types={"extra.depth_sites": (int, None)})
    with pytest.raises(HetpruneError, match="extra.note = inf is not a finite number"):
        loader.resolve(defaults, sets=["extra.note=.inf"])


def test_a_type_is_the_defaults_even_after_a_file_set_it_to_null(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("finetune: {subset: null}\n")
    with pytest.raises(HetpruneError, match="finetune.subset = 'x' is not a whole number or null"):
        loader.resolve({}, str(cfg), sets=["finetune.subset=x"])


def test_train_config_refuses_non_finite_and_mistyped_numbers():
    for bad in ({"lr": float("nan")}, {"kd_temperature": float("inf")}, {"lr": "1e-5"}, {"epochs": 1.5},
                {"kd_temperature": 0}):
        with pytest.raises(HetpruneError):
            config.TrainConfig(**bad)


@pytest.mark.parametrize("kwargs", [{"target_macs": float("nan")}, {"target_speedup": float("nan")},
                                    {"target_macs": float("inf")}, {"target_speedup": float("inf")},
                                    {"sites": 2.5}])
def test_budget_refuses_non_finite_and_mistyped_targets(kwargs):
    with pytest.raises(HetpruneError):
        Budget(**kwargs)


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "nanG", "infM", "1e400"])
def test_parse_macs_refuses_non_finite(text):
    with pytest.raises(HetpruneError, match="cannot read MACs"):
        parse_macs(text)


@pytest.mark.parametrize("argv,message", [
    (["prune", "--target-macs", "nan"], "cannot read MACs 'nan'"),
    (["prune", "--target-speedup", "nan"], "--target-speedup must be a finite number, got nan"),
    (["compare", "--target-speedup", "inf"], "--target-speedup must be a finite number, got inf"),
    (["prune", "--budget", "4", "--set", "finetune.lr=fast"], "finetune.lr = 'fast' is not a number"),
    (["prune", "--budget", "4", "--set", "scoring.batches=two"], "scoring.batches = 'two' is not a whole number"),
    (["prune", "--budget", "4", "--set", "finetune.lr"], "write KEY=VALUE"),
    (["prune", "--budget", "4", "--set", "finetune.lr=[1"], "the value is not valid YAML"),
    (["ablate", "--budget", "4", "--tolerance", "nan"], "--tolerance must be a finite number"),
])
def test_cli_number_mistakes_are_one_error_line(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert message in one_error_line(capsys)


def test_bench_min_time_nan_is_a_clear_error(capsys):
    assert main(["bench", "vit_tiny_patch16_224", "--device", "cpu", "--min-time", "nan",
                 "--model-kwargs", json.dumps({"img_size": 16, "patch_size": 4, "depth": 1})]) == 2
    assert "min_time_s" in one_error_line(capsys)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HETPRUNE_PLUGINS": ""})


def test_help_of_every_command_does_not_import_torch():
    code = """
import sys
from hetprune.cli import COMMANDS, main
for argv in [["--help"]] + [[name, "--help"] for name in COMMANDS]:
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code == 0, (argv, exc.code)
heavy = sorted(m for m in ("torch", "timm", "torchvision", "numpy", "scipy", "matplotlib") if m in sys.modules)
print("heavy:", heavy, file=sys.stderr)
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert "heavy: []" in r.stderr and "usage: hetprune prune" in r.stdout


def test_import_hetprune_is_cheap_and_public_names_still_work():
    r = _python("""
import sys
import hetprune
assert "torch" not in sys.modules, "import hetprune loaded torch"
from hetprune import Site, sites, HetpruneError
import hetprune.pruning.pipeline                       # imports the module hetprune.model.sites
assert hetprune.sites is sites and callable(hetprune.sites), hetprune.sites
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import hetprune.sites                               # the old path binds that module on the package...
assert hetprune.sites is sites and callable(hetprune.sites), hetprune.sites   # ... and the name stays the function
for name in hetprune.__all__:
    getattr(hetprune, name)
print("ok", Site.__module__)
""")
    assert r.returncode == 0 and "ok hetprune.model.sites" in r.stdout, r.stderr


# -- typed settings (issue 41, item 1) ------------------------------------------------------------------------

EDGES = ("hetprune/core/config.py", "hetprune/cli/")   # where settings are dicts: loading, the CLI


def _string_key_reads(path) -> list[str]:
    """``settings["key"]`` and ``settings.get("key")`` in a file's code (not in its text), with line numbers."""
    import ast

    tree = ast.parse(path.read_text())
    found = []

    def named_settings(node) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name == "settings" or name.endswith("_settings")

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and named_settings(node.value) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and named_settings(node.func.value) and node.args and isinstance(node.args[0], ast.Constant):
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_setting_is_read_by_a_string_key_outside_the_edges():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [p for folder in ("hetprune", "plugins") for p in (root / folder).rglob("*.py")
             if not any(str(p.relative_to(root)).startswith(edge) for edge in EDGES)]
    reads = [hit for p in files for hit in _string_key_reads(p)]
    assert not reads, "read settings through job.config / job.options(Section), not by string keys:\n" + "\n".join(reads)


def test_the_string_key_check_sees_a_read(tmp_path):
    code = tmp_path / "x.py"
    code.write_text('def f(job, run_settings):\n    return job.settings["scorer"], run_settings.get("seed")\n')
    assert len(_string_key_reads(code)) == 2


def test_every_typed_setting_says_what_it_does():
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "hooks"))
    import settings_reference

    silent = [f"{prefix or cls.__name__}.{f.name}" for _, prefix, cls, _, skip in settings_reference.sections()
              for f in dataclasses.fields(cls) if f.name not in skip and not f.metadata.get("help")]
    assert not silent, f"give these settings a help line (hetprune.core.config.setting(default, help)): {silent}"
    page = settings_reference.render()
    assert "`hetdpt.checks`" in page and "`scorer_options.gate-taylor.score_decay`" in page
    assert "`hetdpt_plus.depth_share`" in page and "`mix.ratio`" in page


def test_the_committed_settings_reference_is_the_one_the_code_makes():
    """Issue 69: the page was empty in the repository (only the site build filled it in); it is committed whole now,
    and this fails when a setting changed without the page being written again."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "hooks"))
    import settings_reference

    page = settings_reference.PAGE.read_text(encoding="utf-8")
    assert settings_reference.END in page and "| `image_passes` |" in page and "`base_scratch` default" in page
    assert settings_reference.filled(page) == page, (
        "docs/reference/settings.md is stale: run python docs/hooks/settings_reference.py")


def test_a_strategys_section_is_checked_when_settings_are_resolved():
    from hetprune.core.plugins import get_registry

    hetdpt = get_registry().build("strategy", "hetdpt")
    with pytest.raises(HetpruneError, match=r"hetdpt.path_stride must be a whole number >= 1 .*got 0"):
        loader.resolve(hetdpt, sets=["hetdpt.path_stride=0"])
    with pytest.raises(HetpruneError, match=r"unknown key 'hetdpt.stride'.*allowed here: .*path_stride"):
        loader.resolve(hetdpt, sets=["hetdpt.stride=2"])
    s = loader.resolve(hetdpt, sets=["hetdpt.checks=none"])
    assert s["hetdpt"]["checks"] == "none" and s["hetdpt"]["point_selection"] == "oneshot"


def test_component_options_refuse_unknown_keys_naming_the_allowed_ones():
    from hetprune.core.plugins import get_registry

    with pytest.raises(HetpruneError, match=r"unknown key\(s\) epochs in .*gate-taylor.*allowed: epochs_per_removal"):
        get_registry().build("scorer", "gate-taylor", epochs=2)


# -- one run start (issue 41, item 2) -------------------------------------------------------------------------

def test_prune_compare_and_ablate_all_start_through_start_run(monkeypatch, digits_data, tmp_path):
    import hetprune
    from hetprune.pruning import run_start
    from hetprune.harness.testing import TINY_SETTINGS, tiny_model

    started = []
    real = run_start.start_run

    def spy(strategies, budgets, **kw):
        started.append(kw["folder"].what)
        raise HetpruneError("stop here")

    monkeypatch.setattr(run_start, "start_run", spy)
    calls = [lambda: hetprune.prune(tiny_model(), digits_data, "act-only", 1, settings=TINY_SETTINGS),
             lambda: hetprune.compare(tiny_model(), digits_data, ["act-only"], [1], out=tmp_path / "c"),
             lambda: hetprune.ablate(tiny_model(), digits_data, "hetdpt", 1, out=tmp_path / "a")]
    for call in calls:
        with pytest.raises(HetpruneError, match="stop here"):
            call()
    from hetprune.cli import main

    for argv in (["prune", "--budget", "1"], ["compare", "--budgets", "1"], ["ablate", "--budget", "1"]):
        assert main(argv + ["--out", str(tmp_path / argv[0])]) == 2
    assert started == ["pruned model", "compare", "ablation"] * 2
    assert real is not spy


def test_hetdpts_defaults_are_what_the_committed_map_points_study_chose():
    """The default point scheme, checks and predictor are the study's rule's pick (issues 43 and 58): changing
    any of them without rerunning benchmarks/map_points.py, or committing a study that chose otherwise, fails
    here."""
    from pathlib import Path

    from hetprune_hetdpt.options import HetDPTOptions

    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    study = json.loads((results / "map-points-spread6.json").read_text())   # issue 58's rule over its 14 targets
    chosen = study["choice"]["chosen"]
    assert chosen["targets"] == 14 and chosen["deit_b_share"] <= 0.10
    scheme = dict(item.split("=", 1) for item in study["schemes"][chosen["scheme"]])
    predictor, options = study["predictors"][chosen["predictor"]]
    defaults = HetDPTOptions()
    assert defaults.predictor == predictor and defaults.predictor_options_for(predictor) == options
    # the study spelt the checks in the old verify_* names: the defaults' checks policy is what they spell
    spelt = HetDPTOptions.key_form(defaults.to_dict())
    assert {key: str(spelt[key.split(".", 1)[1]]) for key in scheme} == scheme
    assert {"hetdpt.verify", "hetdpt.verify_among", "hetdpt.verify_selection_at_least"} <= set(scheme)


def test_a_schedule_changed_after_resolve_is_checked_as_set_would_check_it():
    """The CLI's --subset/--workers land in the schedules once the data's size is known
    (`config.changed_schedules`): a copy, each change checked, unknown fields refused by name."""
    settings = loader.resolve().as_settings()
    out = config.changed_schedules(settings, ["finetune", "short_finetune"], workers=3)
    assert out["finetune"]["workers"] == out["short_finetune"]["workers"] == 3
    assert settings["finetune"]["workers"] == 0   # the input is left as it was
    with pytest.raises(HetpruneError, match="workers must be >= 0"):
        config.changed_schedules(settings, ["finetune"], workers=-1)
    with pytest.raises(HetpruneError, match="unknown key.*worker.*allowed"):
        config.changed_schedules(settings, ["finetune"], worker=1)
    with pytest.raises(HetpruneError, match="'scoring' is not a schedule"):
        config.changed_schedules(settings, ["scoring"], subset=1)


def test_the_cli_amends_the_runs_settings_object_once_the_data_is_known():
    """--subset, --subset-frac and --workers give the run's start a changed `Settings` (the object the job then
    carries), each change checked; the object it replaced is left as it was."""
    from argparse import Namespace
    from types import SimpleNamespace

    from hetprune.cli.commands.common import apply_data_options
    from hetprune.core.settings import Settings
    from hetprune.pruning.run_start import start_run

    start = start_run(["act-only"], [Budget(sites=1)])
    first = start.settings
    assert isinstance(first, Settings)
    data = SimpleNamespace(train=list(range(200)), workers=None)
    apply_data_options(Namespace(subset=None, subset_frac=0.25, workers=2), start, data)
    assert isinstance(start.settings, Settings) and start.settings is not first
    assert start.config.short_finetune.subset == 50 and start.config.finetune.workers == 2
    assert start.config.short_finetune.workers == 2 and data.workers == 2
    assert first.run.finetune.workers == 0 and first.run.short_finetune.subset != 50
    with pytest.raises(HetpruneError, match="--subset must be >= 1"):
        apply_data_options(Namespace(subset=0, subset_frac=None, workers=None), start, data)


def test_flags_that_set_a_section_reach_it_as_typed_values_and_set_still_wins():
    """--predictor, --round-to and --latency-batch are typed overrides, not YAML text: after the file, before
    --set (which wins)."""
    import argparse

    from hetprune import get_registry
    from hetprune.cli.commands.prune_cmd import settings_options

    registry = get_registry()
    strategies = [registry.build("strategy", "hetdpt"), registry.build("strategy", "hetdpt-plus")]
    args = argparse.Namespace(scorer=None, device=None, amp=None, cost_model=None, seed=None, config=None,
                              predictor="gp", round_to=16, latency_batch=4, set=[])
    given = settings_options(args, strategies)
    settings = loader.resolve(strategies, overrides=given["overrides"], sets=given["sets"])
    assert settings["hetdpt"]["predictor"] == "gp"
    assert settings["width"]["pruner_options"] == {"round_to": 16}
    assert settings["cost_model_options"] == {"latency": {"batch_size": 4}}
    args.set = ["hetdpt.predictor=poly", "width.pruner_options={round_to: 8}"]
    given = settings_options(args, strategies)
    settings = loader.resolve(strategies, overrides=given["overrides"], sets=given["sets"])
    assert settings["hetdpt"]["predictor"] == "poly" and settings["width"]["pruner_options"] == {"round_to": 8}
    args.round_to = 0
    with pytest.raises(HetpruneError, match="--round-to must be a whole number >= 1, got 0"):
        settings_options(args, strategies)


# -- the typed object a job carries ---------------------------------------------------------------------------

def _hetdpt_settings(*sets):
    from hetprune.core.plugins import get_registry

    return loader.resolve(get_registry().build("strategy", "hetdpt"), sets=list(sets)).as_settings()   # the dict


def test_a_jobs_settings_are_one_object_parsed_once(tiny_model, digits_data, tmp_path):
    import dataclasses

    from hetprune.core.settings import Settings
    from hetprune.core.plugins import get_registry
    from hetprune.pruning.job import PruneJob
    from hetprune_hetdpt.options import HetDPTOptions

    job = PruneJob(dense=tiny_model, spec=None, data=digits_data, budget=Budget(sites=1),
                   settings=_hetdpt_settings("seed=2"), registry=get_registry(), workdir=tmp_path, progress=False,
                   log=lambda s: None)
    assert isinstance(job.settings, Settings)
    assert job.config is job.config and job.options(HetDPTOptions) is job.options(HetDPTOptions)   # parsed once
    assert job.seed == 2 and job.options(HetDPTOptions).checks == HetDPTOptions().checks
    sub = dataclasses.replace(job, settings=job.settings.replace(seed=5).replace_in("hetdpt", checks="none"))
    assert sub.seed == 5 and sub.options(HetDPTOptions).checks == "none"
    assert job.seed == 2 and job.options(HetDPTOptions).checks == HetDPTOptions().checks   # the parent unchanged


def test_a_change_to_the_settings_object_is_checked_as_the_loader_checks():
    from hetprune.core.settings import Settings

    s = Settings(_hetdpt_settings())
    with pytest.raises(HetpruneError, match=r"hetdpt.path_stride must be a whole number >= 1 .*got 0"):
        s.replace_in("hetdpt", path_stride=0)
    with pytest.raises(HetpruneError, match="unknown key"):
        s.replace_in("finetune", learning_rate=1e-3)
    with pytest.raises(HetpruneError, match="amp must be one of"):
        s.replace(amp="fp8")
    with pytest.raises(HetpruneError, match="unknown setting 'seeds'"):
        s.replace(seeds=3)
    with pytest.raises(HetpruneError, match="no section 'hetdpt_plus'; sections: .*hetdpt"):
        s.replace_in("hetdpt_plus", depth_share=0.5)
    with pytest.raises(HetpruneError, match="amp must be one of"):
        Settings({**_hetdpt_settings(), "amp": "fp8"})   # checked when made, not when first read
    assert s.replace_in("finetune", lr=1e-4).run.finetune.lr == 1e-4 and s.run.finetune.lr != 1e-4


def test_the_settings_object_keys_as_the_dict_it_was_made_from():
    from hetprune.core.keys import fingerprint
    from hetprune.core.settings import Settings

    d = _hetdpt_settings("finetune.lr=1e-4")
    s = Settings(d)
    assert fingerprint({"settings": s}) == fingerprint({"settings": d})
    assert fingerprint(s.replace(seed=1)) != fingerprint(s)
    assert s.as_settings() == d and s.as_settings() is not s.as_settings()   # a copy each time
    d["seed"] = 99
    assert s.run.seed == 0   # made from a copy: the loader's dict changed later does not reach it


def test_reading_the_settings_object_like_a_dict_warns_until_1_0():
    from hetprune.core.settings import Settings
    from hetprune_hetdpt.options import HetDPTOptions

    s = Settings(_hetdpt_settings("seed=4"))
    with pytest.warns(DeprecationWarning, match=r"job.config .* until hetprune 1.0"):
        assert s["seed"] == 4
    with pytest.warns(DeprecationWarning):
        assert s.get("hetdpt")["checks"] == s.section(HetDPTOptions).checks
    with pytest.warns(DeprecationWarning):
        assert "finetune" in s
    with pytest.warns(DeprecationWarning):
        s["finetune"]["lr"] = 1.0   # a copy: the object does not change
    assert s.run.finetune.lr != 1.0
