"""The training step at the hardware's rate (issue 73). There is no GPU here, so each CUDA path is run on the
CPU as its twin: `step_plan` is the one place the step is decided, and a test asks it for CUDA's decision."""

from __future__ import annotations

import pytest
import torch

from hetprune import HetpruneError
from hetprune.core import config
from hetprune.training.train import StepPlan, TrainConfig, step_plan

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
PLAIN = StepPlan(compile=False, fused=False)   # the CPU's step, as it always was


# -- the decision, and the setting it reads --------------------------------------------------------------------

def test_the_step_plan_compiles_and_fuses_on_cuda_and_leaves_the_cpu_step_as_it_was():
    auto = TrainConfig()
    assert auto.compile == config.COMPILE_AUTO
    assert step_plan(auto, CUDA, "bf16") == StepPlan(compile=True, fused=True)
    assert step_plan(auto, CPU, "none") == PLAIN
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
