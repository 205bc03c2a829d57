"""Image files into training tensors at less cost per core, drawing exactly as timm's transforms draw.

timm's training transform decodes a whole JPEG, crops and resizes it in PIL, runs RandAugment in PIL, then
makes a tensor and normalises it: about 4-5 ms per ImageNet-sized image on one core with the paper's recipe,
so a GPU that trains thousands of images a second needs many cores. `faster` rebuilds that transform from
the same timm objects with the same random draws (the same calls to Python's ``random``, numpy and torch, in
the same order, so `SeededItems` still gives every item the same picture with any number of workers or
ranks), and changes only how pixels are computed:

* the crop is drawn from the file's header before any pixel is decoded, and a JPEG is decoded at the
  largest power-of-two reduction (libjpeg's DCT scaling, PIL's ``draft``) that leaves the crop at least 1.5x
  the output size (a large photo cropped to 224 px needs no more);
* the crop is resized by torch's uint8 antialiased kernels (PIL's filters, vectorised: within one level);
* RandAugment's shears and translations, which move each row (or column) by one offset, resample rows with
  PIL's own bicubic formula in numpy instead of PIL's per-pixel affine path (within one level);
* the tensor is made and normalised in one step (bit-identical to ``ToTensor`` + ``Normalize``).

`benchmarks/loader_throughput.py` measures each step against timm's pipeline.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image

from ..core.errors import HetpruneError

REDUCTIONS = (8, 4, 2)   # libjpeg's power-of-two DCT scalings (PIL's draft), largest first
# a crop is decoded reduced only if it stays this many times the output size: nearer 1x, libjpeg's DCT scaling
# does the downscaling alone, and on the grainy photo of tests/test_loader_throughput.py its picture differed
# from the bicubic resize's by more than bilinear's does (about 3.2 levels against 2.0; 1.9 at 1.5-2x)
DRAFT_MARGIN = 1.5


def open_image(path: str) -> Image.Image:
    """A file opened but not decoded (PIL reads the header only): a training crop decides how much of it to
    decode. An unreadable file is named in one clear error."""
    try:
        return Image.open(path)
    except OSError as exc:  # PIL's UnidentifiedImageError included
        raise HetpruneError(f"cannot read image {path}: {exc}") from None


def decode_for_crop(img: Image.Image, box: tuple[int, int, int, int], size: tuple[int, int]) -> tuple:
    """``img`` decoded as RGB, at the largest reduction that keeps the crop ``box`` (top, left, height,
    width) at least `DRAFT_MARGIN` times ``size`` (height, width); returns the image and the box in its
    pixels (fractions of a pixel where reduced: rounding it shifted the crop by up to a pixel). An image
    already decoded, or not a JPEG, is used at full size."""
    top, left, height, width = box
    scale = 1
    if getattr(img, "format", None) == "JPEG" and getattr(img, "tile", None):
        fit = [k for k in REDUCTIONS
               if height / k >= DRAFT_MARGIN * size[0] and width / k >= DRAFT_MARGIN * size[1]]
        if fit:
            full_width = img.size[0]
            drafted = img.draft(None, (full_width // fit[0], img.size[1] // fit[0]))
            if drafted is not None:
                scale = round(full_width / drafted[1][2])
    try:
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        rgb.load()
    except OSError as exc:
        raise HetpruneError(f"cannot read image {getattr(img, 'filename', '')}: {exc}") from None
    return rgb, box if scale == 1 else (top / scale, left / scale, height / scale, width / scale)


TORCH_MODES = {"bilinear": "bilinear", "bicubic": "bicubic"}   # what torch's antialiased uint8 kernels do


def resize_crop(img: Image.Image, box: tuple, size: tuple[int, int], interpolation) -> Image.Image:
    """The crop ``box`` (top, left, height, width) of ``img`` resized to ``size``, antialiased: torch's uint8
    kernels for bilinear and bicubic on whole pixels (half PIL's time, within one level of it), PIL's resize
    of the exact box otherwise. Pixels go into torch as RGBX (its fast layout, PIL's own) and come out as
    planes (its output, merged by PIL): no transposing copies."""
    top, left, height, width = box
    mode = TORCH_MODES.get(getattr(interpolation, "value", interpolation))
    if mode is None or not all(float(v).is_integer() for v in box):
        from torchvision.transforms.functional import InterpolationMode, pil_modes_mapping

        pil = pil_modes_mapping[InterpolationMode(getattr(interpolation, "value", interpolation))]
        return img.resize((size[1], size[0]), pil, box=(left, top, left + width, top + height))
    top, left, height, width = (int(v) for v in box)
    crop = img.crop((left, top, left + width, top + height)).tobytes("raw", "RGBX")
    pixels = torch.frombuffer(bytearray(crop), dtype=torch.uint8).view(1, height, width, 4)
    out = torch.nn.functional.interpolate(pixels.permute(0, 3, 1, 2), size=tuple(size), mode=mode, antialias=True)
    if out.is_contiguous():   # planes (torch's output when it shrinks)
        return Image.merge("RGB", [Image.frombytes("L", (size[1], size[0]), out[0, c].numpy()) for c in range(3)])
    return Image.frombytes("RGB", (size[1], size[0]), out[0].permute(1, 2, 0).contiguous().numpy(), "raw", "RGBX")


class DraftResizedCrop:
    """timm's ``RandomResizedCropAndInterpolation``, drawn the same way, on a file not yet decoded: the crop
    is drawn from the image's size, then only as much of the file is decoded as the crop needs."""

    def __init__(self, crop):
        self.crop = crop   # timm's transform: its size, scale, ratio and interpolation(s), and its draws

    def __call__(self, img: Image.Image) -> Image.Image:
        box = self.crop.get_params(img, self.crop.scale, self.crop.ratio)
        interpolation = self.crop.interpolation
        if isinstance(interpolation, (tuple, list)):
            interpolation = random.choice(interpolation)
        img, box = decode_for_crop(img, box, self.crop.size)
        return resize_crop(img, box, self.crop.size, interpolation)

    def __repr__(self) -> str:
        return f"DraftResizedCrop({self.crop!r})"


# -- RandAugment's shears and translations, resampled row by row ----------------------------------------------

def _bicubic_rows(pixels: np.ndarray, offsets: np.ndarray, fill: int) -> np.ndarray:
    """Row ``y`` of ``pixels`` (h x w, one uint32 per RGBX pixel) resampled at ``x + offsets[y]``, as PIL's
    affine transform does with BICUBIC (its cubic with a = -1, columns clamped to the row, values clipped
    and truncated); pixels whose source centre falls outside the row take ``fill`` (one uint32)."""
    h, w = pixels.shape
    whole = np.floor(offsets)
    d = (offsets - whole).astype(np.float32)[:, None, None]
    d2 = d * d
    d3 = d2 * d
    weights = (2 * d2 - d - d3, 1 - 2 * d2 + d3, d + d2 - d3, d3 - d2)
    padded = np.empty((h, w + 4), np.uint32)   # two edge columns repeated each side: every tap a valid index
    padded[:, 2:-2] = pixels
    padded[:, :2] = pixels[:, :1]
    padded[:, -2:] = pixels[:, -1:]
    # the first tap of pixel x is column x + whole - 1; clipped, it stays exact wherever the centre is inside
    first = np.clip(np.arange(w)[None, :] + (whole.astype(np.int64) + 1)[:, None], 0, w)
    first += (np.arange(h) * (w + 4))[:, None]
    flat = padded.reshape(-1)
    out = np.zeros((h, w, 4), np.float32)
    part = np.empty_like(out)
    for k, weight in enumerate(weights):
        np.multiply(flat.take(first + k).view(np.uint8).reshape(h, w, 4), weight, out=part)
        out += part
    np.clip(out, 0, 255, out=out)
    result = out.astype(np.uint8).view(np.uint32).reshape(h, w)
    centre = np.arange(w)[None, :] + 0.5 + offsets[:, None]
    np.copyto(result, np.uint32(fill), where=(centre < 0) | (centre >= w))
    return result


def _shifted(img: Image.Image, along_rows: bool, factor: float, shift: float, fill) -> Image.Image:
    """PIL's AFFINE ``(1, factor, shift, 0, 1, 0)`` (rows) or ``(1, 0, 0, factor, 1, shift)`` (columns) with
    BICUBIC, on an RGB image."""
    w, h = img.size
    pixels = np.frombuffer(img.tobytes("raw", "RGBX"), np.uint32).reshape(h, w)
    if not along_rows:
        pixels = pixels.T
    offsets = factor * (np.arange(pixels.shape[0]) + 0.5) + shift
    rgb = tuple(fill)[:3] if isinstance(fill, (tuple, list)) else (fill,) * 3
    out = _bicubic_rows(pixels, offsets, np.array([*rgb, 0], np.uint8).view(np.uint32)[0])
    if not along_rows:
        out = out.T
    return Image.frombytes("RGB", (w, h), np.ascontiguousarray(out), "raw", "RGBX")


def _row_op(timm_fn, along_rows: bool, kind: str):
    """timm's op ``timm_fn`` (same arguments), done by `_shifted` where it resamples an RGB image with a
    fixed BICUBIC; otherwise timm's own (which draws a random interpolation itself)."""

    def op(img, level, **kwargs):
        if img.mode != "RGB" or kwargs.get("resample") != Image.BICUBIC:
            return timm_fn(img, level, **kwargs)
        fill = kwargs.get("fillcolor", 0)
        if kind == "shear":
            return _shifted(img, along_rows, level, 0.0, fill)
        pixels = level * img.size[0 if along_rows else 1] if kind == "rel" else level
        return _shifted(img, along_rows, 0.0, pixels, fill)

    op.__name__ = getattr(timm_fn, "__name__", "op")
    return op


def _row_ops() -> dict:
    from timm.data import auto_augment as aa

    return {"ShearX": _row_op(aa.shear_x, True, "shear"), "ShearY": _row_op(aa.shear_y, False, "shear"),
            "TranslateXRel": _row_op(aa.translate_x_rel, True, "rel"),
            "TranslateYRel": _row_op(aa.translate_y_rel, False, "rel"),
            "TranslateX": _row_op(aa.translate_x_abs, True, "abs"),
            "TranslateY": _row_op(aa.translate_y_abs, False, "abs")}


def faster_ops(transform) -> None:
    """Give the shear and translation ops of a timm RandAugment / AutoAugment their row resampling (each
    op's draws are made by timm's ``AugmentOp`` as before)."""
    fast = _row_ops()
    for op in _augment_ops(transform):
        if op.name in fast:
            op.aug_fn = fast[op.name]


def _augment_ops(transform) -> list:
    ops = list(getattr(transform, "ops", []))
    for sub in getattr(transform, "policy", []):   # AutoAugment: a list of sub-policies of ops
        ops.extend(sub)
    return ops


def planes(img: Image.Image) -> torch.Tensor:
    """An image as a 3 x H x W uint8 tensor (RGB), from PIL's planes read one after another: no transposing
    copy, as ``ToTensor`` makes."""
    if img.mode != "RGB":
        img = img.convert("RGB")
    w, h = img.size
    data = bytearray(b"".join(band.tobytes() for band in img.split()))
    return torch.frombuffer(data, dtype=torch.uint8).view(3, h, w)


class NormalizedTensor:
    """``ToTensor`` then ``Normalize(mean, std)`` in one step, bit-identical, without the intermediate
    copies."""

    def __init__(self, mean, std):
        self.mean = torch.as_tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.as_tensor(std, dtype=torch.float32)[:, None, None]

    def __call__(self, img) -> torch.Tensor:
        if isinstance(img, torch.Tensor):
            return (img - self.mean) / self.std
        return planes(img).float().div_(255).sub_(self.mean).div_(self.std)

    def __repr__(self) -> str:
        return f"NormalizedTensor(mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()})"


def faster(transform):
    """timm's training ``Compose`` with the steps above swapped in, or None when it does not start with a
    random resized crop (then the file must be decoded first, and the transform stays timm's)."""
    from timm.data.transforms import MaybeToTensor, RandomResizedCropAndInterpolation
    from torchvision import transforms as T

    steps = list(getattr(transform, "transforms", []))
    if not steps or not isinstance(steps[0], RandomResizedCropAndInterpolation):
        return None
    out = [DraftResizedCrop(steps[0])]
    i = 1
    while i < len(steps):
        step = steps[i]
        if isinstance(step, (MaybeToTensor, T.ToTensor)) and i + 1 < len(steps) and isinstance(steps[i + 1],
                                                                                                   T.Normalize):
            out.append(NormalizedTensor(steps[i + 1].mean, steps[i + 1].std))
            i += 2
            continue
        faster_ops(step)
        out.append(step)
        i += 1
    return T.Compose(out)
