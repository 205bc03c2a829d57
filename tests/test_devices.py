"""The device policy: --device resolved once, every model and batch placed by one helper, clear errors, AMP."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

import hetprune
from hetprune import HetpruneError
from hetprune.core import devices
from hetprune.cli import main

FAST = ["--scorer", "magnitude", "--set", "finetune.epochs=1", "--set", "finetune.subset=32",
        "--set", "finetune.batch_size=16", "--set", "short_finetune.epochs=1", "--set", "short_finetune.subset=32",
        "--set", "short_finetune.batch_size=16", "--set", "scoring.subset=32", "--set", "scoring.batches=1"]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")
CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def model_args(trained_tiny):
    _, spec, ckpt = trained_tiny
    return ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt)]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_auto_is_cuda_when_available_and_names_are_checked():
    assert devices.resolve("cpu") == torch.device("cpu")
    assert devices.canonical("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert devices.resolve(torch.device("cpu")) == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "cuda:-1", "mps"):
        with pytest.raises(HetpruneError, match="allowed: auto, cpu, cuda, cuda:N"):
            devices.canonical(bad)


@NO_CUDA
def test_cuda_without_cuda_names_what_is_available():
    for name in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(HetpruneError, match=r"available here: cpu; use --device cpu or auto"):
            devices.canonical(name)


def test_gpu_index_and_torchrun_rank(monkeypatch):
    """Device counting is torch's; here it is made to report one GPU, then two under torchrun."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert devices.resolve("cuda") == torch.device("cuda", 0)
    assert devices.canonical("auto") == "cuda"
    with pytest.raises(HetpruneError, match=r"cuda:3: this machine has 1 CUDA device; available here: cpu, cuda:0"):
        devices.canonical("cuda:3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert devices.canonical("cuda") == "cuda"            # what settings hold: the same on every rank
    assert devices.resolve("cuda") == torch.device("cuda", 1)
    with pytest.raises(HetpruneError, match="under torchrun each rank uses its own GPU"):
        devices.canonical("cuda:0")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(HetpruneError, match="LOCAL_RANK 2 needs GPU cuda:2"):
        devices.resolve("cuda")


def test_amp_resolution():
    cpu = torch.device("cpu")
    assert devices.resolve_amp("auto", cpu) == "none"
    assert devices.resolve_amp("bf16", cpu) == "bf16"
    assert devices.resolve_amp(None, cpu) == "none"
    with pytest.raises(HetpruneError, match="fp16 needs a CUDA device"):
        devices.resolve_amp("fp16", cpu)
    with pytest.raises(HetpruneError, match="allowed: auto, bf16, fp16, none"):
        devices.resolve_amp("fp8", cpu)


@NO_CUDA
@pytest.mark.parametrize("argv,message", [
    (["prune", "--budget", "4", "--device", "cuda"], "--device cuda: torch finds no CUDA device"),
    (["prune", "--budget", "4", "--device", "cuda:3"], "--device cuda:3: torch finds no CUDA device"),
    (["compare", "--budget", "4", "--device", "gpu"], "--device gpu: not a device; allowed: auto, cpu"),
    (["ablate", "--budget", "4", "--device", "cuda"], "available here: cpu"),
    (["prune", "--budget", "4", "--amp", "fp16"], "--amp fp16 needs a CUDA device"),
    (["bench", "vit_tiny_patch16_224", "--device", "cuda:1"], "--device cuda:1: torch finds no CUDA device"),
])
def test_device_mistakes_are_one_error_line(argv, message, capsys, tmp_path):
    assert main([*argv, "--out" if argv[0] != "bench" else "--json", str(tmp_path / "o")]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_prune_runs_with_cpu_and_auto(device, trained_tiny, tmp_path, capsys):
    """``auto`` on a machine without CUDA picks the CPU and runs (it used to end in a traceback)."""
    out = tmp_path / "out"
    argv = ["prune", *model_args(trained_tiny), "--strategy", "act-only", "--budget", "2", "--device", device,
            *FAST, "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    settings = json.loads((out / "report.json").read_text())["settings"]
    expected = devices.canonical(device)
    assert settings["device"] == expected and settings["amp"] == devices.resolve_amp("auto", devices.resolve(expected))


def test_compare_and_ablate_run_with_auto(trained_tiny, tmp_path, capsys, monkeypatch):
    from hetprune_hetdpt.strategy import HetDPT

    monkeypatch.setattr(HetDPT, "collect_points", lambda self, job, plan: [
        {"n_attn": a, "n_act": m, "metric": 90.0 - 2.0 * a - 0.5 * m} for a, m in plan])
    expected = devices.canonical("auto")
    out = tmp_path / "cmp"
    assert main(["compare", *model_args(trained_tiny), "--speed-budget", "0",
                 "--strategies", "act-only,mix50", "--budget", "2",
                 "--batch-sizes", "1,4", "--device", "auto", *FAST, "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["settings"]["device"] == expected and data["timing"]["environment"]["device"] == expected
    out = tmp_path / "abl"
    assert main(["ablate", *model_args(trained_tiny), "--budget", "1", "--device", "auto", *FAST,
                 "--set", "hetdpt.predictor_options={poly: {degree: 1}}", "--out", str(out)]) == 0
    result = json.loads((out / "ablation.json").read_text())
    assert len(result["splits"]) == 2 and result["finetune"]["epochs"] == 1


def _float64(obj):
    if isinstance(obj, torch.Tensor):
        return obj.double() if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_float64(o) for o in obj)
    return obj


@pytest.fixture
def float64_place(monkeypatch):
    """Wrap ``hetprune.core.devices.place`` so that it also turns what it places into float64.

    On a CPU-only machine every device is the CPU, so a model or batch that
    bypassed the helper would go unnoticed; with this wrapper anything that
    skipped it is still float32 and fails (torch refuses the dtype mismatch),
    exactly as a CPU tensor meeting a CUDA model does. Records the modules
    placed and anything placed elsewhere than ``watch.device``.
    """
    real_place = devices.place
    watch = SimpleNamespace(device=torch.device("cpu"), placed=[], wrong=[])

    def place(obj, dev):
        if dev != watch.device:
            watch.wrong.append(f"placed on {dev}, not {watch.device}")
        obj = real_place(obj, dev)
        if isinstance(obj, torch.nn.Module):
            watch.placed.append(obj)
            return obj.to(torch.float64)
        return _float64(obj)

    monkeypatch.setattr(devices, "place", place)
    return watch


def test_evaluate_and_train_move_the_model_they_are_given(float64_place, tiny_model, digits_data):
    from hetprune.training.loaders import loader
    from hetprune.training.train import TrainConfig, evaluate, train

    watch = float64_place
    top1 = evaluate(tiny_model, loader(digits_data.val, 64, shuffle=False), "cpu")
    assert watch.placed == [tiny_model]
    with torch.no_grad():   # the reference: the float64 model the helper made, on the whole set at once
        x, y = map(torch.stack, zip(*[(img, torch.as_tensor(label)) for img, label in digits_data.val]))
        assert top1 == pytest.approx(100.0 * (tiny_model(x.double()).argmax(-1) == y).double().mean().item())
    tiny_model.float()
    train(tiny_model, digits_data, TrainConfig(epochs=1, subset=16, batch_size=8, kd="none"), progress=False)
    assert watch.placed[-1] is tiny_model and tiny_model.cls_token.dtype == torch.float64 and not watch.wrong


# the latency cost model times models on the run's device: on CUDA ``cost_model: auto`` is latency, so the CPU
# row with ``cost_model=latency`` is the CUDA row's twin (its bench timing bypassed the helper once, unseen here)
LATENCY = ["--set", "cost_model=latency", "--set", "cost_model_options={latency: {batch_size: 4, repeats: 1, "
           "min_time_s: 0, budget_s: 0.01, verify_repeats: 1, cache: false, tolerance: 10}}"]


@pytest.mark.parametrize("device,strategy,budget,cost", [
    ("cpu", "hetdpt", ["--budget", "2"], []),
    ("cpu", "hetdpt", ["--budget", "2"], LATENCY),
    ("cpu", "hetdpt-plus", ["--target-macs", "0.6"], []),
    pytest.param("cuda", "hetdpt", ["--budget", "2"], [], marks=CUDA),
    pytest.param("cuda", "hetdpt-plus", ["--target-macs", "0.6"], [], marks=CUDA),
], ids=["cpu-hetdpt", "cpu-hetdpt-latency", "cpu-hetdpt-plus", "cuda-hetdpt", "cuda-hetdpt-plus"])
def test_every_model_and_batch_of_prune_goes_through_the_helper(device, cost, strategy, budget, trained_tiny, tmp_path,
                                                                float64_place, capsys):
    """Walk every forward pass of a ``prune`` run and check its model and input are on the resolved device
    (and went through the helper: see ``float64_place``)."""
    from timm.models.vision_transformer import VisionTransformer

    resolved = devices.resolve(device)
    watch = float64_place
    watch.device = resolved
    forwards = []

    def check(module, args):
        if not isinstance(module, VisionTransformer):
            return
        forwards.append(id(module))
        params = {(p.device, p.dtype) for p in module.parameters()}
        if params != {(resolved, torch.float64)} or (args[0].device, args[0].dtype) != (resolved, torch.float64):
            watch.wrong.append(f"forward of a model on {params} with input {args[0].device}, {args[0].dtype}")

    handle = torch.nn.modules.module.register_module_forward_pre_hook(check)
    try:
        code = main(["prune", *model_args(trained_tiny), "--strategy", strategy, *budget, "--device", device,
                     *FAST, "--set", "hetdpt.axis_points=1", "--set", "hetdpt.mixed_points=1",
                     "--set", "hetdpt.dense_point=false", "--set", "hetdpt.predictor_options={poly: {degree: 1}}",
                     "--set", "scorer_options={gate-taylor: {epochs_per_removal: 1, warmup_epochs: 0}}",
                     "--scorer", "gate-taylor", *cost, "--out", str(tmp_path / "out")])
    finally:
        handle.remove()
    assert code == 0, capsys.readouterr().err
    assert not watch.wrong, watch.wrong[:5]
    # the dense model (teacher), MAP-point and scorer copies, and the pruned model all ran forward passes
    assert len(watch.placed) >= 3 and len(set(forwards)) >= 4


def test_amp_runs_forwards_in_low_precision_and_the_loss_in_fp32(tiny_model, digits_data, monkeypatch):
    """bf16 autocast works on CPU too: the student and teacher forwards run in bf16, the KD loss in fp32."""
    import copy

    import hetprune.training.train as train_mod

    seen = {"loss": [], "head": []}
    real_loss = train_mod.training_loss

    def recording_loss(student, labels, teacher, cfg):
        seen["loss"].append((student.dtype, teacher.dtype))
        return real_loss(student, labels, teacher, cfg)

    monkeypatch.setattr(train_mod, "training_loss", recording_loss)
    teacher, start = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    tiny_model.head.register_forward_hook(lambda m, i, out: seen["head"].append(out.dtype))
    cfg = train_mod.TrainConfig(epochs=1, subset=16, batch_size=8, kd="soft", amp="bf16")
    history = train_mod.train(tiny_model, digits_data, cfg, teacher=teacher, progress=False)
    assert seen["head"] and set(seen["head"]) == {torch.bfloat16}
    assert seen["loss"] and set(seen["loss"]) == {(torch.float32, torch.float32)}
    assert tiny_model.cls_token.dtype == torch.float32  # autocast, not a cast of the weights
    # the same run in fp32 from the same weights: bf16 rounding moves the loss a little, not more
    monkeypatch.setattr(train_mod, "training_loss", real_loss)
    fp32 = train_mod.train(start, digits_data, dataclasses.replace(cfg, amp="none"), teacher=teacher, progress=False)
    assert history[0]["loss"] == pytest.approx(fp32[0]["loss"], rel=1e-3)
    assert history[0]["loss"] != fp32[0]["loss"]


def _one_param_step(loss_of, scaler):
    from hetprune.training.train import optimisation_step

    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    stepped = optimisation_step(loss_of(p), [opt], scaler)
    return stepped, p.detach()


def test_an_inf_loss_under_fp16_is_skipped_by_the_grad_scaler_and_nan_is_refused():
    """fp16 overflow (an inf loss) is what the GradScaler is for: skip the step, back off the scale.
    NaN is never absorbed, and without a scaler (bf16, fp32) inf is refused too."""
    from hetprune.training.train import NonFiniteLoss

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)   # what train() builds for fp16, on the CPU
    stepped, p = _one_param_step(lambda p: (p * float("inf")).sum(), scaler)
    assert not stepped and torch.equal(p, torch.ones(3))
    assert scaler.get_scale() == 2.0 ** 8 * scaler.get_backoff_factor()
    stepped, p = _one_param_step(lambda p: (p ** 2).sum(), scaler)           # a finite loss steps as usual
    assert stepped and torch.allclose(p, torch.full((3,), 0.8))
    with pytest.raises(NonFiniteLoss, match="loss became nan"):
        _one_param_step(lambda p: (p * float("nan")).sum(), scaler)
    with pytest.raises(NonFiniteLoss, match="loss became inf"):
        _one_param_step(lambda p: (p * float("inf")).sum(), torch.amp.GradScaler("cpu", enabled=False))


def test_train_under_fp16_skips_an_overflowing_step_instead_of_stopping(tiny_model, digits_data, tmp_path,
                                                                       monkeypatch):
    import hetprune.training.train as train_mod

    calls, real_loss = [], train_mod.training_loss

    def overflow_once(*args):
        calls.append(1)
        loss = real_loss(*args)
        return loss * float("inf") if len(calls) == 2 else loss

    monkeypatch.setattr(train_mod, "training_loss", overflow_once)
    # fp16 needs CUDA: the CPU's GradScaler stands in for the one train() builds for it
    monkeypatch.setattr(train_mod, "grad_scaler", lambda device, amp: torch.amp.GradScaler("cpu", init_scale=2.0 ** 8))
    cfg = train_mod.TrainConfig(epochs=1, subset=32, batch_size=8, kd="none")
    history = train_mod.train(tiny_model, digits_data, cfg, checkpoint_dir=tmp_path, progress=False)
    assert len(calls) == 4 and history[0]["loss"] < float("inf")   # the inf step is left out of the mean
    ckpt = torch.load(str(tmp_path / "finetune-checkpoint.pt"), weights_only=True)
    assert ckpt["scaler"]["scale"] == 2.0 ** 7                  # one step skipped, the scale backed off once


def test_the_device_defaults_to_auto_and_the_run_says_which_it_resolved_to(digits_data):
    from hetprune.core import config
    from hetprune.harness.testing import TINY_SETTINGS, tiny_model

    assert config.CORE_DEFAULTS["device"] == "auto"
    said = []
    settings = {k: v for k, v in TINY_SETTINGS.items() if k != "device"}   # the default, not cpu given
    result = hetprune.prune(tiny_model(), digits_data, "act-only", 1, settings={**settings, "scorer": "magnitude"},
                            progress=False, log=said.append)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert result.report["settings"]["device"] == expected
    assert any(line.startswith(f"device: {expected}") for line in said), said


def test_a_run_sets_tf32_as_its_setting_says_and_a_change_keys_the_run(monkeypatch, trained_tiny, tmp_path):
    """``tf32`` (default true) reaches the device when a run starts; false keys what the run makes (its plan's
    key here), true, the default, is left out of the settings (keys made before it do not move)."""
    calls = []
    monkeypatch.setattr(devices, "set_tf32", lambda device, on=True: calls.append((device.type, on)) or "fp32")
    keys = []
    for i, extra in enumerate(([], ["--set", "tf32=false"], ["--set", "tf32=true"])):
        out = tmp_path / f"out{i}"
        assert main(["prune", *model_args(trained_tiny), "--strategy", "act-only", "--budget", "1", "--device", "cpu",
                     *FAST, *extra, "--plan", "--plan-probe", "0", "--out", str(out)]) == 0
        assert calls[-1] == ("cpu", extra != ["--set", "tf32=false"])
        keys.append(json.loads((tmp_path / f"out{i}.work" / "plan.json").read_text())["key"])
    assert keys[0] == keys[2] != keys[1]
    assert main(["prune", *model_args(trained_tiny), "--budget", "1", "--set", "tf32=maybe", "--plan", "--plan-probe", "0",
                 "--out", str(tmp_path / "bad")]) == 2


def test_exactness_checks_compare_in_full_fp32_whatever_tf32_says(tiny_model):
    """On an H200 the merger contract failed a merge that is exact: with TF32 on (the runs' default on such
    GPUs) the same forward differs from itself by about 1e-4 relative. The checks' forwards run with fp32
    matmuls in full fp32, and the run's TF32 setting is put back after."""
    from hetprune.model import checks, surgery

    seen = []
    tiny_model.register_forward_pre_hook(lambda m, a: seen.append(torch.get_float32_matmul_precision()))
    x = torch.randn(2, 1, 16, 16)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")   # what a run sets on a GPU with TF32
    try:
        checks.outputs(tiny_model, x)
        surgery.max_abs_error(tiny_model, tiny_model, x)
        assert seen == ["highest"] * 3
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
