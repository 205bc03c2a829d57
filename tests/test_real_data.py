"""Real-data paths: ImageFolder trees, checkpoints, and surviving kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import hetprune
from hetprune import HetpruneError
from hetprune.cli import main
from hetprune.core.io import load_weights
from hetprune.model.spec import ModelSpec, build, build_with_weights

RGB_KWARGS = dict(img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=2, init_values=0.1)
FAST = ["--set", "finetune.epochs=1", "--set", "short_finetune.epochs=1", "--set", "scoring.batches=1",
        "--set", "finetune.batch_size=8", "--set", "short_finetune.batch_size=8", "--set", "scoring.batch_size=8"]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """PNG files in PATH/{train,val}/<class>/, each class its own colour."""
    from PIL import Image

    root = tmp_path_factory.mktemp("imgs")
    gen = torch.Generator().manual_seed(0)
    colours = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
    for split, n in (("train", 10), ("val", 4)):
        for name, rgb in colours.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                noise = torch.randint(-25, 26, (20, 20, 3), generator=gen)
                pixels = (torch.tensor(rgb) + noise).clamp(0, 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def rgb_args():
    return ["--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(RGB_KWARGS)]


def test_prune_end_to_end_on_image_folder(image_folder, tmp_path):
    out = tmp_path / "out"
    rc = main(["prune", *rgb_args(), "--data", str(image_folder), "--strategy", "hetdpt", "--budget", "2",
               "--scorer", "taylor", "--subset", "6", "--workers", "0", "--out", str(out), *FAST,
               "--set", "hetdpt.axis_points=2", "--set", "hetdpt.mixed_points=1", "--set", "hetdpt.checks=none",
               "--predictor", "poly", "--set", "hetdpt.predictor_options={poly: {degree: 1}}"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["short_finetune"]["subset"] == 6
    assert report["n_attn"] + report["n_act"] == 2
    assert report["allocation"]["fit"]["degree"] == 1 and len(report["allocation"]["points"]) >= 3
    model = hetprune.load(out)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 3)


def test_subset_frac_and_bad_data_errors(image_folder, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["prune", *rgb_args(), "--data", str(image_folder), "--strategy", "act-only", "--budget", "1",
                 "--scorer", "magnitude", "--subset-frac", "1.5", "--out", str(out), *FAST]) == 2
    assert "--subset-frac" in capsys.readouterr().err
    assert main(["prune", *rgb_args(), "--data", str(tmp_path / "nowhere"), "--budget", "1", "--out", str(out)]) == 2
    assert "no train/ folder" in capsys.readouterr().err
    assert main(["prune", *rgb_args(), "--budget", "1", "--out", str(out)]) == 2
    assert "--data PATH" in capsys.readouterr().err


def test_checkpoint_files_load_safely_or_fail_clearly(tmp_path):
    spec = ModelSpec("vit_tiny_patch16_224", RGB_KWARGS)
    torch.manual_seed(3)
    model = build(spec)
    pth = tmp_path / "model.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, pth)
    loaded = build_with_weights(spec, checkpoint=str(pth))
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(loaded(x), model.eval()(x))
    # a checkpoint of another model
    other = build(ModelSpec("vit_tiny_patch16_224", {**RGB_KWARGS, "embed_dim": 48}))
    wrong = tmp_path / "other.pth"
    torch.save(other.state_dict(), wrong)
    with pytest.raises(HetpruneError, match="does not fit this model.*shape mismatches"):
        build_with_weights(spec, checkpoint=str(wrong))
    # pickled objects are refused
    evil = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "obj": HetpruneError("x")}, evil)
    with pytest.raises(HetpruneError, match="weights_only"):
        build_with_weights(spec, checkpoint=str(evil))


def run_prune(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "hetprune", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


KILL_9 = {
    # stage: (extra arguments, the checkpoint file that shows the stage is under way, its step key, steps)
    "finetune": (["--scorer", "magnitude", "--budget", "2"], "finetune/finetune-checkpoint.pt", "epoch", 5),
    # the paper's learned gates: 3 removals after a warm-up epoch, checkpointed after each removal
    "gate-taylor": (["--scorer", "gate-taylor", "--budget", "3", "--set", "scoring.subset=600",
                     "--set", "short_finetune.batch_size=16", "--set", "finetune.epochs=1",
                     "--set", "scorer_options={gate-taylor: {epochs_per_removal: 2, warmup_epochs: 1}}"],
                    "scoring/gate-checkpoint.pt", "step", 3),
}


@pytest.mark.parametrize("stage", sorted(KILL_9))
def test_kill_9_then_resume_gives_same_files(trained_tiny, tmp_path, stage):
    extra, ckpt_rel, step_key, steps = KILL_9[stage]
    _, spec, ckpt = trained_tiny
    args = ["prune", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
            "--strategy", "act-only", "--set", "finetune.epochs=5", "--set", "finetune.subset=600",
            "--set", "finetune.batch_size=16", *extra]
    ref = run_prune(args + ["--out", "ref"], tmp_path)
    assert ref.wait(timeout=600) == 0, ref.stdout.read().decode()[-2000:]

    proc = run_prune(args + ["--out", "cut"], tmp_path)
    ckpt_file = tmp_path / "cut.work" / ckpt_rel
    deadline = time.time() + 300
    while not ckpt_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"{stage} finished before it could be interrupted"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "cut").exists()           # nothing that looks complete
    step = torch.load(ckpt_file, weights_only=True)[step_key]
    assert 1 <= step < steps

    resumed = run_prune(args + ["--out", "cut", "--resume"], tmp_path)
    assert resumed.wait(timeout=600) == 0, resumed.stdout.read().decode()[-2000:]
    a, b = load_weights(tmp_path / "ref" / "model.safetensors"), load_weights(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra = json.loads((tmp_path / "ref" / "report.json").read_text())
    rb = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert ra["top1"] == rb["top1"] and ra["finetune_history"] == [
        {**h, "seconds": ra["finetune_history"][i]["seconds"]} for i, h in enumerate(rb["finetune_history"])]


def test_corrupt_finetune_checkpoint_is_reported_by_name(trained_tiny, tmp_path, capsys):
    _, spec, ckpt = trained_tiny
    work = tmp_path / "out.work" / "finetune"
    work.mkdir(parents=True)
    (work / "finetune-checkpoint.pt").write_bytes(b"PK\x03\x04 truncated")
    rc = main(["prune", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
               "--strategy", "act-only", "--scorer", "magnitude", "--budget", "1", "--resume",
               "--out", str(tmp_path / "out"), "--set", "finetune.epochs=1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "finetune-checkpoint.pt is corrupt or truncated" in err
    assert (work / "finetune-checkpoint.pt").read_bytes() == b"PK\x03\x04 truncated"   # never overwritten


def test_model_arguments_timm_rejects_are_clear_errors():
    with pytest.raises(HetpruneError, match="does not take the arguments"):
        build(ModelSpec("vit_tiny_patch16_224", {"no_such_argument": 1}))
    with pytest.raises(HetpruneError, match="timm has no model named 'nope'"):
        build(ModelSpec("nope", {}))


def test_image_folder_fingerprint_changes_when_an_image_changes(image_folder, tmp_path):
    """Resume keys include the data's fingerprint: rewriting one image must change it, not only renaming."""
    import shutil

    import timm

    from hetprune.training.image_folders import image_folder as load_folder

    copy_root = tmp_path / "imgs"
    shutil.copytree(image_folder, copy_root)
    model = timm.create_model("vit_tiny_patch16_224", **RGB_KWARGS)
    before = load_folder(copy_root, model).fingerprint
    assert load_folder(copy_root, model).fingerprint == before  # stable when nothing changed
    target = copy_root / "train" / "red" / "0.png"
    data = target.read_bytes()
    target.write_bytes(data + b"\0")  # same name, other content
    assert load_folder(copy_root, model).fingerprint != before


def test_the_image_folder_fingerprint_reads_names_and_sizes_once_and_content_on_request(image_folder, tmp_path):
    """One listing: each image's name and size, each file stat'ed once (it was twice, per rank); a rewrite to
    the same size shows only in a content scan (--data-fingerprint content), which is opt-in."""
    import shutil

    import timm
    from conftest import CountedStats

    from hetprune.training.image_folders import image_folder as load_folder

    root = tmp_path / "imgs"
    shutil.copytree(image_folder, root)
    model = timm.create_model("vit_tiny_patch16_224", **RGB_KWARGS)
    with CountedStats() as stats:
        sizes = load_folder(root, model).fingerprint
    assert stats.counts == {str(p): 1 for p in root.rglob("*.png")}
    content = load_folder(root, model, fingerprint_by="content").fingerprint
    assert content != sizes
    target = root / "val" / "blue" / "0.png"
    data = bytearray(target.read_bytes())
    data[-20] ^= 0xFF   # the same size, another byte
    target.write_bytes(bytes(data))
    assert load_folder(root, model).fingerprint == sizes
    assert load_folder(root, model, fingerprint_by="content").fingerprint != content
    with pytest.raises(HetpruneError, match="sizes or content"):
        load_folder(root, model, fingerprint_by="mtime")


def test_a_hugging_face_vit_on_an_image_folder_is_normalised_as_its_image_processor_does(image_folder):
    """ViTImageProcessor computes (x - 0.5) / 0.5; an ImageFolder run once used timm's ImageNet mean/std for a
    wrapped transformers model (which has no timm config), training it on inputs it never sees deployed."""
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    from PIL import Image
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor
    from hetprune_hf import wrap

    from hetprune.training.image_folders import image_folder as load_folder

    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=3)
    inner = ViTForImageClassification(config)
    data = load_folder(image_folder, wrap(inner))
    x, _ = data.val[0]
    path = data.val.samples[0][0]
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    want = processor(Image.open(path).convert("RGB"), return_tensors="pt")["pixel_values"][0]
    assert x.shape == want.shape
    assert (x - want).abs().max().item() < 0.05   # resampling differs by a grey level or two; timm's mean: > 0.5

    # a model whose own processor differs says so when wrapped
    own = load_folder(image_folder, wrap(inner, image_mean=[0.4, 0.45, 0.5], image_std=[0.3, 0.25, 0.2]))
    y, _ = own.val[0]
    raw = x * 0.5 + 0.5
    expected = (raw - torch.tensor([0.4, 0.45, 0.5])[:, None, None]) / torch.tensor([0.3, 0.25, 0.2])[:, None, None]
    assert torch.allclose(y, expected, atol=1e-5)
    with pytest.raises(HetpruneError, match=r"image_mean needs one value per input channel \(3\)"):
        wrap(inner, image_mean=[0.5])
    with pytest.raises(HetpruneError, match="image_std must be > 0"):
        wrap(inner, image_std=[0.5, 0.0, 0.5])


def test_the_same_image_folder_prune_twice_gives_the_same_weights_with_or_without_workers(image_folder, tmp_path):
    """Issue 34, item 10: timm's random crops draw from Python's random, which nothing seeded: one command run
    twice gave other sites, weights and top-1. Every item's transform is now seeded by (epoch, index)."""
    outs = []
    for i, workers in enumerate(("0", "2")):
        outs.append(tmp_path / f"out{i}")
        assert main(["prune", *rgb_args(), "--data", str(image_folder), "--strategy", "act-only", "--budget", "1",
                     "--scorer", "taylor", "--augment", "imagenet", "--workers", workers, "--out", str(outs[-1]),
                     *FAST]) == 0
    a, b = (load_weights(o / "model.safetensors") for o in outs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    report = json.loads((outs[0] / "report.json").read_text())
    assert report["settings"]["finetune"]["epochs"] == 1
    assert json.loads((outs[0] / "recipe.json").read_text())["provenance"]["data"]["augment"] == "imagenet"


def test_the_augmentation_is_an_option_and_light_by_default(image_folder):
    from hetprune.training.image_folders import image_folder as load_folder

    model = build(ModelSpec("vit_tiny_patch16_224", RGB_KWARGS))
    assert load_folder(image_folder, model).augment == "light"
    kinds = {a: [type(t).__name__ for t in load_folder(image_folder, model, augment=a).train.dataset.transform.transforms]
             for a in ("light", "imagenet", "none")}
    assert "ColorJitter" in kinds["imagenet"] and "ColorJitter" not in kinds["light"]
    assert "RandomHorizontalFlip" in kinds["light"] and "RandomHorizontalFlip" not in kinds["none"]
    with pytest.raises(HetpruneError, match="augment 'heavy' is not one of light, imagenet, none"):
        load_folder(image_folder, model, augment="heavy")


def test_an_image_folder_has_loader_workers_by_default_and_the_paper_augmentation(image_folder, tmp_path):
    """A share of the CPUs per local process, unless --workers says otherwise (0: none); --augment paper is
    the DeiT recipe of the paper's long fine-tune, recorded as such."""
    from hetprune.training.image_folders import image_folder as load_folder
    from hetprune.training.loaders import default_workers

    model = build(ModelSpec("vit_tiny_patch16_224", RGB_KWARGS))
    data = load_folder(image_folder, model, augment="paper")
    assert data.workers == default_workers() >= 1 and data.augment == "paper"
    assert data.fingerprint != load_folder(image_folder, model).fingerprint
    kinds = [type(t).__name__ for t in data.train.dataset.transform.transforms]
    assert "RandAugment" in kinds and "RandomErasing" in kinds
    out = tmp_path / "out"
    assert main(["prune", *rgb_args(), "--data", str(image_folder), "--strategy", "act-only", "--budget", "1",
                 "--scorer", "magnitude", "--augment", "paper", "--workers", "0", "--out", str(out), *FAST]) == 0
    assert json.loads((out / "recipe.json").read_text())["provenance"]["data"]["augment"] == "paper"


# -- real data gets a real schedule, or a clear stop (issue 42, item 1) ---------------------------------------

def test_an_image_folder_run_without_chosen_schedules_stops_with_one_line_naming_the_config_that_fits(
        image_folder, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["prune", *rgb_args(), "--data", str(image_folder), "--strategy", "act-only", "--budget", "1",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the fine-tune would see 27 of 27 training images (3 epochs, 81 image passes)" in err[0]
    # a folder this small gets the config made for small folders; the ImageNet recipes are named for large sets only
    assert "--config small-folder" in err[0] and "deit-b-paper" not in err[0] and "--config FILE" in err[0]
    assert "finetune.* and short_finetune.* settings" in err[0]
    assert not out.exists() and not (tmp_path / "o.work").exists()
    # a schedule chosen by hand runs (one epoch, no point fine-tune): the stop is about unchosen schedules only
    assert main(["prune", *rgb_args(), "--data", str(image_folder), "--strategy", "act-only", "--budget", "1",
                 "--scorer", "magnitude", "--workers", "0", "--out", str(out), *FAST]) == 0


def _big_task(n):
    from torch.utils.data import DataLoader, TensorDataset

    big = TensorDataset(torch.zeros(n, 1, 16, 16), torch.zeros(n, dtype=torch.long))
    return hetprune.Task(train=DataLoader(big, batch_size=64), val=[(torch.zeros(4, 1, 16, 16),
                                                                     torch.zeros(4, dtype=torch.long))],
                         loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                         metric=lambda m, v: 50.0)


def test_a_large_task_from_python_without_chosen_schedules_stops_and_says_what_the_default_would_see(tmp_path):
    from hetprune.harness.testing import tiny_model

    with pytest.raises(HetpruneError) as caught:
        hetprune.prune(tiny_model(), _big_task(20_000), "act-only", 1, progress=False, log=lambda m: None)
    text = str(caught.value)
    assert "the fine-tune would see 300 of 20,000 training images (3 epochs, 900 image passes)" in text
    # 20,000 images is a small folder's size: the config made for it, not the ImageNet recipes (from Python, config=)
    assert "config=small-folder" in text and "deit-b-paper" not in text and "--" not in text


CHOSEN_FINETUNES = {"finetune": {"subset": None, "epochs": 1}, "short_finetune": {"subset": None, "epochs": 1}}


def test_hand_chosen_fine_tunes_with_the_toy_scoring_subset_stop_and_say_what_the_scorers_would_read():
    from hetprune.harness.testing import tiny_model

    with pytest.raises(HetpruneError) as caught:   # the fine-tunes are chosen; the gate phase's 300 images not
        hetprune.prune(tiny_model(), _big_task(20_000), "act-only", 1, settings=dict(CHOSEN_FINETUNES),
                       progress=False, log=lambda m: None)
    text = str(caught.value)
    assert "the scorer 'gate-taylor' would train on 300 of 20,000 training images" in text
    assert "scoring.subset setting" in text and "a one-shot scorer (scorer=taylor)" in text
    assert "config=small-folder" in text


@pytest.mark.parametrize("scorer", ["taylor", "magnitude", "loss-drop"])
def test_a_one_shot_scorer_reads_its_batches_whatever_the_subset_and_passes_the_start(scorer):
    from hetprune.pruning.run_start import start_run
    from hetprune.pruning.budget import Budget
    from hetprune.harness.testing import tiny_model

    start = start_run(["act-only"], [Budget(sites=1)], settings=dict(CHOSEN_FINETUNES), overrides={"scorer": scorer})
    assert not start.scoring_chosen
    start.attach(tiny_model(), _big_task(20_000), log=lambda m: None, measure=False)


@pytest.mark.parametrize("trains", [True, False])
def test_an_outside_scorer_that_trains_on_the_subset_says_so_and_gets_the_stop(monkeypatch, trains):
    from conftest import PluginOf
    from hetprune.core import plugins
    from hetprune.pruning.run_start import start_run
    from hetprune.pruning.budget import Budget
    from hetprune.harness.testing import tiny_model

    class Learner:
        name = "learner"
        trains_on_scoring_subset = trains

        def score(self, model, sites, ctx):
            return {s: 0.0 for s in sites}

    monkeypatch.setattr(plugins, "_extra_objects", [])
    hetprune.register_plugin(PluginOf("register_scorers", Learner), name="learner-plugin")
    try:
        start = start_run(["act-only"], [Budget(sites=1)], settings=dict(CHOSEN_FINETUNES),
                          overrides={"scorer": "learner"})
        if trains:
            with pytest.raises(HetpruneError, match="the scorer 'learner' would train on 300 of 20,000"):
                start.attach(tiny_model(), _big_task(20_000), log=lambda m: None, measure=False)
        else:
            start.attach(tiny_model(), _big_task(20_000), log=lambda m: None, measure=False)
    finally:
        plugins.reset()


@pytest.mark.parametrize("scoring", [{"subset": None}, {"subset": 300}])
def test_a_scoring_subset_the_caller_set_is_their_choice_and_passes_the_start(scoring):
    from hetprune.pruning.run_start import start_run
    from hetprune.pruning.budget import Budget
    from hetprune.harness.testing import tiny_model

    start = start_run(["act-only"], [Budget(sites=1)], settings={**CHOSEN_FINETUNES, "scoring": scoring})
    assert start.scoring_chosen   # 300 given explicitly counts as chosen, as null does
    start.attach(tiny_model(), _big_task(20_000), log=lambda m: None, measure=False)


def test_the_scoring_subset_stop_spares_tasks_at_most_ten_times_the_subset():
    from hetprune.pruning.run_start import start_run
    from hetprune.pruning.budget import Budget
    from hetprune.harness.testing import tiny_model

    start = start_run(["act-only"], [Budget(sites=1)], settings=dict(CHOSEN_FINETUNES))
    assert not start.scoring_chosen
    start.attach(tiny_model(), _big_task(3_000), log=lambda m: None, measure=False)   # 10 x 300: not far larger
    with pytest.raises(HetpruneError, match="would train on 300 of 3,001"):
        start.attach(tiny_model(), _big_task(3_001), log=lambda m: None, measure=False)


def test_the_shipped_configs_resolve_and_say_where_each_value_came_from():
    from hetprune.core import config
    from hetprune.core import loader
    from hetprune.core.plugins import get_registry

    hetdpt = get_registry().build("strategy", "hetdpt")
    paper = loader.resolve(hetdpt, "deit-b-paper")
    ft = config.RunSettings.of(paper).schedule("finetune")
    assert (ft.epochs, ft.batch_size, ft.lr, ft.lr_scale, ft.weight_decay, ft.warmup_epochs) == \
        (400, 4096, 5e-5, "linear", 0.08, 10)
    assert (ft.warmup_lr, ft.min_lr, ft.kd, ft.kd_alpha, ft.kd_token, ft.teacher) == \
        (1e-6, 1e-5, "hard", 0.5, True, "deit_base_patch16_224")
    assert (ft.mixup, ft.cutmix, ft.label_smoothing, ft.drop_path, ft.ema_decay, ft.repeats, ft.keep) == \
        (0.8, 1.0, 0.1, 0.1, 0.99996, 3, "best")
    assert paper["augment"] == "paper" and paper["hetdpt"]["predictor"] == "poly"
    for name in loader.shipped_configs():   # every value line of a shipped config says where it came from
        text = (loader.SHIPPED_CONFIGS / f"{name}.yaml").read_text().splitlines()
        assert text[0].startswith("#"), name
    for line in (loader.SHIPPED_CONFIGS / "deit-b-paper.yaml").read_text().splitlines():
        if ":" in line and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line, f"deit-b-paper.yaml: say where this value came from: {line}"
    # a shipped config's hetdpt section does not stop a strategy without one
    assert "hetdpt" not in loader.resolve(get_registry().build("strategy", "mix50"), "quick")
