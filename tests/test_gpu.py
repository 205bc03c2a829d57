"""The GPU path (``pytest -m cuda``; ``scripts/gpu-check.sh`` runs it): prune, compare, ablate, bench in bf16,
fp16 fine-tuning with a GradScaler, pinned batches, and a 2-rank torchrun with NCCL (needs 2 GPUs).

Every CUDA test has a CPU twin, the same test with ``device="cpu"``: the same arguments through the same
functions, with only what truly needs CUDA swapped (no pinned memory, the clock instead of CUDA events, fp16
autocast allowed on the CPU), so a drift in arguments or APIs fails CI, which has no GPU. The 2-rank NCCL
run's twin is tests/test_distributed.py's gloo runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import hetprune
from hetprune.core import devices
from hetprune.cli import main

CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICES = [pytest.param("cpu", id="cpu-twin"), pytest.param("cuda", marks=CUDA, id="cuda")]

FAST = ["--scorer", "magnitude", "--set", "finetune.epochs=1", "--set", "finetune.subset=64",
        "--set", "finetune.batch_size=16", "--set", "short_finetune.epochs=1", "--set", "short_finetune.subset=32",
        "--set", "short_finetune.batch_size=16", "--set", "scoring.subset=32", "--set", "scoring.batches=1"]
HETDPT = ["--set", "hetdpt.predictor_options={poly: {degree: 1}}"]   # only where hetdpt runs (compare refuses it)


def model_args(trained_tiny):
    _, spec, ckpt = trained_tiny
    return ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt)]


def expected_amp(device: str) -> str:
    return devices.resolve_amp("auto", devices.resolve(device))


@pytest.fixture
def fp16_anywhere(monkeypatch):
    """fp16 autocast on the CPU for a twin: hetprune refuses ``--amp fp16`` off CUDA (few CPU kernels are fast
    in fp16), but torch runs it there, GradScaler included, so the twin takes the CUDA run's fp16 path."""
    real = devices.resolve_amp

    def resolve_amp(name, device):
        return "fp16" if name == "fp16" else real(name, device)

    monkeypatch.setattr(devices, "resolve_amp", resolve_amp)


@pytest.mark.parametrize("device", DEVICES)
def test_prune_hetdpt(device, trained_tiny, digits_data, tmp_path):
    from hetprune.training.train import evaluate_dataset

    out = tmp_path / "out"
    assert main(["prune", *model_args(trained_tiny), "--strategy", "hetdpt", "--budget", "4", "--device", device,
                 *FAST, *HETDPT, "--set", "hetdpt.axis_points=2", "--set", "hetdpt.mixed_points=1",
                 "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["device"] == device and report["settings"]["amp"] == expected_amp(device)
    assert report["n_attn"] + report["n_act"] == 4
    model = hetprune.load(out)
    # the CPU reference: the saved model in fp32 on the same validation set. The report's top1 is measured in
    # the run's amp on the GPU before the merge, so a few borderline images (0.2 points each) may go the other way
    assert report["top1"] == pytest.approx(evaluate_dataset(model, digits_data.val, "cpu"), abs=3.0)
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        cpu_out = model(x)
    with torch.no_grad():   # the same model on the device (TF32 convolutions allowed: a looser tolerance)
        assert torch.allclose(model.to(device)(x.to(device)).cpu(), cpu_out, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_finetune_uses_a_grad_scaler(device, tiny_model, digits_data, tmp_path, fp16_anywhere):
    import copy
    import dataclasses

    from hetprune.training.train import TrainConfig, train

    start = copy.deepcopy(tiny_model)
    cfg = TrainConfig(epochs=2, subset=64, batch_size=16, kd="none", device=device, amp="fp16")
    history = train(tiny_model, digits_data, cfg, checkpoint_dir=tmp_path, progress=False)
    # the CPU reference: the same run (same seeds, same batches) in fp32; fp16 rounding moves the loss a little
    reference = train(start, digits_data, dataclasses.replace(cfg, device="cpu", amp="none"), progress=False)
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in reference], rel=0.02)
    ckpt = torch.load(str(tmp_path / "finetune-checkpoint.pt"), weights_only=True)
    assert ckpt["scaler"]["scale"] > 0        # the GradScaler ran and its state is kept for --resume
    assert tiny_model.cls_token.device.type == device and tiny_model.cls_token.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_gate_phase_runs_in_fp16_with_pinned_batches_and_a_grad_scaler(device, tiny_model, tmp_path, monkeypatch,
                                                                       fp16_anywhere):
    """gate-taylor's gate phase trains like every fine-tune: on the run's device, forwards under fp16 autocast,
    batches pinned for a GPU, the GradScaler's state in its checkpoint. The loader calls are watched where
    they are made: the modules that call ``loader`` by the name they imported."""
    import copy

    import hetprune.training.task as task_mod
    import hetprune.training.train as train_mod
    from hetprune.harness.testing import scoring_context
    from hetprune_hetdpt.scorers import GateTaylorScorer

    pinned, heads = [], []
    for module in (train_mod, task_mod):
        real = module.loader

        def loader(*args, _real=real, **kwargs):
            pinned.append(kwargs.get("pin_memory", False))
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, "loader", loader)
    model = copy.deepcopy(tiny_model)
    model.head.register_forward_hook(lambda m, i, out: heads.append((out.device.type, out.dtype)))
    ctx = scoring_context(tiny_model, tmp_path, {"device": device, "amp": "fp16", "scoring": {"subset": 32},
                                                 "short_finetune": {"batch_size": 16, "kd": "none"}})
    ctx.device = device
    removed = GateTaylorScorer(warmup_epochs=0).select(model, {"attn": 1, "act": 1}, ctx)
    assert sorted(s.kind for s in removed) == ["act", "attn"]
    assert pinned and set(pinned) == {device == "cuda"}
    assert heads and set(heads) == {(device, torch.float16)}
    state = torch.load(str(tmp_path / "gate-checkpoint.pt"), weights_only=True)
    assert state["scaler"]["scale"] > 0          # the GradScaler ran (an empty dict when it is off)
    assert model.cls_token.device.type == device and model.cls_token.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_loader_pins_batches_for_cuda(device, digits_data):
    from hetprune.training.loaders import loader

    x, _ = next(iter(loader(digits_data.val, 8, shuffle=False, pin_memory=device == "cuda")))
    assert x.is_pinned() == (device == "cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_compare_two_strategies(device, trained_tiny, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", *model_args(trained_tiny), "--strategies", "act-only,mix50", "--budget", "4",
                 "--device", device, "--batch-sizes", "1,64", *FAST, "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    env = data["timing"]["environment"]
    assert env["device"] == device and bool(env.get("gpu")) == (device == "cuda")
    assert data["timing"]["settings"]["timer"] == ("cuda events" if device == "cuda" else "time.perf_counter")
    assert len(data["rows"]) == 2 and all(r["speedup_large"] > 0 for r in data["rows"])


@pytest.mark.parametrize("device", DEVICES)
def test_ablate(device, trained_tiny, tmp_path):
    out = tmp_path / "abl"
    assert main(["ablate", *model_args(trained_tiny), "--budget", "2", "--device", device, *FAST, *HETDPT,
                 "--set", "hetdpt.axis_points=2", "--set", "hetdpt.mixed_points=1", "--out", str(out)]) == 0
    result = json.loads((out / "ablation.json").read_text())
    assert {(s["n_attn"], s["n_act"]) for s in result["splits"]} == {(0, 2), (1, 1), (2, 0)}


@pytest.mark.parametrize("device", DEVICES)
def test_bench_bf16(device, tmp_path, capsys):
    out = tmp_path / "speed.json"
    kwargs = json.dumps({"img_size": 32, "patch_size": 4, "embed_dim": 64, "depth": 4, "num_heads": 2})
    assert main(["bench", "vit_tiny_patch16_224", "--model-kwargs", kwargs, "--device", device, "--dtype", "bf16",
                 "--batch-sizes", "1,64", "--repeats", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["environment"]["dtype"] == "bf16" and result["environment"]["device"] == device
    assert all(r["throughput_img_s"] > 0 for r in result["results"])
    assert all((r["peak_memory_bytes"] or 0) > 0 if device == "cuda" else r["peak_memory_bytes"] is None
               for r in result["results"])


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_torchrun_two_ranks_use_nccl_and_their_own_gpu(trained_tiny, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO", "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "hetprune",
           "prune", *model_args(trained_tiny), "--strategy", "act-only", "--budget", "2", "--device", "cuda", *FAST,
           "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert proc.stdout.count("saved ") == 1           # rank 0 alone writes and reports
    assert "NCCL INFO" in text                        # the process group is NCCL, not gloo
    assert json.loads((out / "report.json").read_text())["settings"]["device"] == "cuda"


# a CUDA test whose twin lives elsewhere: the twin's node id, and why
TWINS_ELSEWHERE = {
    "test_torchrun_two_ranks_use_nccl_and_their_own_gpu":
        "tests/test_distributed.py::test_torchrun_prune_with_uneven_data_matches_single_process",   # gloo
}


def test_every_cuda_test_has_a_cpu_twin(request):
    """Every test marked ``cuda`` in this session has its twin here: the same test function run with
    ``device="cpu"`` (or a named one of `TWINS_ELSEWHERE`), so CI, which has no GPU, runs its logic."""
    items = request.session.items
    cuda = [i for i in items if i.get_closest_marker("cuda")]
    if not cuda:
        pytest.skip("no cuda test collected in this session")
    twins = {getattr(i, "function", None) for i in items
             if not i.get_closest_marker("cuda") and getattr(i, "callspec", None) is not None
             and i.callspec.params.get("device") == "cpu"}
    ids = {i.nodeid for i in items}
    missing = []
    for item in cuda:
        elsewhere = TWINS_ELSEWHERE.get(item.originalname)
        if elsewhere is not None:
            if elsewhere not in ids and len(items) > 1000:   # the whole suite is collected: the twin must be in it
                missing.append(f"{item.nodeid} (its twin {elsewhere} is gone)")
        elif item.function not in twins:
            missing.append(item.nodeid)
    assert not missing, f"CUDA tests without a CPU twin (parametrize device over cpu and cuda): {missing}"
