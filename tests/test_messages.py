"""Messages that say what is true (issue 34, items 19-22, 24, 25): errors from Python name the call's
arguments and from the command line its options, an ambiguous MAC target is refused with both readings,
Ctrl-C says whether anything was saved, repeated seeds and budgets are refused."""

from __future__ import annotations

import pytest

import hetprune
from hetprune import Budget, HetpruneError
import hetprune.core.io
from hetprune.training import resume as resume_mod
from hetprune.cli import main
from hetprune.cli.commands import prune_cmd


def test_budget_errors_name_the_argument_from_python_and_the_flag_on_the_command_line(capsys):
    with pytest.raises(HetpruneError) as exc:
        Budget(sites=-1)
    assert str(exc.value).startswith("budget must be a count of sites") and "--" not in str(exc.value)
    with pytest.raises(HetpruneError, match=r"^give exactly one budget: budget=K, target_macs=F"):
        Budget()
    assert main(["prune", "--budget", "-1"]) == 2
    assert "error: --budget must be a count of sites >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("value", [1.5, 2, 999.0])
def test_a_mac_target_that_is_neither_a_share_nor_a_count_is_refused_with_both_readings(value):
    with pytest.raises(HetpruneError) as exc:
        Budget(target_macs=value)
    text = str(exc.value)
    assert f"target_macs={value:g} can be read two ways" in text
    assert "share of the dense model's MACs it must be at most 1" in text and "absolute count" in text
    Budget(target_macs=0.5), Budget(target_macs=1.0), Budget(target_macs=2.6e9)   # both readings still work


def test_ctrl_c_before_anything_finished_does_not_claim_saved_work(monkeypatch, capsys):
    monkeypatch.setattr(hetprune.core.io, "_SAVED", [])

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(prune_cmd, "run", interrupted)
    assert main(["prune", "--budget", "2"]) == 130
    err = capsys.readouterr().err
    assert "nothing was saved" in err and "finished work is saved" not in err and "--resume" not in err

    def after_a_point(args):
        resume_mod.note_saved("a point in runs/x.work/map-points.jsonl")
        raise KeyboardInterrupt

    monkeypatch.setattr(prune_cmd, "run", after_a_point)
    assert main(["prune", "--budget", "2"]) == 130
    err = capsys.readouterr().err
    assert "finished work is saved (1 piece, the last a point in runs/x.work/map-points.jsonl)" in err
    assert "--resume" in err


def test_a_fine_tune_checkpoint_counts_as_saved_work(tmp_path, monkeypatch, tiny_model, digits_data):
    from hetprune.training.train import TrainConfig, train

    monkeypatch.setattr(hetprune.core.io, "_SAVED", [])
    train(tiny_model, digits_data, TrainConfig(epochs=1, subset=32, kd="none"), checkpoint_dir=tmp_path / "ft",
          progress=False)
    assert resume_mod.saved_work() == [f"a checkpoint in {tmp_path / 'ft'}"]


@pytest.mark.parametrize("option,values", [("--seeds", "0,0"), ("--budgets", "2,4,2"),
                                           ("--target-macs", "0.5,0.5")])
def test_repeated_seeds_and_budgets_are_refused_on_the_command_line(capsys, option, values):
    assert main(["compare", option, values]) == 2
    assert "more than once; give each once" in capsys.readouterr().err


def test_repeated_seeds_and_budgets_are_refused_from_python(tiny_model, digits_data, tmp_path):
    with pytest.raises(HetpruneError, match=r"^seeds lists 0 more than once"):
        hetprune.compare(tiny_model, digits_data, ["act-only"], budgets=[2], seeds=[0, 0], out=tmp_path / "c")
    with pytest.raises(HetpruneError, match=r"^budgets lists 2 more than once"):
        hetprune.compare(tiny_model, digits_data, ["act-only"], budgets=[2, 2], out=tmp_path / "c")
    with pytest.raises(HetpruneError, match=r"^seeds lists 1 more than once"):
        hetprune.ablate(tiny_model, digits_data, budget=2, seeds=[1, 1], out=tmp_path / "a")
    assert not (tmp_path / "c").exists() and not (tmp_path / "a").exists()


def test_a_metric_is_printed_with_the_digits_its_scale_needs():
    """Issue 34, item 22: two decimals made every point of an MSE task read 0.11."""
    from hetprune.training.task import format_metric

    assert format_metric("mse", 0.113423) == "mse 0.11342" and format_metric("mse", 0.114481) == "mse 0.11448"
    assert format_metric("mIoU", 83.3871) == "mIoU 83.387" and format_metric("top1", 97.7777) == "top-1 97.78%"


@pytest.mark.parametrize("command,data", [("prune", "digits"), ("compare", "digit-grid"), ("ablate", "digits")])
def test_each_command_names_its_data_in_its_first_line(monkeypatch, capsys, tmp_path, command, data):
    """Issue 34, item 27: prune and compare default to different embedded data sets; each says which."""
    import importlib

    importlib.import_module(f"hetprune.cli.commands.{command}_cmd")
    common = importlib.import_module("hetprune.cli.commands.common")   # the start-up every command shares

    def stop(*args, **kwargs):
        raise HetpruneError("stopped after the first line")

    monkeypatch.setattr(common, "base_model", stop)
    budget = ["--budgets", "2"] if command == "compare" else ["--budget", "2"]
    assert main([command, *budget, "--out", str(tmp_path / "o")]) == 2
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"hetprune {command}: data {data} (embedded, the default of hetprune {command};")
    assert "--data digit" in first
    # the others are named, this one is not
    others = [name for name in ("digits", "digit-pairs", "digit-grid") if name != data]
    assert all(f"--data {name}" in first for name in others) and f"--data {data} " not in first


def test_a_bad_setting_from_python_names_the_settings_argument_not_the_command_line(digits_data):
    from hetprune.harness.testing import tiny_model

    for settings, said in (({"finetune": {"epoch": 3}}, "unknown key 'finetune.epoch' in the settings argument"),
                           ({"finetune": {"epochs": "x"}}, "the settings argument: finetune.epochs = 'x'")):
        with pytest.raises(hetprune.HetpruneError) as caught:
            hetprune.prune(tiny_model(), digits_data, strategy="act-only", budget=1, settings=settings,
                           progress=False, log=lambda m: None)
        assert said in str(caught.value) and "command-line" not in str(caught.value)


def test_data_the_model_was_not_made_for_is_refused_by_prune_before_any_work(tmp_path, capsys):
    """A 10-class model with digit-pairs data (19 sums, the same 16x16 images): one line, nothing trained."""
    import json

    from conftest import TINY_SPEC
    from hetprune.core.io import save_weights
    from hetprune.model.spec import build

    save_weights(tmp_path / "digits.safetensors", build(TINY_SPEC))   # a model made for digits' 10 classes
    assert main(["prune", "--strategy", "act-only", "--budget", "2", "--model", TINY_SPEC.name, "--model-kwargs",
                 json.dumps(TINY_SPEC.kwargs), "--checkpoint", str(tmp_path / "digits.safetensors"),
                 "--data", "digit-pairs", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "the model outputs 10 classes but the data digit-pairs has 19" in err and "Traceback" not in err
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.work").exists()
