"""Issue 57, part 4: a loader that keeps a GPU fed. hetprune's image reader (the crop drawn before decoding,
JPEG draft mode, torch's resize, RandAugment's shears and translations by rows, one-step normalisation)
against timm's pixels; per-item seeding across worker counts; default_workers without a cap; and the
benchmark that measures it all."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from benchmark_scripts import script
from hetprune import HetpruneError
from hetprune.training import images
from hetprune.training.image_folders import READERS, image_folder, read_image, train_reading
from hetprune.training.loaders import close_loaders, default_workers, loader, seed_cpu

CFG = dict(input_size=(3, 224, 224), interpolation="bicubic", mean=(0.485, 0.456, 0.406),
           std=(0.229, 0.224, 0.225), crop_pct=0.875, crop_mode="center")


def benchmark():
    return script("loader_throughput")


@pytest.fixture(scope="module")
def bench():
    return benchmark()


@pytest.fixture(scope="module")
def photos(tmp_path_factory, bench):
    """Two photographic JPEGs: ImageNet's size, and a large one whose big crops decode reduced."""
    root = tmp_path_factory.mktemp("photos")
    out = {}
    for name, size in (("imagenet", (500, 375)), ("large", (1200, 900))):
        (root / f"{name}.jpg").write_bytes(bench.photo(7, size, 90))
        out[name] = str(root / f"{name}.jpg")
    return out


def levels(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute difference of two normalised images, in 8-bit levels."""
    return float((a - b).abs().mean() * 0.226 * 255)


def pixels(img: Image.Image) -> np.ndarray:
    return np.asarray(img, dtype=np.int16)


# -- the decode: draft mode where the crop allows ---------------------------------------------------------

def test_a_big_crop_is_decoded_reduced_and_resized_to_nearly_the_full_decodes_pixels(photos):
    box = (100, 150, 700, 900)   # top, left, height, width: at least twice 224 on both sides
    reduced, scaled = images.decode_for_crop(images.open_image(photos["large"]), box, (224, 224))
    assert reduced.size == (600, 450) and scaled == (50, 75, 350, 450)   # decoded at half size
    odd = images.decode_for_crop(images.open_image(photos["large"]), (101, 151, 701, 901), (224, 224))[1]
    assert odd == (50.5, 75.5, 350.5, 450.5)   # the very crop, in the reduced image's pixels
    full, same = images.decode_for_crop(read_image(photos["large"]), box, (224, 224))
    assert full.size == (1200, 900) and same == box   # an image already decoded is used as it is
    drafted = pixels(images.resize_crop(reduced, scaled, (224, 224), "bicubic"))
    exact = pixels(images.resize_crop(full, box, (224, 224), "bicubic"))
    # libjpeg's DCT scaling is another low-pass than the resize's: within 1 % of the range on this grainy photo
    # (1.9 levels; a smooth one 0.8; a box reduction by 2 before the resize alone 1.2)
    assert 0 < np.abs(drafted - exact).mean() < 2.5
    # a crop under twice 1.5x the output size is decoded whole
    whole, kept = images.decode_for_crop(images.open_image(photos["large"]), (0, 0, 660, 900), (224, 224))
    assert whole.size == (1200, 900) and kept == (0, 0, 660, 900)


def test_the_draft_crop_draws_as_timms_crop_and_gives_nearly_its_pixels(photos):
    """The same boxes as timm's crop for the same draws; where the file was decoded reduced, the picture
    differs from timm's by no more than timm's own bilinear differs from its bicubic (libjpeg's DCT scaling
    is another low-pass): on this grainy photo about 1.9 levels against 2.0-2.5."""
    from timm.data.transforms import RandomResizedCropAndInterpolation

    timm_crop = RandomResizedCropAndInterpolation(224, interpolation="bicubic")
    ours = images.DraftResizedCrop(RandomResizedCropAndInterpolation(224, interpolation="bicubic"))
    bilinear = RandomResizedCropAndInterpolation(224, interpolation="bilinear")
    gaps = {True: [], False: []}
    for seed in range(24):
        seed_cpu(seed)
        _, _, h, w = timm_crop.get_params(read_image(photos["large"]), timm_crop.scale, timm_crop.ratio)
        seed_cpu(seed)
        expected = pixels(timm_crop(read_image(photos["large"])))
        seed_cpu(seed)
        got = pixels(ours(images.open_image(photos["large"])))
        seed_cpu(seed)
        other_filter = pixels(bilinear(read_image(photos["large"])))
        gap = np.abs(got - expected).mean()
        gaps[h >= 2 * 336 and w >= 2 * 336].append(gap)   # 1.5x the output at half size
        assert gap < 1.2 * max(np.abs(other_filter - expected).mean(), 0.1), seed
    assert len(gaps[True]) >= 3 and max(gaps[False]) < 0.1   # reduced: another low-pass; whole: the same


# -- the whole transform against timm's -------------------------------------------------------------------

@pytest.mark.parametrize("augment", ["paper", "light", "imagenet"])
def test_hetprunes_reader_gives_timms_pictures_for_the_same_draws(photos, augment):
    fast, read = train_reading(CFG, augment)
    timm_transform, timm_read = train_reading(CFG, augment, reader="timm")
    assert read is images.open_image and timm_read is read_image
    assert "DraftResizedCrop" in repr(fast) and "DraftResizedCrop" not in repr(timm_transform)
    for seed in range(12):
        seed_cpu(seed)
        expected = timm_transform(timm_read(photos["imagenet"]))
        seed_cpu(seed)
        got = fast(read(photos["imagenet"]))
        assert got.shape == expected.shape == (3, 224, 224)
        assert levels(got, expected) < 1.0, seed   # resampling rounding, not another picture


def test_the_none_augmentation_keeps_timms_reader():
    transform, read = train_reading(CFG, "none")
    assert read is read_image and "DraftResizedCrop" not in repr(transform)
    with pytest.raises(HetpruneError, match="reader is one of hetprune, timm, not 'pil'"):
        train_reading(CFG, "light", reader="pil")
    assert READERS == ("hetprune", "timm")


def test_the_one_step_tensor_is_bit_identical_to_totensor_then_normalize(photos):
    from torchvision import transforms as T

    img = read_image(photos["imagenet"])
    reference = T.Normalize(CFG["mean"], CFG["std"])(T.ToTensor()(img))
    assert torch.equal(images.NormalizedTensor(CFG["mean"], CFG["std"])(img), reference)
    assert torch.equal(images.planes(img), torch.from_numpy(np.array(img)).permute(2, 0, 1))


@pytest.mark.parametrize("name,level", [("ShearX", 0.27), ("ShearX", -0.3), ("ShearY", 0.21), ("ShearY", -0.12),
                                        ("TranslateXRel", 0.31), ("TranslateXRel", -0.07),
                                        ("TranslateYRel", -0.4), ("TranslateYRel", 0.18)])
def test_shears_and_translations_by_rows_match_pils_bicubic_affine(photos, name, level):
    from timm.data import auto_augment as aa

    img = read_image(photos["imagenet"]).resize((224, 224))
    kwargs = dict(fillcolor=(124, 116, 104), resample=Image.BICUBIC)
    expected = pixels(aa.NAME_TO_OP[name](img, level, **dict(kwargs)))
    got = pixels(images._row_ops()[name](img, level, **dict(kwargs)))
    diff = np.abs(got - expected)
    assert diff.max() <= 1 and diff.mean() < 0.01   # PIL's formula, float32 against its double
    # another interpolation is timm's own op, pixel for pixel
    bilinear = dict(kwargs, resample=Image.BILINEAR)
    assert np.array_equal(pixels(images._row_ops()[name](img, level, **dict(bilinear))),
                          pixels(aa.NAME_TO_OP[name](img, level, **dict(bilinear))))


def test_an_item_is_seeded_without_touching_torchs_device_generators(monkeypatch, photos):
    """torch.manual_seed queued a seed (and a stack trace) for every CUDA device on each item, and in the main
    process reseeded the GPU's generator, which the item's fork_rng does not put back."""
    from hetprune.training.image_folders import SeededItems

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return torch.rand(3)

    items = SeededItems(Files())
    first = items[0]

    def refuse(seed):
        raise AssertionError("torch.manual_seed called for an item")

    monkeypatch.setattr(torch, "manual_seed", refuse)
    before = torch.get_rng_state()
    assert torch.equal(items[0], first) and torch.equal(torch.get_rng_state(), before)


# -- seeded items across worker counts, on JPEGs through the new reader -----------------------------------

@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory, bench):
    root = tmp_path_factory.mktemp("jpegs")
    bench.make_folder(root, 12, (96, 72), 90)
    return root


def test_seeded_items_are_the_same_with_any_number_of_workers(jpeg_folder):
    from hetprune.model.spec import ModelSpec, build

    model = build(ModelSpec("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, num_classes=4, embed_dim=16,
                                                         depth=1, num_heads=1)))
    data = image_folder(jpeg_folder, model, augment="paper", workers=0, selection=0)
    assert data.train.dataset.loader is images.open_image
    try:
        epochs = {w: [b[0] for b in loader(data.train, 5, shuffle=True, seed=3, workers=w)] for w in (0, 1, 2)}
    finally:
        close_loaders()
    assert all(torch.equal(a, b) for w in (1, 2) for a, b in zip(epochs[0], epochs[w]))
    assert len(epochs[0]) == 3 and not torch.equal(epochs[0][0][0], epochs[0][0][1])
    timm_data = image_folder(jpeg_folder, model, augment="paper", workers=0, selection=0, reader="timm")
    assert timm_data.fingerprint != data.fingerprint   # pixels within a level of timm's are keyed apart


# -- default_workers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cpus,local,expected", [(64, None, 63), (64, "8", 7), (16, "1", 15), (2, None, 1),
                                                 (1, None, 1), (4, "8", 1)])
def test_default_workers_is_the_cpus_each_local_process_may_use_less_one_without_a_cap(monkeypatch, cpus, local,
                                                                                       expected):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    assert default_workers() == expected


# -- the benchmark ----------------------------------------------------------------------------------------

def test_the_benchmarks_rows_are_well_formed_on_a_tiny_folder(tmp_path, bench):
    folder, results = tmp_path / "imgs", tmp_path / "results"
    assert bench.main(["--images", str(folder), "--count", "8", "--size", "64x48", "--model",
                       "deit_tiny_patch16_224", "--workers", "0", "--seconds", "0.2", "--rounds", "1",
                       "--pipelines", "timm,hetprune-before,hetprune", "--results", str(results),
                       "--name", "tiny"]) == 0
    res = json.loads((results / "tiny.json").read_text())
    assert res["images"]["images"] == 8 and res["images"]["size"] == "64x48" and len(res["load_start"]) == 3
    assert {"cpu", "cores"} <= set(res["machine"]) and {"torch", "timm", "PIL", "libjpeg_turbo"} <= set(res["versions"])
    assert [(r["pipeline"], r["augment"], r["workers"]) for r in res["rows"]] == [
        (p, a, 0) for a in ("paper", "light") for p in ("timm", "hetprune-before", "hetprune")]
    for row in res["rows"]:
        assert row["images"] > 0 and row["seconds"] >= 0.2
        assert row["images_per_s"] == pytest.approx(row["images"] / row["seconds"], rel=0.01)
        assert row["images_per_s_per_worker"] == row["images_per_s"] and row["images_per_cpu_s"] > 0
    for augment in ("paper", "light"):
        s = res["summary"][augment]
        assert s["over_before"] > 0 and s["over_timm"] > 0 and s["cores_per_gpu"] >= 2
    page = (results / "tiny.md").read_text()
    assert "python benchmarks/loader_throughput.py --images" in page and "| hetprune | paper | 0 |" in page
    # the folder is reused as it is
    assert bench.make_folder(folder, 99, (10, 10), 90)["images"] == 8


def test_the_benchmark_refuses_a_folder_with_no_images(tmp_path, bench):
    (tmp_path / "imgs" / "train" / "class0").mkdir(parents=True)
    with pytest.raises(HetpruneError, match=r"no images to time in .*imgs/train"):
        bench.main(["--images", str(tmp_path / "imgs"), "--workers", "0", "--results", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()
    with pytest.raises(HetpruneError, match="bad options: pipelines \\['fast'\\]"):
        bench.main(["--pipelines", "fast", "--workers", "0"])
