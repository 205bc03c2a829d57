"""``--plan`` (issue 42, item 6): every stage with its fine-tunes and images, nothing trained; the probe's numbers
kept by the run that follows; the paper's DeiT-B recipe planned at ImageNet's size."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import Dataset

import hetprune
from hetprune.pruning import plan as plan_mod
from hetprune.cli import main
from hetprune.core.io import save_weights
from hetprune.model.spec import build
from conftest import TINY_SPEC

FAST = ["--set", "finetune.epochs=1", "--set", "finetune.subset=32", "--set", "short_finetune.epochs=1",
        "--set", "short_finetune.subset=16", "--set", "scoring.subset=16", "--set", "scoring.batches=1"]


def tiny_cli(tmp_path) -> list[str]:
    save_weights(tmp_path / "tiny.safetensors", build(TINY_SPEC))
    return ["--model", TINY_SPEC.name, "--model-kwargs", json.dumps(TINY_SPEC.kwargs),
            "--checkpoint", str(tmp_path / "tiny.safetensors")]


def test_plan_prints_every_stage_and_trains_nothing(tmp_path, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("--plan --plan-probe 0 trained something")

    from hetprune.training.task import Task

    monkeypatch.setattr(Task, "fit", never)   # every fine-tune goes through a task's fit
    out = tmp_path / "out"
    assert main(["prune", *tiny_cli(tmp_path), "--strategy", "hetdpt", "--budget", "4", *FAST,
                 "--set", "hetdpt.checks=none", "--plan",
                 "--plan-probe", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for stage in ("stage 1: MAP points", "select: gate phase", "stage 2: fine-tune", "evaluations", "total"):
        assert stage in text, text
    assert "no probe" in text
    assert not out.exists()   # no result: the work folder holds the plan only
    assert [p.name for p in (tmp_path / "out.work").iterdir()] == ["plan.json"]
    written = json.loads((tmp_path / "out.work" / "plan.json").read_text())
    final = next(s for s in written["steps"] if s["stage"] == "stage 2: fine-tune")
    assert final["train_images"] == 1 * 32 and final["fine_tunes"] == 1


def test_a_long_stage_or_description_wraps_instead_of_being_cut():
    what = ("3 splits by successive halving, at most 2.42 final fine-tunes (less the removals they share; the "
            "winner's selection is the select stage's gate phase, counted there)")
    stage = "hetdpt-plus: stage 1: pipeline checks of every row"
    text = plan_mod.Plan("t", [plan_mod.PlanStep(stage, what, 3, 1_237_600_000, 0)], None, "k", 1).text()
    words = text.split()
    assert set(what.split()) <= set(words) and set(stage.split()) <= set(words), text
    row = next(line for line in text.splitlines() if "1,237,600,000" in line)
    assert row.startswith("hetdpt-plus: stage 1: pipeline") and "3 splits by successive halving" in row, text


def test_the_run_after_a_plan_reports_its_probe(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["prune", *tiny_cli(tmp_path), "--strategy", "act-only", "--scorer", "magnitude", "--budget", "2",
            *FAST, "--out", str(out)]
    assert main([*args, "--plan", "--plan-probe", "0.5"]) == 0
    probe = json.loads((tmp_path / "out.work" / "plan.json").read_text())["probe"]
    assert probe["train_ips"] > 0 and probe["eval_ips"] > 0 and probe["steps"] >= 4 and probe["teacher"]
    assert probe["startup_s"] >= 0
    assert "images/s training" in capsys.readouterr().out
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["plan_probe"] == probe
    assert main([*args, "--set", "finetune.epochs=2", "--overwrite"]) == 0   # another run: not its probe
    assert json.loads((out / "report.json").read_text())["plan_probe"] is None


class Sized(Dataset):
    """A data set of the given length whose items are made when read (only the plan's example is)."""

    def __init__(self, n: int, classes: int = 1000):
        self.n, self.classes = n, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.zeros(3, 224, 224), i % self.classes


def test_the_paper_recipe_planned_on_deit_b_at_imagenet_size_has_the_releases_images():
    torch.manual_seed(0)
    model = hetprune.model.spec.build(hetprune.model.spec.ModelSpec("deit_base_distilled_patch16_224"))
    from hetprune.training.bundle import DataBundle

    # ImageNet's sizes as hetprune's own classification data (mixup, cutmix, repeats and kd_token act on its
    # batches; a Task's own loader could not take them and is refused): no selection split, so the choices'
    # evaluations read val, as the release's did
    task = DataBundle("imagenet-sized", Sized(1_281_167), Sized(50_000), 1000, 3, 224, "imagenet-sized")
    made = hetprune.prune(model, task, "hetdpt", 10, config="deit-b-paper", amp="none", plan=True, plan_probe=0,
                          progress=False, log=lambda m: None)
    steps = {s.stage: s for s in made.steps}
    assert steps["stage 2: fine-tune"].train_images == 400 * 1_281_167   # 512,466,800: the release's 400 epochs
    assert steps["stage 2: fine-tune"].eval_images == 400 * 50_000       # evaluated every epoch, the best kept
    assert steps["select: gate phase"].train_images == (3 + 8 * 10) * 1_281_167   # the search: all of ImageNet
    points = steps["stage 1: MAP points"]
    assert points.train_images == points.fine_tunes * 10 * 106_764       # 10 epochs on 1/12 of ImageNet each
    assert "stage 1: checks" not in steps                                # checks none: the paper's argmax
    assert "400 epochs, batch 4096" in steps["stage 2: fine-tune"].what
    # the cost line (issue 58): choosing the split as a share of the run, counted by hand from the recipe
    chosen = points.fine_tunes * 10 * 106_764
    run = chosen + (3 + 8 * 10) * 1_281_167 + 400 * 1_281_167
    assert made.map_share() == pytest.approx(chosen / run) and made.to_dict()["map_share"] == made.map_share()
    assert f"{chosen / run:.1%} of the run's training images" in made.text()
    # pipeline checks at this scale (the digit-pairs study's 3.7x the points is a toy-scale ratio): each of the
    # 3 candidates' gate phases (at most: the removals they share are not known before the candidates) plus
    # the 2 final fine-tunes successive halving spends; the winner's selection is the select stage's own gate
    # phase (continued from, not trained again), so at the run's own subset only 2 are the checks'; at a
    # third of the images per gate epoch all 3 are, smaller, and the fine-tunes stay: one round of the 3
    # candidates, each on 2/3 of every epoch's images (whole images: what the run trains on, not the fraction)
    gate, final = steps["select: gate phase"].train_images, steps["stage 2: fine-tune"].train_images
    for share, gates in ((1, 2 * gate), (0.33, 3 * 83 * round(0.33 * 1_281_167))):
        checked = hetprune.prune(model, task, "hetdpt", 10, config="deit-b-paper", amp="none", plan=True,
                                 plan_probe=0, progress=False, log=lambda m: None,
                                 settings={"hetdpt": {"checks": "spread", "checks_options": {"spread": {
                                     "count": 3, "selection": share, "unit": "finetunes"}}}})
        checks = next(s for s in checked.steps if s.stage == "stage 1: pipeline checks")
        # (the fraction 2/3 as the checks store it, to 6 digits: what the run's schedule is cut by)
        assert checks.train_images == gates + 3 * 400 * round(round(2 / 3, 6) * 1_281_167), (share, checks.train_images)
        assert abs(checks.train_images - (gates + 2 * final)) <= 3 * 400   # the 2 final fine-tunes' worth
        assert "at most" in checks.what and "less the removals they share" in checks.what, checks.what   # a bound
        assert ("counted there" in checks.what) == (share == 1), checks.what


@pytest.mark.parametrize("command", [["compare", "--strategies", "hetdpt,mix50", "--budgets", "2,4"],
                                     ["ablate", "--budget", "2", "--seeds", "0,1"]])
def test_compare_and_ablate_plan_their_rows_and_train_nothing(tmp_path, capsys, monkeypatch, command):
    from hetprune.training.task import Task

    def never(*a, **k):
        raise AssertionError("--plan trained something")

    monkeypatch.setattr(Task, "fit", never)
    out = tmp_path / "out"
    assert main([*command, *tiny_cli(tmp_path), "--data", "digits", *FAST, "--set", "hetdpt.checks=none",
                 "--plan", "--plan-probe", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    written = json.loads((out / "work" / "plan.json").read_text())
    stages = [s["stage"] for s in written["steps"]]
    if command[0] == "compare":
        assert "hetdpt: stage 1: MAP points" in stages and "mix50: stage 2: fine-tune" in stages
        mix = next(s for s in written["steps"] if s["stage"] == "mix50: stage 2: fine-tune")
        assert mix["fine_tunes"] == 2 and mix["what"].startswith("2 rows")   # two budgets, one seed
    else:
        assert "cheap points: stage 1: MAP points" in stages and "truth rows: stage 2: fine-tune" in stages
    assert "total" in text and not (out / "rows.jsonl").exists()


def test_a_bad_probe_length_is_one_line(tmp_path, capsys):
    assert main(["prune", *tiny_cli(tmp_path), "--budget", "2", "--plan", "--plan-probe", "-1",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--plan-probe -1.0 is not a number of seconds >= 0" in capsys.readouterr().err


def test_each_fine_tune_pays_the_probes_start_up_in_the_plans_hours():
    """The scale rehearsal's plan put twelve short MAP point fine-tunes 22 % under the time they took: each pays its
    start-up (loaders, a model copy, the DDP wrap) beside its images. The probe measures it; each fine-tune counts it."""
    step = plan_mod.PlanStep("stage 1: MAP points", "points", fine_tunes=12, train_images=768, eval_images=960)
    assert step.times(10.0, 40.0, startup_s=2.5) == pytest.approx(76.8 + 24.0 + 30.0)
    assert step.times(10.0, 40.0) == pytest.approx(76.8 + 24.0)
    probe = plan_mod.Probe(10.0, 40.0, None, 30.0, 10, 32, "cpu", "none", 1, True, "finetune", startup_s=2.5)
    plan = plan_mod.Plan("t", [step], probe, "key", 1)
    hours = {row["stage"]: row["hours"] for row in plan.to_dict()["steps"]}
    assert hours["stage 1: MAP points"] == round(130.8 / 3600, 3) == hours["total"]
    assert "2.5 s of start-up per fine-tune" in plan.text()


FOLDER_KWARGS = {"img_size": 16, "patch_size": 4, "num_classes": 2, "embed_dim": 32, "depth": 2, "num_heads": 2}


def two_class_folder(root):
    """A tiny ImageFolder: 12 training and 2 val PNGs in each of two classes."""
    from PIL import Image

    for split, n in (("train", 12), ("val", 2)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (20, 20), (40 * i % 255, 100 if c == "a" else 200, 30)).save(root / split / c / f"{i}.png")
    return root


def plan_with_workers(root, probe_s: float):
    """``hetprune.prune(..., plan=True)`` of act-only on ``root`` with 2 loader workers: what the CLI calls."""
    from hetprune.training.data import load_data

    data = load_data(str(root), build(hetprune.ModelSpec("vit_tiny_patch16_224", FOLDER_KWARGS)), workers=2)
    return hetprune.prune(build(hetprune.ModelSpec("vit_tiny_patch16_224", FOLDER_KWARGS)), data, strategy="act-only",
                          budget=1, plan=True, plan_probe=probe_s, progress=False, log=lambda m: None,
                          settings={"scorer": "magnitude", "finetune": {"epochs": 1, "subset": 8, "batch_size": 4,
                                                                        "workers": 2},
                                    "short_finetune": {"epochs": 1, "subset": 8}, "scoring": {"batches": 1}})


def test_a_plan_with_loader_workers_leaves_no_worker_process(tmp_path, capsys):
    """Issue 57: ``--plan`` on an H200 printed its plan and never exited: the probe's loaders kept their
    persistent, pinned workers, and the interpreter's exit waited on each. Every command and library call now
    stops the workers of the loaders it opened before it returns."""
    import multiprocessing

    from hetprune.training import loaders

    root = two_class_folder(tmp_path / "imgs")
    args = ["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(FOLDER_KWARGS), "--data", str(root),
            "--strategy", "act-only", "--scorer", "magnitude", "--budget", "1", "--workers", "2", "--subset", "8",
            "--set", "finetune.epochs=1", "--set", "finetune.batch_size=4", "--set", "short_finetune.epochs=1",
            "--set", "scoring.batches=1", "--plan", "--plan-probe", "0.5"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert "images/s training" in capsys.readouterr().out
    assert not multiprocessing.active_children() and not loaders._LOADERS
    made = plan_with_workers(root, 0.5)   # the library call the command makes does the same
    assert made.probe is not None and made.probe.train_ips > 0
    assert not multiprocessing.active_children() and not loaders._LOADERS


class SlowItems(Dataset):
    """Each item costs ``seconds`` to make: a loader slower than the training step."""

    def __init__(self, dataset, seconds: float):
        self.dataset, self.seconds = dataset, seconds

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        import time

        time.sleep(self.seconds)
        return self.dataset[i]


PROBE_SETTINGS = {"scorer": "magnitude", "finetune": {"epochs": 1, "subset": 64, "batch_size": 8, "kd": "none"}}


@pytest.mark.parametrize("slow", ["loader", "step"])
def test_the_probe_times_the_step_the_loader_and_both_and_names_the_bound(slow, digits_data, tiny_model):
    """Issue 57: the probe reports the training step alone (a batch already on the device), the loader alone
    and the two together, each in a steady state, and names the slower part as the run's bound. A loader made
    slow (items that take 40 ms) bounds it; a step made slow (a forward that takes 40 ms) does. The other part
    must beat 200 images/s: 8 images per step of a tiny model, about 5x that on a quiet machine, so a loaded
    one still passes (at 20 ms items the step had to beat 400 and once did not, at load 5-7)."""
    import dataclasses
    import time

    data = digits_data
    if slow == "loader":
        data = dataclasses.replace(digits_data, train=SlowItems(digits_data.train, 0.04))
    else:
        tiny_model.register_forward_pre_hook(lambda m, a: time.sleep(0.04) if m.training else None)
    made = hetprune.prune(tiny_model, data, strategy="act-only", budget=1, plan=True, plan_probe=2.5,
                          settings=PROBE_SETTINGS, progress=False, log=lambda m: None)
    p = made.probe
    assert p.step_ips > 0 and p.loader_ips > 0 and p.train_ips > 0 and p.steps >= 4 and p.workers == 0
    if slow == "loader":   # 8 items of 40 ms: at most 200 images/s, the step far faster
        assert p.loader_ips < 200 < p.step_ips and p.bound == "the loader"
    else:                  # 8 images per 40 ms step: at most 200 images/s
        assert p.step_ips < 200 < p.loader_ips and p.bound == "the training step"
    assert p.train_ips <= 1.2 * min(p.step_ips, p.loader_ips)   # together never beats the slower part alone
    text = made.text()
    assert f"the run is bound by {p.bound}" in text and "the loader alone" in text


def test_a_task_with_its_own_loop_is_probed_through_it(digits_data, tiny_model):
    """A task that fine-tunes in its own loop cannot be timed apart: the probe times whole fine-tunes through
    that loop, and reports no step or loader rate."""
    import torch.nn.functional as F

    from hetprune.training.loaders import loader

    calls = []

    def finetune(model, teacher, schedule):
        calls.append(schedule.epochs)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(schedule.epochs):
            for x, y in loader(digits_data.train, 8, shuffle=True):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                break

    train = [(torch.stack([digits_data.train[i][0] for i in range(8)]), torch.arange(8) % 10)] * 8
    val = [(torch.stack([digits_data.val[i][0] for i in range(8)]), torch.arange(8) % 10)]
    task = hetprune.Task(train=train, val=val, loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                         metric=lambda m, v: 1.0, finetune=finetune)
    made = hetprune.prune(tiny_model, task, strategy="act-only", budget=1, plan=True, plan_probe=0.5,
                          settings=PROBE_SETTINGS, progress=False, log=lambda m: None)
    assert calls and made.probe.train_ips > 0
    assert made.probe.step_ips is None and made.probe.loader_ips is None and made.probe.bound is None
    assert "the loader alone" not in made.text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans on a machine without the run's GPU")
@pytest.mark.parametrize("where", [["--amp", "fp16"], ["--device", "cuda"]])
def test_a_plan_on_a_machine_without_the_runs_gpu_prints_the_counts_and_says_where_to_probe(where, tmp_path,
                                                                                            capsys):
    """A login node: the run's precision (fp16, as deit-b-paper's) or device needs a GPU. The run itself is
    refused; its --plan prints every count and says the probe needs the run's device, instead of stopping."""
    args = ["prune", *tiny_cli(tmp_path), "--strategy", "act-only", "--scorer", "magnitude", "--budget", "2",
            *FAST, *where]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    assert "CUDA" in capsys.readouterr().err
    assert main([*args, "--plan", "--plan-probe", "5", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "stage 2: fine-tune" in text and "total" in text and "images/s" not in text
    assert "note: no probe: it times the run's own device and precision, which this machine lacks" in text
    assert "--plan-probe 0" not in text
    written = json.loads((tmp_path / "out.work" / "plan.json").read_text())
    assert written["probe"] is None and written["notes"][0].startswith("no probe")


def test_the_step_alone_is_timed_with_no_loader_worker_running(tmp_path, monkeypatch):
    """On an H200 the step alone read 1,358 images/s and the step fed by its loader 1,600: the workers started
    to fetch the step's one batch went on decoding while the step was timed. That batch is now read without
    workers; the loader's workers start afterwards, for the loader alone and the two together."""
    import multiprocessing

    seen, real_train = [], plan_mod.train

    def watched(model, source, *args, **kw):
        seen.append((source.batch is not None, len(multiprocessing.active_children())))
        return real_train(model, source, *args, **kw)

    monkeypatch.setattr(plan_mod, "train", watched)
    made = plan_with_workers(two_class_folder(tmp_path / "imgs"), 1.0)
    alone = [children for one_batch, children in seen if one_batch]
    together = [children for one_batch, children in seen if not one_batch]
    assert alone and set(alone) == {0}            # no worker while the step alone is timed
    assert together and min(together) >= 2       # the loader's own workers feed the two together
    assert made.probe.workers == 2 and made.probe.loader_ips > 0


# -- issue 73, item 2: the probe says what share of the device's peak the step reaches -----------------------------

def test_the_probe_counts_the_step_s_flops_and_what_they_make_per_second(tmp_path, capsys):
    import torch

    from hetprune.harness.testing import TINY_SPEC
    from hetprune.model.macs import count_macs
    from hetprune.model.spec import build

    out = tmp_path / "out"
    assert main(["prune", *tiny_cli(tmp_path), "--strategy", "act-only", "--scorer", "magnitude", "--budget", "2",
                 *FAST, "--out", str(out), "--plan", "--plan-probe", "0.5"]) == 0
    text = capsys.readouterr().out
    probe = json.loads((tmp_path / "out.work" / "plan.json").read_text())["probe"]
    torch.manual_seed(0)
    macs = count_macs(build(TINY_SPEC), torch.zeros(2, 1, 16, 16))
    # the student's forward and backward (three forwards) and the dense teacher's forward, 2 FLOPs a MAC
    assert probe["flops_per_image"] == 2.0 * (3 * macs + macs)
    assert probe["achieved_tflops"] == pytest.approx(probe["flops_per_image"] * probe["train_ips"] / 1e12)
    assert probe["precision"] == "fp32" and probe["peak_tflops"] is None   # a CPU: no peak in the table
    assert "GFLOP per image (student forward and backward, teacher forward)" in text
    assert "no dense fp32 peak is known for cpu" in text


def test_a_known_gpu_s_peak_is_named_and_the_share_printed():
    from hetprune.core.devices import matmul_precision, peak_tflops

    assert peak_tflops("NVIDIA H200", "bf16") == ("NVIDIA H200 SXM", 989.4)
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == ("NVIDIA H100 SXM", 989.4)
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == ("NVIDIA H100 PCIe", 756.0)
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == ("NVIDIA A100", 156.0)
    assert peak_tflops("NVIDIA L40S", "bf16")[0] == "NVIDIA L40S" and peak_tflops("NVIDIA L40", "bf16") is None
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None and peak_tflops("cpu", "fp32") is None
    assert (matmul_precision("bf16", True), matmul_precision("none", True), matmul_precision("none", False)) == \
        ("bf16", "tf32", "fp32")
    probe = plan_mod.Probe(train_ips=1600.0, eval_ips=5000.0, peak_memory_gb=40.0, seconds=45.0, steps=100, batch=128,
                           device="cuda:0", amp="bf16", world=1, teacher=True, section="finetune",
                           flops_per_image=100e9, achieved_tflops=160.0, precision="bf16",
                           peak_board="NVIDIA H200 SXM", peak_tflops=989.4)
    assert probe.peak_share == pytest.approx(160.0 / 989.4)
    line = plan_mod.probe_lines(probe)[-1]
    assert line == ("  the training step: 100 GFLOP per image (student forward and backward, teacher forward) at "
                    "1,600 images/s: 160 TFLOP/s: 16.2% of the NVIDIA H200 SXM's dense bf16 peak of 989.4 TFLOP/s "
                    "(NVIDIA's data sheet)")
