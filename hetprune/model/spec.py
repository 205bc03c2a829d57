"""Base models: a timm model name plus keyword arguments, and where the
weights come from (random, ``--pretrained`` from the hub, ``--checkpoint``;
the embedded digits model that hetprune trains once and caches is in
`hetprune.training.embedded`).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
from torch import nn

from ..core.keys import qualified_name
from ..core.errors import HetpruneError
from ..core.io import load_weights


USER_BUILT = "user"   # ModelSpec.library of a model the user built in code (hetprune cannot build it again)


@dataclass
class ModelSpec:
    """How to build the unpruned architecture: ``timm.create_model(name, **kwargs)``, or, with another
    ``library``, the ``build`` of the architecture adapter that declares that library (e.g. ``hf-vit``)."""

    name: str
    kwargs: dict = field(default_factory=dict)
    library: str = "timm"

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.library == "timm":  # the default: left out, so older recipes and cache keys stay the same
            del d["library"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise HetpruneError(f"a model spec needs a string 'name', got {d!r}")
        if d.get("kwargs") is not None and not isinstance(d["kwargs"], dict):
            raise HetpruneError(f"a model spec's 'kwargs' must be a JSON object, got {d['kwargs']!r}")
        unknown = sorted(set(d) - {"name", "kwargs", "library"})
        if unknown:
            raise HetpruneError(f"a model spec has unknown key(s) {', '.join(unknown)}; allowed: name, kwargs, library")
        library = d.get("library", "timm")
        if not isinstance(library, str):
            raise HetpruneError(f"a model spec's 'library' must be a string, got {library!r}")
        return cls(d["name"], dict(d.get("kwargs") or {}), library)

    @classmethod
    def user_built(cls, model) -> "ModelSpec":
        """The spec of a model the user built in code: its class, which hetprune cannot build again itself
        (reload with ``hetprune.load(folder, model=YourModel(...))``)."""
        cls_ = type(model)
        return cls(qualified_name(cls_), {}, USER_BUILT)

    @property
    def is_user_built(self) -> bool:
        return self.library == USER_BUILT

    def label(self) -> str:
        """How tables and reports name the model: the timm name with the kwargs it was built with
        (``vit_tiny_patch16_224 (img_size=28, patch_size=4, in_chans=1)``), since the name alone says patch 16 of
        a model built with patch 4."""
        name = self.name if self.library == "timm" else f"{self.library}:{self.name}"
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{name} ({args})" if args else name

    @classmethod
    def parse(cls, text: str, kwargs: dict | None = None) -> "ModelSpec":
        """``vit_tiny_patch16_224`` (timm) or ``LIBRARY:NAME``, e.g. ``hf-vit:ViTForImageClassification``."""
        library, sep, name = text.partition(":")
        return cls(name, dict(kwargs or {}), library) if sep else cls(text, dict(kwargs or {}))


# -- a recipe is data: base kwargs that would reach files or the network ----------------------
# How the check is built, and why a deny-list: every timm family takes its own architecture arguments
# (Swin's window_size, EVA's swiglu_mlp, ...), so no list of the harmless ones can be complete, while the
# arguments that load anything are few and belong to timm's builder, not to the model. So refused are:
# * the builder's loading arguments below, and every parameter of ``timm.create_model`` and
#   ``build_model_with_cfg`` except the model's name (a loading argument a later timm adds is refused too;
#   the export and feature flags among them never belong in a recipe either);
# * keys that name a source inside a nested value (``{"file": ..., "url": ..., "hf_hub_id": ...}``);
# * anywhere in the kwargs, a string that looks like a path or URL (a separator, ``~``, ``://``, or a
#   weights/config file suffix): no architecture argument is a path, so a model-specific one that reads a
#   file is caught by its value.
SOURCE_KWARGS = frozenset({
    "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict", "pretrained_filter_fn",
    "pretrained_model_args", "checkpoint_path", "cache_dir", "pruned",   # timm: weights, configs, pruned defs
    "trust_remote_code", "auto_map",                                     # transformers: remote code
    "file", "url", "hf_hub_id", "hf_hub_filename", "hf_hub_revision",    # a pretrained config's sources
})
FILE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".safetensors", ".npz", ".npy", ".pkl", ".pickle", ".json",
                 ".yaml", ".yml", ".h5", ".msgpack", ".onnx", ".tar", ".zip", ".gz")


def _builder_kwargs() -> frozenset:
    """Every parameter of timm's model builder that is not the model's name (see above)."""
    import inspect

    from timm.models import _builder

    names = set()
    for fn in (timm.create_model, _builder.build_model_with_cfg):
        names |= {p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return frozenset(names - {"model_name", "model_cls", "variant"})


def _looks_like_a_source(value: str) -> bool:
    text = value.strip().lower()
    return ("/" in text or "\\" in text or "://" in text or text.startswith("~")
            or text.endswith(FILE_SUFFIXES))


def _sources(value, where: str, names: frozenset) -> list[str]:
    """``where``-qualified entries of ``value`` that name a file, URL or loading argument."""
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            found += [inner] if str(key) in names else _sources(item, inner, names)
        return found
    if isinstance(value, (list, tuple)):
        return [hit for i, item in enumerate(value) for hit in _sources(item, f"{where}[{i}]", names)]
    return [where] if isinstance(value, str) and _looks_like_a_source(value) else []


def source_kwargs(kwargs: dict) -> list[str]:
    """The entries of ``kwargs`` (dotted for nested values) that could make building the model read a file or
    the network: see the note above ``SOURCE_KWARGS``."""
    return _sources(dict(kwargs), "", SOURCE_KWARGS | _builder_kwargs())


def check_kwargs(spec: "ModelSpec", allow=(), where: str = "recipe") -> None:
    """Refuse a spec read from a file (a recipe) whose kwargs could read files or the network when the model
    is built; names in ``allow`` are the ones the caller passes on its own authority (in code)."""
    if isinstance(allow, str):
        raise HetpruneError(f"allow_kwargs takes a list of kwarg names, got the string {allow!r}")
    allowed = set(allow)
    bad = [k for k in source_kwargs(spec.kwargs) if k.split(".")[0].split("[")[0] not in allowed]
    if bad:
        raise HetpruneError(
            f"{where}: the base model's kwargs {', '.join(bad)} could make building it read a file or the "
            f"network, and a recipe is data that only shapes the architecture; if you trust it, pass them "
            f"yourself: hetprune.load(folder, allow_kwargs={sorted({b.split('.')[0].split('[')[0] for b in bad})})"
            f", or hetprune apply --model {spec.name} --model-kwargs JSON (--pretrained, --checkpoint for weights)")


# The embedded default: a small ViT on scikit-learn digits (8x8 -> 16x16, patch 4).
# LayerScale (init 0.1) is what makes this recipe train reliably (see DESIGN.md).
DIGITS_SPEC = ModelSpec(
    "vit_tiny_patch16_224",
    dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=96, depth=12, num_heads=3,
         init_values=0.1),
)


# The second embedded benchmark: digit pairs (two digits side by side in 16x16, 19 sums). The same ViT as
# DIGITS_SPEC (depth 12, dim 96, 3 heads, LayerScale) but with one 16x8 patch per digit: 3 tokens (class + 2).
# With 4x4 patches the sum learned far too slowly for an embedded default (48 % after 40 epochs, 11 minutes).
DIGIT_PAIRS_SPEC = ModelSpec(DIGITS_SPEC.name, {**DIGITS_SPEC.kwargs, "num_classes": 19, "patch_size": [16, 8]})

# The third embedded benchmark, digit grid (two digits on a 4x4 grid of 8x8 cells, their sum mod 10): DIGITS_SPEC's
# ViT with one 8x8 patch per cell, 16 patches + the class token = 17 tokens, a label no single token carries.
DIGIT_GRID_SPEC = ModelSpec(DIGITS_SPEC.name, {**DIGITS_SPEC.kwargs, "img_size": 32, "patch_size": 8,
                                               "num_classes": 10})


def input_shape_of(model) -> tuple[int, int, int]:
    """``(C, H, W)`` the model was built for (timm's pretrained_cfg ignores img_size overrides)."""
    pe = getattr(model, "patch_embed", None)
    if pe is not None and getattr(pe, "img_size", None) is not None and hasattr(getattr(pe, "proj", None),
                                                                                "in_channels"):
        return (pe.proj.in_channels, *pe.img_size)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if "input_size" in cfg:  # build() writes the kwargs' img_size/in_chans here (NaFlexViT keeps no img_size)
        channels, height, width = cfg["input_size"]
        own = getattr(model, "in_chans", None)  # a model timm built outside build() still knows its channels
        return (own if isinstance(own, int) else channels, height, width)
    for name, inner in model.named_modules():   # a backbone inside the user's module: its input is the model's
        if name and (getattr(inner, "patch_embed", None) is not None or "input_size" in (
                getattr(inner, "pretrained_cfg", None) or {})):
            return input_shape_of(inner)
    raise HetpruneError("cannot tell this model's input size (no patch_embed.img_size or pretrained_cfg, in it or "
                        "in a module inside it)")


def _record_input_size(model: nn.Module, kwargs: dict) -> nn.Module:
    """The kwargs' ``img_size``/``in_chans`` in the model's pretrained_cfg, which otherwise keeps the default
    config's (a NaFlexViT built with ``img_size=16, in_chans=1`` said ``(3, 384, 384)``: it keeps no img_size)."""
    cfg = getattr(model, "pretrained_cfg", None)
    size, chans = kwargs.get("img_size"), kwargs.get("in_chans")
    if not isinstance(cfg, dict) or len(cfg.get("input_size") or ()) != 3 or (size is None and chans is None):
        return model
    channels, height, width = cfg["input_size"]
    if size is not None:
        height, width = (size, size) if isinstance(size, int) else size
    cfg = {**cfg, "input_size": (int(chans if chans is not None else channels), int(height), int(width))}
    if size is not None:
        cfg.pop("test_input_size", None)  # the default config's test size, not this model's
    model.pretrained_cfg = model.default_cfg = cfg
    return model


def build(spec: ModelSpec, pretrained: bool | str = False) -> nn.Module:
    """A fresh model of ``spec``: random weights, timm's pretrained ones (``pretrained=True``: the hub), or
    pretrained weights from a local file (``pretrained="FILE"``) read the way timm reads its own: a new head
    where ``num_classes`` differs, the first convolution adapted to ``in_chans``, position embeddings resized
    to ``img_size``. Torch files are read with ``weights_only=True``."""
    if spec.library != "timm":
        return _build_elsewhere(spec, pretrained)
    if not timm.is_model(spec.name):
        raise HetpruneError(f"timm has no model named {spec.name!r}; see timm.list_models('*vit*')")
    if isinstance(pretrained, str):
        model = build(spec)
        load_pretrained_file(model, pretrained, spec.name)
        return model
    try:
        model = timm.create_model(spec.name, pretrained=pretrained, **spec.kwargs)
    except TypeError as exc:
        raise HetpruneError(f"timm model {spec.name!r} does not take the arguments {spec.kwargs}: {exc}") from exc
    except (RuntimeError, OSError) as exc:
        if pretrained:
            raise HetpruneError(
                f"cannot load pretrained weights for {spec.name!r} (no network or no such weights?): {exc}; "
                "pass --pretrained FILE with a weights file you have, or --checkpoint FILE with this very model's "
                "weights, instead"
            ) from exc
        raise
    return _record_input_size(model, spec.kwargs).eval()


def load_pretrained_file(model: nn.Module, path: str, name: str) -> None:
    """Pretrained weights from a local file into a timm ``model``, read the way timm reads its own (its loader,
    with the family's checkpoint filter): a new head where the file has another number of classes, the first
    convolution adapted to the model's channels, position embeddings resized. timm only logs the weights a file
    lacks; here a file that leaves any weight but the head unloaded, or holds weights the model has not, is
    refused, naming them: never a model that is random where the user thinks it pretrained."""
    import sys

    from timm.models import load_pretrained

    if not Path(path).is_file():
        raise HetpruneError(f"--pretrained {path}: no such file (a weights file of {name}: .safetensors, .pth or "
                            ".bin; --pretrained alone reads timm's hub)")
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    if len(cfg.get("input_size") or ()) == 3:   # the file's channels, as timm declares pretrained files: RGB
        cfg["input_size"] = (3, *cfg["input_size"][1:])
    heads = cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    found: dict = {}
    own = model.load_state_dict

    def loading(state_dict, strict=True, **kwargs):   # what timm loads, kept to be checked below
        result = own(state_dict, strict=False, **kwargs)
        found.update(missing=list(result.missing_keys), unexpected=list(result.unexpected_keys))
        return result

    model.load_state_dict = loading
    try:
        load_pretrained(model, pretrained_cfg={**cfg, "file": str(path), "custom_load": str(path).endswith(".npz")},
                        num_classes=getattr(model, "num_classes", cfg.get("num_classes", 1000)),
                        in_chans=input_shape_of(model)[0],
                        filter_fn=getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None))
    except (RuntimeError, OSError, KeyError, ValueError, AssertionError) as exc:
        said = " ".join(line.strip() for line in str(exc).strip().splitlines()) or type(exc).__name__
        raise HetpruneError(f"--pretrained {path} does not load into {name} as timm loads pretrained weights: "
                            f"{said[:400]}") from exc
    finally:
        del model.load_state_dict   # the instance's own method again
    missing = [k for k in found.get("missing", []) if not any(k.startswith(f"{h}.") for h in heads)]
    if missing or found.get("unexpected"):
        parts = ([f"it lacks {len(missing)} of the model's weights (e.g. {', '.join(missing[:3])})"] if missing else [])
        parts += ([f"it holds {len(found['unexpected'])} the model has not (e.g. "
                   f"{', '.join(found['unexpected'][:3])})"] if found.get("unexpected") else [])
        raise HetpruneError(f"--pretrained {path} is not a {name} of this shape: " + "; ".join(parts)
                            + " (only the head may be new)")
    model.eval()


def _build_elsewhere(spec: ModelSpec, pretrained: bool) -> nn.Module:
    from .adapters import adapters

    if spec.is_user_built:
        raise HetpruneError(f"the base model ({spec.name}) was built by the user, so hetprune cannot build it "
                            "again: pass a fresh one, hetprune.load(folder, model=YourModel(...)) or "
                            "hetprune.apply_recipe(YourModel(...), recipe)")

    if pretrained:
        raise HetpruneError(f"--pretrained loads timm weights only; for a {spec.library} model pass --checkpoint FILE")
    builders = {a.library: a for a in adapters() if a.library}
    if spec.library not in builders:
        raise HetpruneError(f"no architecture adapter builds {spec.library!r} models; libraries: timm"
                            f"{''.join(', ' + k for k in sorted(builders))}")
    return builders[spec.library].build(spec.name, spec.kwargs).eval()


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
        raise HetpruneError(f"{source} does not fit this model: " + "; ".join(parts) + _fit_hint(model, state,
                                                                                             wrong))
    model.load_state_dict(state, strict=True)


def _fit_hint(model: nn.Module, state: dict, wrong: list[str]) -> str:
    """What to change where weights differ from the model only where a build argument says: the head
    (``num_classes``), the first convolution (``in_chans``), the position embedding (``img_size``)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    heads = cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    first = cfg.get("first_conv") or ""
    hints = []
    head = [k for k in wrong if any(k.startswith(f"{h}.") for h in heads)]
    if head:
        classes = state[head[0]].shape[0]
        hints.append(f"its head has {classes} classes and the model {model.state_dict()[head[0]].shape[0]}: build "
                     f"the model with num_classes={classes} (--model-kwargs '{{\"num_classes\": {classes}}}') to "
                     "load it as it is, or read it as pretrained weights with a new head for your classes "
                     "(--pretrained FILE, and --base finetune to fine-tune it on your data)")
    conv = f"{first}.weight" if first else ""
    if conv in wrong and state[conv].ndim == 4:
        hints.append(f"it was made for {state[conv].shape[1]} input channels and the model takes "
                     f"{model.state_dict()[conv].shape[1]}: build the model with in_chans={state[conv].shape[1]}, "
                     "or read it with --pretrained FILE, which adapts the first convolution as timm does")
    if any(k.endswith("pos_embed") for k in wrong):
        hints.append("its position embedding is for another image size: build the model with the img_size it "
                     "was trained at, or read it with --pretrained FILE, which resizes the embedding as timm does")
    return "".join(f"; {h}" for h in hints)


def build_with_weights(spec: ModelSpec, pretrained: bool | str = False, checkpoint: str | None = None) -> nn.Module:
    if pretrained and checkpoint:
        raise HetpruneError("pass either --pretrained or --checkpoint, not both")
    model = build(spec, pretrained=pretrained)
    if checkpoint:
        load_state_into(model, load_weights(checkpoint), f"checkpoint {checkpoint}")
    return model


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def model_hash(model: nn.Module) -> str:
    """A content hash of a model's weights (keys resumable state to the exact base model).

    Every tensor is hashed at its own precision: two float64 models that differ below float32's hash
    differently. Half-precision floats are widened to float32 (exact; numpy has no bfloat16), so float32 weights
    hash as they always did; integer buffers are hashed as integers."""
    import hashlib

    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        v = v.detach().cpu().contiguous()
        h.update(k.encode())
        h.update((v.float() if v.dtype in (torch.float16, torch.bfloat16) else v).numpy().tobytes())
    return h.hexdigest()[:16]


def resolve_checkpoint(path: str | None) -> str | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise HetpruneError(f"--checkpoint {path} does not exist")
    return path
