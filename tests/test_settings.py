"""Settings are typed by their defaults; NaN and infinities are refused wherever a number is read;
``--help`` is fast because it never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hetprune import HetpruneError, config
from hetprune.budget import Budget, parse_macs
from hetprune.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_numbers_given_as_text_are_converted_to_the_defaults_type(tmp_path):
    # YAML reads 1e-5 (no dot) as text; the default 0.0005 says it is a number
    s = config.resolve({}, sets=["finetune.lr=1e-5", "finetune.epochs='4'", "finetune.weight_decay=0",
                                 "scoring.batches=2.0", "short_finetune.subset=null", "seed=+3"])
    assert s["finetune"]["lr"] == 1e-5 and isinstance(s["finetune"]["lr"], float)
    assert s["finetune"]["epochs"] == 4 and isinstance(s["finetune"]["epochs"], int)
    assert s["finetune"]["weight_decay"] == 0.0 and isinstance(s["finetune"]["weight_decay"], float)
    assert s["scoring"]["batches"] == 2 and isinstance(s["scoring"]["batches"], int)
    assert s["short_finetune"]["subset"] is None and s["seed"] == 3
    cfg = tmp_path / "c.yaml"
    cfg.write_text("finetune: {lr: 3e-4, kd_temperature: 1}\n")
    s = config.resolve({}, str(cfg))
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
        config.resolve(HetDPT.defaults, sets=[item])
    assert message in str(exc.value)


def test_declared_types_cover_null_defaults():
    defaults = {"extra": {"depth_sites": None, "note": None}}
    s = config.resolve(defaults, sets=["extra.depth_sites='3'", "extra.note=anything"],
                       types={"extra.depth_sites": (int, None)})
    assert s["extra"] == {"depth_sites": 3, "note": "anything"}
    with pytest.raises(HetpruneError, match="extra.depth_sites = 'three' is not a whole number or null"):
        config.resolve(defaults, sets=["extra.depth_sites=three"], types={"extra.depth_sites": (int, None)})
    with pytest.raises(HetpruneError, match="extra.note = inf is not a finite number"):
        config.resolve(defaults, sets=["extra.note=.inf"])


def test_a_type_is_the_defaults_even_after_a_file_set_it_to_null(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("finetune: {subset: null}\n")
    with pytest.raises(HetpruneError, match="finetune.subset = 'x' is not a whole number or null"):
        config.resolve({}, str(cfg), sets=["finetune.subset=x"])


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
import hetprune.pipeline                       # binds the submodule hetprune.sites on the package
assert hetprune.sites is sites and callable(hetprune.sites), hetprune.sites
for name in hetprune.__all__:
    getattr(hetprune, name)
print("ok", Site.__module__)
""")
    assert r.returncode == 0 and "ok hetprune.sites" in r.stdout, r.stderr
