"""Issue 69: your own folder, end to end. From a folder of grayscale PNGs and a timm model name to a compare table
with the README's commands: the dense base made by hetprune (keyed, reused, refused on a resume when what shapes
it changed), pretrained weights from a local file fine-tuned with a new head, channels read from the model, the
small-folder config with schedules sized by the folder's image count."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hetprune import HetpruneError
from hetprune.cli import main
from hetprune.core import config
from hetprune.core import loader
from hetprune.core.io import cache_dir, load_weights
from hetprune.model.spec import ModelSpec, build, build_with_weights
from hetprune.training.data import load_data

GRAY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=3, embed_dim=32, depth=2, num_heads=2, init_values=0.1)
MODEL = ["--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(GRAY)]
# the small-folder config with every schedule cut to one short epoch (an epochs setting replaces the passes)
SMALL = ["--config", "small-folder", "--scorer", "magnitude", "--workers", "0",
         *[item for section in ("finetune", "short_finetune", "base_scratch", "base_finetune")
           for item in ("--set", f"{section}.epochs=1", "--set", f"{section}.batch_size=8")],
         "--set", "scoring.batches=1", "--set", "scoring.batch_size=8"]
COMPARE = ["compare", "--strategies", "mix50,act-only", "--budgets", "1", "--speed-budget", "0", "--batch-sizes",
           "1,2"]


def _folder(root: Path, mode: str, size: int = 20) -> Path:
    """PNG files in ROOT/{train,val}/<class>/: three classes of strokes (a bar, a cross, a frame) in ``mode``."""
    from PIL import Image, ImageDraw

    gen = torch.Generator().manual_seed(1)
    for split, n in (("train", 12), ("val", 4)):
        for label in ("bar", "cross", "frame"):
            (root / split / label).mkdir(parents=True)
            for i in range(n):
                img = Image.new("L", (size, size), int(torch.randint(0, 40, (1,), generator=gen)))
                draw = ImageDraw.Draw(img)
                k = int(torch.randint(3, 7, (1,), generator=gen))
                if label in ("bar", "cross"):
                    draw.line((k, size // 2, size - k, size // 2), fill=230, width=2)
                if label == "cross":
                    draw.line((size // 2, k, size // 2, size - k), fill=230, width=2)
                if label == "frame":
                    draw.rectangle((k, k, size - k, size - k), outline=230, width=2)
                img.convert(mode).save(root / split / label / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def gray_folder(tmp_path_factory):
    return _folder(tmp_path_factory.mktemp("gray"), "L")


@pytest.fixture(scope="module")
def rgb_folder(tmp_path_factory):
    return _folder(tmp_path_factory.mktemp("rgb"), "RGB")


def _bases() -> list[Path]:
    return sorted((cache_dir() / "base").glob("*/model.safetensors"))


# -- the dense base made by hetprune ---------------------------------------------------------------------------

def test_a_grayscale_folder_and_a_timm_name_give_a_compare_table_with_a_base_hetprune_made(gray_folder, tmp_path,
                                                                                           capsys):
    out = tmp_path / "compare"
    args = [*COMPARE, *MODEL, "--data", str(gray_folder), *SMALL, "--base", "scratch"]
    assert main([*args, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "base model: training it from random weights on" in said and "base model: val top-1" in said
    assert "are read as" not in said   # grayscale files for a one-channel model: nothing converted, nothing said
    assert "cpu: 1 torch thread(s) per row (" in said   # the threads a row trains with, said
    results = json.loads((out / "results.json").read_text())
    assert {r["strategy"] for r in results["rows"]} == {"mix50", "act-only"}
    assert results["meta"]["base"]["source"] == "base made by hetprune (trained from random weights)"
    # rows are labelled with what the model was built with, not only its timm name (patch 16 of a patch-4 model)
    assert "vit_tiny_patch16_224 (img_size=16, patch_size=4, in_chans=1" in (out / "results.md").read_text()
    [stored] = _bases()
    meta = json.loads((stored.parent / "meta.json").read_text())
    assert meta["mode"] == "scratch" and meta["inputs"]["base_scratch.epochs"] == 1
    assert meta["data"]["train"] + meta["data"]["selection"] == 36 and 0 <= meta["val_top1"] <= 100
    assert not (stored.parent / "work").exists()   # the base's checkpoint, hetprune's own, is gone once it is made
    weights = load_weights(stored)

    # a second run reads it (another output folder, another seed: the base does not depend on the run's seed)
    assert main([*args, "--seeds", "1", "--out", str(tmp_path / "again")]) == 0
    said = capsys.readouterr().out
    assert "training it" not in said and f"read from {stored.parent}" in said and _bases() == [stored]
    rows = [json.loads(line) for line in (tmp_path / "again" / "rows.jsonl").read_text().splitlines()]
    assert rows and all(r["seed"] == 1 for r in rows)
    assert all(torch.equal(weights[k], v) for k, v in load_weights(stored).items())

    # a setting that shapes no base (its loader workers) changes nothing: the resumed compare reuses every row
    assert main([*args, "--set", "base_scratch.workers=1", "--resume", "--out", str(out)]) == 0
    assert capsys.readouterr().out.count(": reused, finished") == 2
    # one that shapes it is refused on a resume, naming what changed, before anything trains
    assert main([*args, "--set", "base_scratch.lr=0.002", "--resume", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds results made from another base model" in err and "base_scratch.lr 0.001 -> 0.002" in err
    assert _bases() == [stored]
    # without --resume it is another base, in a new folder: trained, stored beside the first
    assert main([*args, "--set", "base_scratch.lr=0.002", "--out", str(tmp_path / "other")]) == 0
    assert len(_bases()) == 2


def test_a_plan_counts_the_base_and_its_run_follows_in_the_same_folder(gray_folder, tmp_path, capsys):
    out = tmp_path / "compare"
    args = [*COMPARE, *MODEL, "--data", str(gray_folder), *SMALL, "--base", "scratch", "--out", str(out)]
    assert main([*args, "--set", "base_scratch.epochs=3", "--plan", "--plan-probe", "0"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("base: train from scratch"))
    # 36 training images less a tenth held out as the selection split: 33 a base epoch, 3 epochs, kept best
    assert "3 epochs x 33 images" in row and " 1 " in row and "99" in row.split()
    plan = json.loads((out / "work" / "plan.json").read_text())
    base = plan["steps"][0]
    assert base["train_images"] == 99 and base["eval_images"] == 3 * 3 + 12 + 3   # 3 best-epoch evals, val, selection
    run = sum(s["train_images"] for s in plan["steps"][1:-1])
    chosen = sum(s["train_images"] for s in plan["steps"] if "stage 1:" in s["stage"])
    assert plan["map_share"] == (chosen / run if chosen else None)   # the base is not the pruning run's
    assert _bases() == []   # a plan trains nothing
    # the run that follows the plan starts in the same folder, without --resume or --overwrite
    assert main([*args, "--set", "base_scratch.epochs=3"]) == 0
    assert len(_bases()) == 1
    # once stored, the plan's base row costs nothing
    assert main([*args, "--set", "base_scratch.epochs=3", "--plan", "--plan-probe", "0", "--overwrite"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("base: train from scratch"))
    assert "stored:" in row and row.split()[-3:] == ["0", "0", "0"]


def test_an_interrupted_base_continues_where_it_stopped_and_ends_as_the_uninterrupted_one(gray_folder, tmp_path,
                                                                                          monkeypatch):
    from hetprune.training import base_stage

    spec = ModelSpec("vit_tiny_patch16_224", GRAY)

    def made(interrupt: bool) -> dict:
        torch.manual_seed(0)
        model = build(spec)
        data = load_data(str(gray_folder), model, augment="crop", workers=0)
        cfg = config.TrainConfig(epochs=3, lr=1e-3, batch_size=8, kd="none", subset=None, warmup_epochs=1)
        request = base_stage.request_for("scratch", spec, model, "random weights", data, cfg)
        lines: list[str] = []
        if interrupt:
            real = base_stage.train

            def stopped(*args, **kwargs):
                def stop(epoch, metrics):
                    if epoch == 1:
                        raise KeyboardInterrupt
                return real(*args, **kwargs, on_epoch_end=stop)

            monkeypatch.setattr(base_stage, "train", stopped)
            with pytest.raises(KeyboardInterrupt):
                base_stage.make_base(model, data, request, log=lines.append, progress=False)
            monkeypatch.setattr(base_stage, "train", real)
            assert (request.folder() / "work" / "finetune-checkpoint.pt").is_file() and not _bases()
            torch.manual_seed(0)
            model = build(spec)
        base_stage.make_base(model, data, request, log=lines.append, progress=False)
        return {"weights": model.state_dict(), "lines": lines, "folder": request.folder()}

    interrupted = made(True)
    assert any("resume: base model continues after epoch 1 of 3" in line for line in interrupted["lines"])
    import shutil

    shutil.rmtree(interrupted["folder"])
    whole = made(False)
    assert not any("resume:" in line for line in whole["lines"])
    assert all(torch.equal(whole["weights"][k], v) for k, v in interrupted["weights"].items())


def test_pretrained_weights_from_a_local_file_get_a_new_head_and_are_fine_tuned_as_the_base(gray_folder, tmp_path,
                                                                                           capsys):
    """The hub cannot be reached here: a local file stands in for it, read as timm reads pretrained weights (the
    users who downloaded weights do the same with --pretrained FILE)."""
    from safetensors.torch import save_file

    torch.manual_seed(5)
    imagenet_like = build(ModelSpec("vit_tiny_patch16_224", {**GRAY, "in_chans": 3, "num_classes": 7}))
    file = tmp_path / "pretrained.safetensors"
    save_file({k: v.contiguous() for k, v in imagenet_like.state_dict().items()}, str(file))

    loaded = build(ModelSpec("vit_tiny_patch16_224", GRAY), pretrained=str(file))
    own = imagenet_like.state_dict()
    assert loaded.head.weight.shape == (3, 32)   # a new head for the folder's 3 classes
    assert torch.equal(loaded.blocks[1].mlp.fc2.weight, own["blocks.1.mlp.fc2.weight"])
    # the RGB patch embedding summed over its channels for the one-channel model, as timm adapts it
    assert torch.allclose(loaded.patch_embed.proj.weight[:, 0], own["patch_embed.proj.weight"].sum(1))
    # a file that would leave weights random, or holds others, is refused, never a half-pretrained model
    deeper = tmp_path / "deeper.safetensors"
    save_file({k: v.contiguous() for k, v in build(ModelSpec("vit_tiny_patch16_224", {**GRAY, "depth": 1}))
               .state_dict().items()}, str(deeper))
    with pytest.raises(HetpruneError, match="lacks .* of the model's weights .*blocks.1"):
        build(ModelSpec("vit_tiny_patch16_224", GRAY), pretrained=str(deeper))

    out = tmp_path / "pruned"
    assert main(["prune", "--strategy", "act-only", "--budget", "1", *MODEL, "--pretrained", str(file),
                 "--data", str(gray_folder), *SMALL, "--base", "finetune", "--out", str(out)]) == 0
    assert "base model: fine-tuning the pretrained weights on 33 images, 1 epochs" in capsys.readouterr().out
    [stored] = _bases()
    meta = json.loads((stored.parent / "meta.json").read_text())
    assert meta["mode"] == "finetune" and meta["source"].startswith(f"pretrained file {file} (sha256 ")
    assert meta["inputs"]["base_finetune.lr"] == 1e-4   # the config's gentler rate for pretrained weights
    report = json.loads((out / "report.json").read_text())
    assert report["base_weights"]["base"]["mode"] == "finetune"
    assert "fine-tuned from pretrained file" in report["base_weights"]["source"]


def test_a_base_is_refused_where_its_mode_does_not_fit_the_weights(gray_folder, tmp_path, capsys):
    common = ["prune", "--strategy", "act-only", "--budget", "1", "--data", str(gray_folder), *SMALL,
              "--out", str(tmp_path / "o")]
    assert main([*common, *MODEL, "--base", "finetune"]) == 2
    assert "--base finetune fine-tunes pretrained weights: give --pretrained" in capsys.readouterr().err
    ckpt = tmp_path / "c.safetensors"
    from hetprune.core.io import save_weights

    save_weights(ckpt, build(ModelSpec("vit_tiny_patch16_224", GRAY)))
    assert main([*common, *MODEL, "--checkpoint", str(ckpt), "--base", "scratch"]) == 2
    assert "--base scratch trains the model from random weights, but it was given weights" in capsys.readouterr().err
    assert main([*common, "--base", "scratch"]) == 2
    assert "--base scratch makes the base of --model NAME" in capsys.readouterr().err
    assert _bases() == []


def test_a_checkpoint_whose_head_differs_says_num_classes(tmp_path):
    from hetprune.core.io import save_weights

    ckpt = tmp_path / "ten.safetensors"
    save_weights(ckpt, build(ModelSpec("vit_tiny_patch16_224", {**GRAY, "num_classes": 10})))
    with pytest.raises(HetpruneError) as caught:
        build_with_weights(ModelSpec("vit_tiny_patch16_224", GRAY), checkpoint=str(ckpt))
    said = str(caught.value)
    assert "its head has 10 classes and the model 3" in said and '"num_classes": 10' in said
    assert "--pretrained FILE" in said and "in_chans" not in said and "position embedding" not in said


# -- channels from the model -----------------------------------------------------------------------------------

@pytest.mark.parametrize("chans", [1, 3])
@pytest.mark.parametrize("files", ["gray", "rgb"])
def test_the_model_s_channels_say_how_a_folder_is_read(chans, files, gray_folder, rgb_folder):
    from hetprune.training.image_folders import channels_note

    folder = gray_folder if files == "gray" else rgb_folder
    model = build(ModelSpec("vit_tiny_patch16_224", {**GRAY, "in_chans": chans}))
    for augment in ("crop", "paper"):   # timm's transforms and RandAugment on L images too
        data = load_data(str(folder), model, augment=augment, workers=0)
        for split in (data.train, data.val, data.selection):
            assert split[0][0].shape == (chans, 16, 16)
        assert data.in_chans == chans
        with torch.no_grad():
            model(torch.stack([data.train[i][0] for i in range(2)]))
    # the same image, read for either model, is the same picture: L is RGB's luminance
    gray = load_data(str(folder), build(ModelSpec("vit_tiny_patch16_224", GRAY)), augment="none", workers=0)
    rgb = load_data(str(folder), build(ModelSpec("vit_tiny_patch16_224", {**GRAY, "in_chans": 3})), augment="none",
                    workers=0)
    assert torch.allclose(gray.val[0][0][0], rgb.val[0][0].mean(0), atol=0.02)
    note = channels_note(folder, "L" if chans == 1 else "RGB")
    converted = (files, chans) in (("gray", 3), ("rgb", 1))
    assert (note is not None) == converted
    if converted:
        assert ("read as grayscale" if chans == 1 else "are read as RGB") in note


def test_a_model_whose_channels_no_image_file_has_is_refused_before_anything_trains(gray_folder, tmp_path, capsys):
    four = {**GRAY, "in_chans": 4}
    with pytest.raises(HetpruneError, match="takes 4 input channels .*in_chans=1 or in_chans=3"):
        load_data(str(gray_folder), build(ModelSpec("vit_tiny_patch16_224", four)), workers=0)
    assert main(["prune", "--strategy", "act-only", "--budget", "1", "--model", "vit_tiny_patch16_224",
                 "--model-kwargs", json.dumps(four), "--data", str(gray_folder), *SMALL, "--base", "scratch",
                 "--out", str(tmp_path / "o")]) == 2
    assert "the model takes 4 input channels (in_chans=4)" in capsys.readouterr().err and _bases() == []


def test_an_rgb_model_on_a_grayscale_folder_says_so_in_a_line(gray_folder, tmp_path, capsys):
    rgb = {**GRAY, "in_chans": 3}
    main(["prune", "--strategy", "act-only", "--budget", "1", "--model", "vit_tiny_patch16_224", "--model-kwargs",
          json.dumps(rgb), "--data", str(gray_folder), *SMALL, "--base", "scratch", "--plan", "--plan-probe", "0",
          "--out", str(tmp_path / "o")])
    assert "the grayscale (L) images in" in capsys.readouterr().out


# -- the small-folder config and schedules sized by the folder ---------------------------------------------------

def test_image_passes_size_the_epochs_from_the_folder_and_a_later_epochs_replaces_them():
    settings = loader.resolve(config_file="small-folder").as_settings()
    assert settings["finetune"]["image_passes"] == 50_000 and settings["augment"] == "crop"
    typed = loader.resolve(config_file="small-folder")
    for n in (900, 5_000, 60_000):
        sized = typed.sized(n).run
        assert sized.finetune.epochs == max(1, math.ceil(50_000 / n))
        assert sized.base_scratch.epochs == max(1, math.ceil(100_000 / n))
    # a subset is what an epoch sees
    subset = loader.resolve(sets=["finetune.image_passes=1000", "finetune.subset=300"])
    assert subset.sized(5_000).run.finetune.epochs == 4
    # an epochs given after the passes replaces them; both in one layer are refused
    later = loader.resolve(config_file="small-folder", sets=["finetune.epochs=20"])
    assert later.run.finetune.epochs == 20 and "image_passes" not in later.as_settings()["finetune"]
    assert later.sized(5_000).run.finetune.epochs == 20
    with pytest.raises(HetpruneError, match="gives finetune.epochs and finetune.image_passes"):
        loader.resolve(sets=["finetune.epochs=2", "finetune.image_passes=100"])
    with pytest.raises(HetpruneError, match="finetune.image_passes sizes the epochs from the training set's size"):
        loader.resolve(sets=["finetune.image_passes=100"]).sized(None)
    # the small-folder config has no teacher from the hub and no flips
    run = typed.run
    assert all(not run.schedule(s).teacher and not run.schedule(s).teacher_pretrained
               for s in ("finetune", "short_finetune"))
    assert config.AUGMENTATIONS["crop"].hflip == 0 and config.AUGMENTATIONS["light"].hflip > 0


def test_the_run_says_what_the_passes_became_and_keys_the_epochs(gray_folder, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["prune", "--strategy", "act-only", "--budget", "1", *MODEL, "--data", str(gray_folder),
                 "--config", "small-folder", "--scorer", "magnitude", "--workers", "0",
                 "--set", "finetune.image_passes=70", "--set", "short_finetune.epochs=1",
                 "--set", "scoring.batches=1", "--out", str(out)]) == 0
    assert "finetune: 70 image passes = 3 epoch(s) of 33 images" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["finetune"]["epochs"] == 3 and len(report["finetune_history"]) == 3


def test_crop_does_not_flip_and_the_first_line_says_light_does(gray_folder):
    from argparse import Namespace

    from hetprune.cli.commands.common import data_line
    from hetprune.training.image_folders import train_transform

    cfg = {"input_size": (1, 16, 16), "interpolation": "bicubic", "mean": (0.5,), "std": (0.5,), "crop_pct": 0.9,
           "crop_mode": "center"}
    assert "Flip" not in repr(train_transform(cfg, "crop")) and "Flip" in repr(train_transform(cfg, "light"))
    line = data_line(Namespace(data=str(gray_folder), augment=None), "compare")
    assert "--augment light: it flips images horizontally, wrong for digits and text (--augment crop" in line
    assert "flips" not in data_line(Namespace(data=str(gray_folder), augment="crop"), "compare")


def test_a_large_training_set_without_schedules_is_stopped_naming_the_imagenet_recipes():
    from torch.utils.data import DataLoader, TensorDataset

    import hetprune
    from hetprune.pruning.run_start import check_schedules_fit

    n = 200_000
    big = TensorDataset(torch.zeros(n, 1, 16, 16), torch.zeros(n, dtype=torch.long))
    task = hetprune.Task(train=DataLoader(big, batch_size=64), val=[(torch.zeros(4, 1, 16, 16),
                                                                     torch.zeros(4, dtype=torch.long))],
                         loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                         metric=lambda m, v: 50.0)
    with pytest.raises(HetpruneError) as caught:
        check_schedules_fit(task, config.RunSettings.of(loader.resolve()))
    said = str(caught.value)
    assert "config=deit-b-paper | config=deit-s-paper | config=quick" in said and "small-folder" not in said


def test_a_small_folder_without_schedules_is_stopped_naming_small_folder(gray_folder, tmp_path, capsys):
    assert main(["prune", "--strategy", "act-only", "--budget", "1", *MODEL, "--data", str(gray_folder),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--config small-folder" in err and "deit-b-paper" not in err


# -- the smaller items -------------------------------------------------------------------------------------------

def test_the_time_left_counts_the_rows_running_and_the_lanes_free():
    from hetprune.harness.compare.rows import time_left

    # 4 rows of 60 s, 2 at a time: the first two end at 60 and the last two start then: 60 s left, not 2 x 60 / 2
    assert time_left([(60.0, 60.0), (60.0, 60.0)], [], 2, now=60.0) == 60.0
    # 3 rows: one ended at 60, one ran since 0 (about done), the third started at 60: a whole row left
    assert time_left([(0.0, 60.0), (60.0, 60.0)], [], 2, now=60.0) == 60.0
    # two queued behind them take the lanes as they free up
    assert time_left([(0.0, 60.0), (60.0, 60.0)], [60.0, 60.0], 2, now=60.0) == 120.0
    # one at a time, 3 queued behind the one running for 20 s of its 60: 40 + 3 x 60
    assert time_left([(0.0, 60.0)], [60.0] * 3, 1, now=20.0) == 220.0
    # a hetdpt row is not a baseline's: one of 600 s running since 0, at 194 s, is 406 s from its end
    assert time_left([(0.0, 600.0)], [], 2, now=194.0) == 406.0


def test_the_time_left_is_counted_in_each_row_s_planned_work(tmp_path, capsys):
    """Under --jobs the time left said "about 2s left" with a whole row to run; each row's work is what its
    strategy plans (a row refused at once, unreachable, does no work and gives no rate)."""
    assert main(["compare", "--data", "digits", "--strategies", "act-only,mix50,attn-only", "--budgets", "1",
                 "--scorer", "magnitude", "--set", "finetune.epochs=1", "--set", "finetune.subset=32",
                 "--set", "scoring.batches=1", "--speed-budget", "0", "--batch-sizes", "1,2",
                 "--out", str(tmp_path / "c")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[") and " in " in line]
    assert len(lines) == 3 and "left" not in lines[-1]
    assert all("; about " in line and line.endswith(" left") for line in lines[:2])


def test_a_row_trains_with_the_threads_its_cores_leave_after_its_loader_workers(monkeypatch):
    from hetprune.training import loaders

    monkeypatch.setattr(loaders, "available_cpus", lambda: 8)
    monkeypatch.setattr(loaders, "busy_elsewhere", lambda: 0)
    assert loaders.row_threads(1, 0) == 8 and loaders.row_threads(1, 1) == 7 and loaders.row_threads(2, 1) == 3
    assert loaders.row_threads(4, 3) == 1 and loaders.row_threads(16, 0) == 1
    # cores other programs keep busy are not a row's: 2 of 8 busy, 2 rows of 1 loader worker each: 2 threads
    assert loaders.row_threads(2, 1, busy=2) == 2 and loaders.row_threads(1, 0, busy=8) == 1
    lines: list[str] = []
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        with loaders.row_threading(torch.device("cpu"), 2, 2, lines.append) as threads:
            assert threads == torch.get_num_threads() == 2   # 8 CPUs / 2 rows - 2 workers
        assert torch.get_num_threads() == 4   # put back for timing, which wants them all
        with loaders.row_threading(torch.device("cpu"), 1, 0, lines.append) as threads:
            assert threads == 4   # never more than the process had
    finally:
        torch.set_num_threads(before)
    assert lines[0] == ("cpu: 2 torch thread(s) per row (8 CPUs, 0 kept busy by other programs, 2 row(s) at a time, "
                        "2 loader worker(s) each)")


# -- the guide is the benchmark's run -----------------------------------------------------------------------------

def test_the_guide_runs_the_benchmark_s_commands_and_quotes_its_transcript():
    """Issue 69, item 4: the guide's transcript is made by benchmarks/own_folder.py on a folder it generates; the
    commands the guide prints are the ones the benchmark ran, and every line it quotes is in the results file."""
    import re
    import shlex

    from benchmark_scripts import script

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "guides" / "own-folder.md").read_text(encoding="utf-8")
    guide = page.split("## 4. Plan")[1].split("## The base hetprune makes")[0]   # the plan and the run
    blocks = re.findall(r"```bash\n(hetprune compare .*?)```", guide, flags=re.S)
    printed = [shlex.split(block.replace("\\\n", " ")) for block in blocks]
    assert printed == script("own_folder").commands("digits-folder")
    results = (root / "benchmarks" / "results" / "own-folder.md").read_text(encoding="utf-8")
    ran = json.loads((root / "benchmarks" / "results" / "own-folder.json").read_text(encoding="utf-8"))["steps"]
    assert [step["command"] for step in ran] == [shlex.join(command) for command in printed]
    quoted = re.findall(r"```text\n(.*?)```", guide, flags=re.S)
    assert len(quoted) >= 2
    lines = [line for block in quoted for line in block.splitlines()
             if line.strip() and not line.startswith("$ ")]   # the command a transcript starts with, shortened
    missing = [line for line in lines if line not in results]
    assert not missing, f"the guide quotes lines the benchmark's transcript does not hold: {missing[:3]}"
