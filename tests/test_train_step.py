"""The training step at the hardware's rate (issue 73). There is no GPU here, so each CUDA path is run on the
CPU as its twin: `step_plan` is the one place the step is decided, and a test asks it for CUDA's decision."""

from __future__ import annotations

import pytest
import torch

from hetprune import HetpruneError
from hetprune.core import config
from hetprune.training import train as train_mod
from hetprune.training.train import StepPlan, TrainConfig, step_plan

from conftest import TINY_SPEC

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
PLAIN = StepPlan(compile=False, fused=False, bf16_teacher=False)   # the CPU's step, as it always was


def tiny(seed: int = 0):
    from hetprune.model.spec import build

    torch.manual_seed(seed)
    return build(TINY_SPEC)


# -- the decision, and the setting it reads --------------------------------------------------------------------

def test_the_step_plan_compiles_and_fuses_on_cuda_and_leaves_the_cpu_step_as_it_was():
    auto = TrainConfig()
    assert auto.compile == config.COMPILE_AUTO
    assert step_plan(auto, CUDA, "bf16") == StepPlan(compile=True, fused=True, bf16_teacher=True)
    assert step_plan(auto, CUDA, "fp16").bf16_teacher is False and step_plan(auto, CUDA, "none").bf16_teacher is False
    assert step_plan(auto, CPU, "none") == PLAIN
    assert step_plan(auto, CPU, "bf16").bf16_teacher is True   # the run's precision decides, not the device
    assert step_plan(TrainConfig(compile=False), CUDA, "bf16").compile is False
    assert step_plan(TrainConfig(compile=True), CPU, "none").compile is True


def test_compile_reads_auto_true_false_and_their_words_and_keys_as_before():
    for given, read in ((True, True), (False, False), ("on", True), ("Off", False), ("true", True), ("auto", "auto")):
        assert TrainConfig(compile=given).compile == read, given
    with pytest.raises(HetpruneError, match="compile must be auto, true or false"):
        TrainConfig(compile="sometimes")
    # at auto it is absent from the settings (every key made before it stays); given, it is keyed as true was
    assert "compile" not in TrainConfig().as_settings()
    assert TrainConfig(compile=True).as_settings()["compile"] is True
    settings = config.resolve([], overrides={"finetune": {"compile": False}})   # YAML's true/false (and on/off)
    assert settings["finetune"]["compile"] is False
    assert config.train_config(settings, "finetune").compile is False
    with pytest.raises(HetpruneError, match="compile"):
        config.resolve([], overrides={"finetune": {"compile": 3}})


# -- the teacher -------------------------------------------------------------------------------------------------

def test_the_teacher_under_bf16_is_a_bf16_copy_whose_logits_carry_no_autograd_record():
    teacher, x = tiny(1).eval(), torch.randn(6, 1, 16, 16)
    frozen = train_mod.frozen_teacher(teacher, CPU, "bf16", step_plan(TrainConfig(), CUDA, "bf16"))
    assert {p.dtype for p in frozen.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in teacher.parameters()} == {torch.float32}   # the model given (the dense one) is kept
    logits = frozen(x)
    assert logits.dtype == torch.float32 and logits.grad_fn is None and not logits.requires_grad
    assert not torch.is_inference(logits)   # a loss may save it for its backward
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        autocast_fp32_weights = teacher(x).float()
    scale = torch.finfo(torch.bfloat16).eps * autocast_fp32_weights.abs().max()   # bf16's rounding of the logits
    torch.testing.assert_close(logits, autocast_fp32_weights, rtol=0, atol=scale)


def test_the_teacher_without_bf16_gives_the_logits_it_always_gave():
    teacher, x = tiny(1).eval(), torch.randn(6, 1, 16, 16)
    frozen = train_mod.frozen_teacher(teacher, CPU, "none", PLAIN)
    assert all(a is b for a, b in zip(frozen.parameters(), teacher.parameters()))   # no copy
    with torch.no_grad():
        assert torch.equal(frozen(x), teacher(x))
