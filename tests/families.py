"""Tiny models of every model family an adapter supports (depth <= 4, dim <= 64),
all taking the tests' digits images (1 x 16 x 16, 10 classes)."""

from __future__ import annotations

import torch

from hetprune.model.spec import ModelSpec, build
from hetprune_hf.vit import HFViTAdapter
from hetprune_timm import TimmBEiT, TimmCaiT, TimmEVA, TimmSwin, TimmViT

DIGITS = dict(img_size=16, in_chans=1, num_classes=10)


def example_of(adapter) -> tuple[str, str, dict]:
    """A family's entry from its adapter's own tiny ``example_spec`` (the conformance kit's model)."""
    s = adapter.example_spec
    return adapter.name, s.name if s.library == "timm" else f"{s.library}:{s.name}", dict(s.kwargs)


FAMILIES: dict[str, tuple[str, str, dict]] = {
    # key: (adapter, name as --model takes it, kwargs); one per adapter is its own example_spec
    "vit": example_of(TimmViT),
    "deit-distilled": ("timm-vit", "deit_tiny_distilled_patch16_224", dict(patch_size=4, embed_dim=32, depth=3,
                                                                          num_heads=2)),
    "deit3": ("timm-vit", "deit3_small_patch16_224", dict(patch_size=4, embed_dim=32, depth=3, num_heads=2)),
    "dinov2-reg-swiglu": ("timm-vit", "vit_giant_patch14_reg4_dinov2", dict(patch_size=4, embed_dim=32, depth=3,
                                                                           num_heads=2, init_values=0.1)),
    "vit-gap": ("timm-vit", "vit_medium_patch16_gap_256", dict(patch_size=4, embed_dim=32, depth=3, num_heads=2)),
    "clip": ("timm-vit", "vit_base_patch16_clip_quickgelu_224", dict(patch_size=4, embed_dim=32, depth=3,
                                                                    num_heads=2)),
    "flexivit": ("timm-vit", "flexivit_small", dict(patch_size=4, embed_dim=32, depth=3, num_heads=2)),
    "naflexvit": ("timm-vit", "naflexvit_base_patch16_gap", dict(patch_size=4, embed_dim=32, depth=3, num_heads=2)),
    "relpos": ("timm-vit", "vit_relpos_small_patch16_224", dict(patch_size=4, embed_dim=32, depth=3, num_heads=2,
                                                               init_values=0.1)),
    "cait": example_of(TimmCaiT),
    "beit": example_of(TimmBEiT),
    "eva02-swiglu": example_of(TimmEVA),
    "eva02-swiglu-norm": ("timm-eva", "eva02_tiny_patch14_224", dict(patch_size=4, embed_dim=32, depth=3,
                                                                    num_heads=2, scale_mlp=True)),
    "vit-rope": ("timm-eva", "vit_small_patch16_rope_224", dict(patch_size=4, embed_dim=32, depth=3, num_heads=2)),
    # EVA with LayerScale: bare gamma_1/gamma_2 parameters (its example_spec has none)
    "eva02-layerscale": ("timm-eva", "eva02_tiny_patch14_224", dict(patch_size=4, embed_dim=32, depth=3,
                                                                   num_heads=2, init_values=0.5)),
    # differential attention (timm's DiffAttention: two softmax maps, two SDPA calls), register token, GAP
    "vit-diff-attn": ("timm-vit", "vit_dwee_patch16_reg1_gap_256", dict(patch_size=4, embed_dim=32, depth=3,
                                                                        num_heads=2)),
    # SigLIP: no class token, the attention-pool head (global_pool='map'), itself an attention with an MLP
    "siglip-map": ("timm-vit", "vit_base_patch16_siglip_224", dict(patch_size=4, embed_dim=32, depth=3,
                                                                  num_heads=2)),
    # the same models, attention removed as the reference release does it: the branch becomes norm1(x)
    "vit-ln-residual": example_of(TimmViT),
    "eva02-layerscale-ln-residual": ("timm-eva", "eva02_tiny_patch14_224", dict(patch_size=4, embed_dim=32, depth=3,
                                                                               num_heads=2, init_values=0.5)),
    "swin": example_of(TimmSwin),
    # outside timm: built from a transformers ViTConfig by the hf-vit adapter (plugin hetprune_hf)
    "hf-vit": example_of(HFViTAdapter),
}


# how a family's attention sites are removed (surgery.ATTN_MODES); "identity" where not named
ATTN_MODE = {"vit-ln-residual": "ln-residual", "eva02-layerscale-ln-residual": "ln-residual"}


def attn_mode(key: str) -> str:
    return ATTN_MODE.get(key, "identity")


def spec(key: str) -> ModelSpec:
    adapter, name, kwargs = FAMILIES[key]
    return ModelSpec.parse(name, kwargs if adapter == "hf-vit" else {**DIGITS, **kwargs})


def cli_name(key: str) -> str:
    return FAMILIES[key][1]


def make(key: str, dtype=torch.float32, seed: int = 0) -> torch.nn.Module:
    """A tiny model with non-trivial norm affines and LayerScale, so a wrong fold or a dropped scale shows."""
    return make_from(spec(key), dtype, seed)


def make_from(model_spec: ModelSpec, dtype=torch.float32, seed: int = 0) -> torch.nn.Module:
    """`make` for a model outside `FAMILIES` (built from its spec)."""
    torch.manual_seed(seed)
    model = build(model_spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("gamma", "gamma_1", "gamma_2"):
                p.uniform_(0.3, 1.5)
            elif p.dim() == 1 and ("norm" in name) and leaf == "weight":
                p.uniform_(0.5, 1.5)
            elif p.dim() == 1 and ("norm" in name) and leaf == "bias":
                p.uniform_(-0.3, 0.3)
    return model.eval().to(dtype)


def example(n: int = 3, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(n, 1, 16, 16, generator=gen).to(dtype)
