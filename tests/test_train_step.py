"""The training step at the hardware's rate (issue 73). There is no GPU here, so each CUDA path is run on the
CPU as its twin: `step_plan` is the one place the step is decided, and a test asks it for CUDA's decision."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hetprune import HetpruneError
from hetprune.core import config
from hetprune.core import loader
from hetprune.training import train as train_mod
from hetprune.training.train import ClassificationSource, StepPlan, TrainConfig, step_plan, train

from conftest import seeded_tiny as tiny

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
PLAIN = StepPlan(compile=False, fused=False, bf16_teacher=False)   # the CPU's step, as it always was


@pytest.fixture
def data(digits_data):
    return digits_data


def cuda_plan(cfg, device, amp):
    """What `step_plan` decides on CUDA, for a run on the CPU."""
    return step_plan(cfg, CUDA, amp)


class Stepping:
    """A training source that records each step's loss, and every read of a tensor's value on the host between
    the step's batch and the next (``reads``: one count per step)."""

    READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")

    def __init__(self, data, monkeypatch=None):
        self.source, self.losses, self.reads, self.stepping = ClassificationSource(data), [], [], False
        for name in self.READS if monkeypatch else ():
            monkeypatch.setattr(torch.Tensor, name, self._spy(getattr(torch.Tensor, name)))

    def _spy(self, real):
        def read(tensor, *args, **kwargs):
            if self.stepping:
                self.reads[-1] += 1
            return real(tensor, *args, **kwargs)
        return read

    def __getattr__(self, name):
        return getattr(self.source, name)

    def epoch(self, *args, **kwargs):
        for batch in self.source.epoch(*args, **kwargs):
            self.reads.append(0)
            self.stepping = True
            yield batch
            self.stepping = False

    def loss(self, *args):
        loss = self.source.loss(*args)
        self.losses.append(loss.detach().clone())
        return loss


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
    settings = loader.resolve([], overrides={"finetune": {"compile": False}})   # YAML's true/false (and on/off)
    assert settings["finetune"]["compile"] is False
    assert config.train_config(settings, "finetune").compile is False
    with pytest.raises(HetpruneError, match="compile"):
        loader.resolve([], overrides={"finetune": {"compile": 3}})


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


# -- the compiled, fused step ------------------------------------------------------------------------------------

def test_the_compiled_fused_step_gives_the_plain_steps_losses_and_weights(data, monkeypatch):
    """Compiled with AOTAutograd's eager backend (its forward and backward graphs as inductor receives them):
    inductor's C++ build of a tiny ViT takes half a minute on this CPU, and its kernels are not CUDA's anyway."""
    cfg = TrainConfig(epochs=1, batch_size=8, subset=32, kd="soft")
    teacher = tiny(1)
    runs = {}
    compiled = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **kw: compiled.append(module) or real_compile(
        module, backend="aot_eager", **kw))
    fused = []
    real_optimizer = train_mod.make_optimizer
    monkeypatch.setattr(train_mod, "make_optimizer", lambda *a, **kw: fused.append(kw["fused"]) or real_optimizer(
        *a, **kw))
    for name, plan in (("plain", PLAIN), ("compiled", StepPlan(compile=True, fused=True, bf16_teacher=False))):
        monkeypatch.setattr(train_mod, "step_plan", lambda cfg, device, amp, plan=plan: plan)
        model, source = tiny(), Stepping(data)
        train(model, source, cfg, teacher=teacher, progress=False)
        runs[name] = (torch.stack(source.losses), model.state_dict())
    assert fused == [False, True]
    assert compiled == [teacher, model]   # the teacher's forward, the student's forward and backward
    (plain_losses, plain_weights), (losses, weights) = runs["plain"], runs["compiled"]
    assert len(losses) == cfg.subset // cfg.batch_size
    torch.testing.assert_close(losses, plain_losses)   # fp32's tolerance
    torch.testing.assert_close(weights, plain_weights)
    assert not all(torch.equal(w, v) for w, v in zip(weights.values(), tiny().state_dict().values()))   # it trained


# -- no host sync between checks ---------------------------------------------------------------------------------

def test_cudas_step_reads_nothing_on_the_host_but_at_the_loss_checks(data, monkeypatch):
    """CUDA's step (fused AdamW, the foreach EMA, clipping, a bf16 teacher, distillation) takes no value off the
    device between two loss checks: only a check step reads one, so the host never waits a step for the GPU."""
    monkeypatch.setattr(train_mod, "step_plan", lambda cfg, device, amp: StepPlan(
        compile=False, fused=True, bf16_teacher=cuda_plan(cfg, device, amp).bf16_teacher))
    cfg = TrainConfig(epochs=1, batch_size=8, subset=48, amp="bf16", ema_decay=0.9, clip_grad=1.0, check_every=2)
    source = Stepping(data, monkeypatch)
    train(tiny(), source, cfg, teacher=tiny(1), progress=False)
    checks = [(step + 1) % cfg.check_every == 0 for step in range(len(source.reads))]
    assert len(checks) == cfg.subset // cfg.batch_size
    assert [n > 0 for n in source.reads] == checks, source.reads


def test_a_per_step_read_is_seen(data, monkeypatch):
    """The spy above sees a read added to the step (here the loss's value, taken every step)."""
    monkeypatch.setattr(train_mod, "step_plan", lambda cfg, device, amp: dataclasses.replace(PLAIN, fused=True))
    real_loss = train_mod.forward_loss
    monkeypatch.setattr(train_mod, "forward_loss", lambda *a, **kw: (lambda loss: (loss.item(), loss)[1])(
        real_loss(*a, **kw)))
    cfg = TrainConfig(epochs=1, batch_size=8, subset=32, kd="none", check_every=1000)
    source = Stepping(data, monkeypatch)
    train(tiny(), source, cfg, progress=False)
    assert all(n > 0 for n in source.reads)


def test_cudas_step_stops_a_non_finite_loss_at_the_first_bad_step(data, tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod, "step_plan", lambda cfg, device, amp: dataclasses.replace(
        cuda_plan(cfg, device, amp), compile=False))   # a forward that counts its calls is not for compiling
    cfg = TrainConfig(epochs=2, batch_size=8, subset=32, kd="none", check_every=3)   # 4 steps an epoch
    model, calls = tiny(), {"n": 0}
    real_forward = model.forward

    def forward(x):
        calls["n"] += 1
        out = real_forward(x)
        return out * float("nan") if calls["n"] == 6 else out   # epoch 2, step 2

    model.forward = forward
    with pytest.raises(HetpruneError, match=r"loss became nan at epoch 2, step 2 \(lr .*last good checkpoint"):
        train(model, data, cfg, checkpoint_dir=tmp_path, progress=False)
    assert torch.load(tmp_path / "finetune-checkpoint.pt", weights_only=True)["epoch"] == 1
