"""Base models: a timm model name plus keyword arguments, and where the
weights come from (random, ``--pretrained`` from the hub, ``--checkpoint``,
or the embedded digits model that hetprune trains once and caches).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
from torch import nn

from .cache import cache_dir, fingerprint
from .errors import HetpruneError
from .io import load_weights, read_json, save_weights, write_json_atomic


@dataclass
class ModelSpec:
    """How to build the unpruned architecture: ``timm.create_model(name, **kwargs)``."""

    name: str
    kwargs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise HetpruneError(f"a model spec needs a string 'name', got {d!r}")
        if d.get("kwargs") is not None and not isinstance(d["kwargs"], dict):
            raise HetpruneError(f"a model spec's 'kwargs' must be a JSON object, got {d['kwargs']!r}")
        return cls(d["name"], dict(d.get("kwargs") or {}))


# The embedded default: a small ViT on scikit-learn digits (8x8 -> 16x16, patch 4).
# LayerScale (init 0.1) is what makes this recipe train reliably (see DESIGN.md).
DIGITS_SPEC = ModelSpec(
    "vit_tiny_patch16_224",
    dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=96, depth=12, num_heads=3,
         init_values=0.1),
)
DIGITS_TRAINING = dict(epochs=30, lr=1e-3, batch_size=32, weight_decay=0.05, seed=0)


def input_shape_of(model) -> tuple[int, int, int]:
    """``(C, H, W)`` the model was built for (timm's pretrained_cfg ignores img_size overrides)."""
    pe = getattr(model, "patch_embed", None)
    if pe is not None and getattr(pe, "img_size", None) is not None and hasattr(getattr(pe, "proj", None),
                                                                                "in_channels"):
        return (pe.proj.in_channels, *pe.img_size)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if "input_size" in cfg:
        return tuple(cfg["input_size"])
    raise HetpruneError("cannot tell this model's input size (no patch_embed.img_size or pretrained_cfg)")


def build(spec: ModelSpec, pretrained: bool = False) -> nn.Module:
    """A fresh model of ``spec`` (random weights unless ``pretrained``)."""
    if not timm.is_model(spec.name):
        raise HetpruneError(f"timm has no model named {spec.name!r}; see timm.list_models('*vit*')")
    try:
        model = timm.create_model(spec.name, pretrained=pretrained, **spec.kwargs)
    except TypeError as exc:
        raise HetpruneError(f"timm model {spec.name!r} does not take the arguments {spec.kwargs}: {exc}") from exc
    except (RuntimeError, OSError) as exc:
        if pretrained:
            raise HetpruneError(
                f"cannot load pretrained weights for {spec.name!r} (no network or no such weights?): {exc}; "
                "pass --checkpoint FILE with weights you have instead"
            ) from exc
        raise
    return model.eval()


def load_state_into(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` strictly, turning mismatches into one readable error."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys (e.g. {', '.join(unexpected[:3])})")
        if wrong:
            k = wrong[0]
            parts.append(f"{len(wrong)} shape mismatches (e.g. {k}: file {tuple(state[k].shape)} "
                         f"vs model {tuple(own[k].shape)})")
        raise HetpruneError(f"{source} does not fit this model: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def build_with_weights(spec: ModelSpec, pretrained: bool = False, checkpoint: str | None = None) -> nn.Module:
    if pretrained and checkpoint:
        raise HetpruneError("pass either --pretrained or --checkpoint, not both")
    model = build(spec, pretrained=pretrained)
    if checkpoint:
        load_state_into(model, load_weights(checkpoint), f"checkpoint {checkpoint}")
    return model


def digits_model(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None, progress: bool = True,
                 log=print, device: str = "cpu") -> nn.Module:
    """The embedded default base model: trained on digits once (on ``device``), then read from the cache."""
    from .data import digits, loader
    from .train import TrainConfig, evaluate, train

    from . import distributed as dist

    folder = digits_model_folder(spec, training)
    training = {**DIGITS_TRAINING, **(training or {})}
    weights = folder / "model.safetensors"
    if dist.active() and not weights.is_file():
        # rank 0 trains the base model alone; the others wait, then read the cache
        if dist.is_main():
            digits_model(spec, training, progress, log, device)
        dist.barrier()
    model = build(spec)
    if weights.is_file():
        load_state_into(model, load_weights(weights), f"cached base model {weights}")
        return model.eval()
    log(f"training the embedded base model (digits, {training['epochs']} epochs; cached in {folder}) ...")
    torch.manual_seed(training["seed"])
    model = build(spec)
    data = digits()
    cfg = TrainConfig(epochs=training["epochs"], lr=training["lr"], batch_size=training["batch_size"],
                      weight_decay=training["weight_decay"], seed=training["seed"], kd="none", warmup_epochs=2,
                      device=device)
    start = time.time()
    train(model, data, cfg, progress=progress, desc="base model", distributed=False)
    acc = evaluate(model, loader(data.val, 256, shuffle=False), device)
    model.cpu()  # the cached weights, and the model returned, are the same wherever it was trained
    save_weights(weights, model)
    write_json_atomic(folder / "meta.json", {"spec": spec.to_dict(), "training": training, "val_top1": acc,
                                             "seconds": round(time.time() - start, 1), "device": str(device)})
    log(f"base model: val top-1 {acc:.2f}% after {time.time() - start:.0f}s")
    return model.eval()


def digits_model_folder(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None) -> Path:
    """The cache folder of the embedded base model, keyed by its settings and data pipeline."""
    training = {**DIGITS_TRAINING, **(training or {})}
    key = fingerprint({"spec": spec.to_dict(), "training": training, "v": 2})
    return cache_dir() / "base" / f"digits-{key}"


def digits_model_info(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None) -> dict | None:
    meta = digits_model_folder(spec, training) / "meta.json"
    return read_json(meta) if meta.is_file() else None


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def model_hash(model: nn.Module) -> str:
    """A content hash of a model's weights (keys resumable state to the exact base model)."""
    import hashlib

    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().to(torch.float32).numpy().tobytes())
    return h.hexdigest()[:16]


def resolve_checkpoint(path: str | None) -> str | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise HetpruneError(f"--checkpoint {path} does not exist")
    return path
