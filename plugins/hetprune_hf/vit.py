"""``transformers.ViTForImageClassification`` (transformers >= 5).

A ``ViTLayer`` is pre-norm: ``x + dropout(attention(layernorm_before(x)))``,
then ``x + dropout(mlp(layernorm_after(x)))`` with ``mlp = fc2(activation_fn(
fc1(x)))``; blocks are ``vit.layers``. Its attention returns
``(output, weights)``, so gates and the functional reference hook its last
layer, ``o_proj``, instead. The classifier reads the class token: one
attention site must stay.

hetprune's models return logits; an HF model returns an output object, so it
is wrapped: `wrap` (or ``ModelSpec("ViTForImageClassification",
config_kwargs, library="hf-vit")``, which builds it from a ``ViTConfig``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from hetprune import HetpruneError, ModelSpec
from hetprune.plugin_api import BlockLayout, PreNormAdapter

LIBRARY = "hf-vit"
INSTALL = "Hugging Face models need transformers >= 5: pip install 'hetprune[hf]'"


def _transformers_vit():
    try:
        from transformers.models.vit import modeling_vit
    except ImportError as exc:
        raise HetpruneError(f"{INSTALL} ({exc})") from None
    if not hasattr(modeling_vit, "ViTMLP"):
        raise HetpruneError(f"this transformers has the older ViT layer layout; {INSTALL}")
    return modeling_vit


# what transformers' ViTImageProcessor does by default: resize to the square input, bilinear, no crop, then
# (x - 0.5) / 0.5 per channel (its IMAGENET_STANDARD mean and std, not timm's ImageNet ones)
PROCESSOR_MEAN = PROCESSOR_STD = 0.5


class HFViTClassifier(nn.Module):
    """A ``ViTForImageClassification`` that returns logits, as every hetprune model does.

    Its ``pretrained_cfg`` says how its inputs are normalised, as a timm model's does: an ImageFolder run
    (``--data``) and an export read it. Without ``image_mean``/``image_std`` that is ViTImageProcessor's
    default; a model whose own processor differs passes ``processor.image_mean, processor.image_std``.
    """

    def __init__(self, model: nn.Module, image_mean=None, image_std=None):
        super().__init__()
        self.model = model
        cfg = model.config
        channels = int(cfg.num_channels)
        mean, std = (_per_channel(v, default, channels, what) for v, default, what in (
            (image_mean, PROCESSOR_MEAN, "image_mean"), (image_std, PROCESSOR_STD, "image_std")))
        if any(v <= 0 for v in std):
            raise HetpruneError(f"image_std must be > 0 for every channel, got {list(std)}")
        self.pretrained_cfg = {"input_size": (channels, cfg.image_size, cfg.image_size),
                               "num_classes": cfg.num_labels, "mean": mean, "std": std,
                               "interpolation": "bilinear", "crop_pct": 1.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def _per_channel(value, default: float, channels: int, what: str) -> tuple[float, ...]:
    values = (default,) * channels if value is None else tuple(
        float(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    if len(values) != channels:
        raise HetpruneError(f"{what} needs one value per input channel ({channels}), got {list(values)}")
    return values


def wrap(model: nn.Module, image_mean=None, image_std=None) -> HFViTClassifier:
    """Wrap a ``ViTForImageClassification`` you built or loaded yourself. ``image_mean``/``image_std``: its
    image processor's (``AutoImageProcessor.from_pretrained(...).image_mean``), when they differ from
    ViTImageProcessor's default 0.5/0.5."""
    return HFViTClassifier(model, image_mean, image_std)


class HFViTAdapter(PreNormAdapter):
    name = "hf-vit"
    description = "Hugging Face transformers ViTForImageClassification (wrapped: hetprune_hf.wrap)"
    library = LIBRARY
    example_spec = ModelSpec("ViTForImageClassification", dict(  # a tiny one, for the conformance kit
        image_size=16, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=128, num_labels=10), LIBRARY)
    model_types = (HFViTClassifier,)
    layout = BlockLayout(norm1="layernorm_before", attn="attention", attn_scale=None, norm2="layernorm_after",
                         mlp="mlp", mlp_scale=None, drop_path2="dropout", act="activation_fn")

    @property
    def block_types(self):
        return (_transformers_vit().ViTLayer,)

    @property
    def attention_types(self):
        return (_transformers_vit().ViTAttention,)

    def block_slots(self, model):
        layers = model.model.vit.layers
        return [(layers, str(i)) for i in range(len(layers))]

    def max_removals(self, model):
        n = len(self.block_slots(model))
        return {"attn": n - 1, "act": n}  # the classifier reads the class token

    def gate_point(self, model, block, kind, attn_mode="identity"):
        if kind == "attn" and attn_mode == "identity":
            attention = getattr(self._block(model, block), self.layout.attn)
            return attention.o_proj, lambda inputs, output: torch.zeros_like(output)
        if kind == "attn":
            raise HetpruneError("the hf-vit adapter cannot hook ln-residual attention removal (its attention "
                                "returns a tuple); use attn-identity with gate-based scorers")
        return super().gate_point(model, block, kind)

    @contextlib.contextmanager
    def explicit_attention(self, model):
        """transformers picks the attention kernel by the config's attention implementation, not a flag on the
        module: ``eager`` is the explicit matmuls and softmax (the same function as ``sdpa``)."""
        inner = model.model
        before = inner.config._attn_implementation
        inner.set_attn_implementation("eager")
        try:
            yield model
        finally:
            inner.set_attn_implementation(before or "sdpa")

    def attention_geometry(self, module):
        return int(module.num_attention_heads), int(module.head_dim)

    def arch(self, model):
        facts = super().arch(model)
        facts["num_heads"] = int(model.model.config.num_attention_heads)
        return facts

    def build(self, name, kwargs):
        vit = _transformers_vit()
        if name != "ViTForImageClassification":
            raise HetpruneError(f"the {LIBRARY} adapter builds ViTForImageClassification, not {name!r}")
        from transformers import ViTConfig

        try:
            config = ViTConfig(**kwargs)
        except (TypeError, ValueError) as exc:
            raise HetpruneError(f"ViTConfig does not take {kwargs}: {exc}") from None
        return HFViTClassifier(vit.ViTForImageClassification(config))
