"""Issue 2, point 5: sites on the timm ViT family, and clear refusals elsewhere."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

import hetprune
from hetprune import HetpruneError, Site
from hetprune.model import surgery
from hetprune.model.sites import blocks_of, check_site, depth

TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=2)

FAMILY = {
    "vit": ("vit_tiny_patch16_224", {}),
    "vit-layerscale": ("vit_tiny_patch16_224", {"init_values": 0.1}),
    "deit": ("deit_tiny_patch16_224", {}),
    "deit-distilled": ("deit_tiny_distilled_patch16_224", {}),
    "deit-distilled-layerscale": ("deit_tiny_distilled_patch16_224", {"init_values": 0.1}),
    "no-class-token": ("vit_tiny_patch16_224", {"class_token": False, "global_pool": "avg"}),
    "no-class-token-layerscale": ("vit_tiny_patch16_224",
                                  {"class_token": False, "global_pool": "avg", "init_values": 0.1}),
    "register-tokens": ("vit_tiny_patch16_224", {"reg_tokens": 2}),
}


def make(name, extra, dtype=torch.float32):
    torch.manual_seed(0)
    return timm.create_model(name, **TINY, **extra).eval().to(dtype)


def forward(model, x):
    out = model(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("key", sorted(FAMILY))
def test_sites_of_every_vit_variant(key):
    name, extra = FAMILY[key]
    model = make(name, extra)
    expected = [Site(i, k) for i in range(3) for k in ("attn", "act")]
    assert hetprune.sites(model) == expected
    assert hetprune.sites(model, "attn") == [Site(i, "attn") for i in range(3)]
    assert hetprune.sites(model, "act") == [Site(i, "act") for i in range(3)]
    assert depth(model) == 3
    if extra.get("init_values"):
        assert hasattr(blocks_of(model)[0].ls2, "gamma")
    else:
        assert isinstance(blocks_of(model)[0].ls2, nn.Identity)


@pytest.mark.parametrize("key", sorted(FAMILY))
def test_surgery_on_every_vit_variant_is_exact_after_merge(key):
    """Remove one site of each kind plus a whole block, merge, and check the merge kept the function."""
    name, extra = FAMILY[key]
    model = make(name, extra, torch.float64)
    # LayerScale's default init (0.1 or none) hides little; make its gamma non-trivial so folding it is tested
    for b in blocks_of(model):
        if hasattr(b.ls2, "gamma"):
            with torch.no_grad():
                b.ls2.gamma.uniform_(0.5, 1.5)
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    surgery.remove_attention(model, 0, "ln-residual")
    surgery.remove_activation(model, 0)
    surgery.remove_activation(model, 1)
    surgery.drop_block(model, 2)
    assert hetprune.sites(model) == [Site(1, "attn")]
    before = forward(model, x)
    assert sorted(surgery.merge_all(model, fold_norm=True)) == [0, 1]
    after = forward(model, x)
    assert after.shape == (2, 10) and torch.isfinite(after).all()
    assert (before - after).abs().max().item() <= 1e-10


def test_present_only_and_site_order():
    model = make(*FAMILY["vit"])
    surgery.remove_attention(model, 1)
    surgery.remove_activation(model, 2)
    assert Site(1, "attn") not in hetprune.sites(model)
    assert Site(2, "act") not in hetprune.sites(model)
    assert len(hetprune.sites(model)) == 4
    assert hetprune.sites(model, present_only=False) == [Site(i, k) for i in range(3) for k in ("attn", "act")]


def test_site_text_round_trip_and_bad_sites():
    for site in (Site(0, "attn"), Site(11, "act")):
        assert Site.parse(str(site)) == site
    assert str(Site(3, "attn")) == "attn3"
    with pytest.raises(HetpruneError, match="attn<N> or act<N>"):
        Site.parse("mlp3")
    with pytest.raises(HetpruneError, match="attn<N> or act<N>"):
        Site.parse("attn")
    with pytest.raises(HetpruneError, match="site kind must be one of"):
        Site(0, "mlp")
    model = make(*FAMILY["vit"])
    with pytest.raises(HetpruneError, match=r"block index 3 .* blocks 0\.\.2"):
        check_site(model, Site(3, "act"))
    with pytest.raises(HetpruneError, match="out of range"):
        check_site(model, Site(-1, "attn"))


@pytest.mark.parametrize("model, cls", [
    (lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4)), "Sequential"),
    (lambda: timm.create_model("resnet18", num_classes=10), "ResNet"),
    (lambda: timm.create_model("swinv2_tiny_window8_256", img_size=64, embed_dim=16, depths=(1, 1),
                               num_heads=(1, 1), window_size=4, num_classes=3), "SwinTransformerV2"),
])
def test_model_no_adapter_knows_is_refused_naming_the_class_the_families_and_the_docs(model, cls):
    with pytest.raises(HetpruneError) as err:
        hetprune.sites(model())
    msg = str(err.value)
    assert msg.startswith(f"no architecture adapter recognises {cls}:")
    for family in ("timm-vit", "timm-cait", "timm-beit", "timm-eva", "timm-swin"):
        assert family in msg
    assert "docs/plugins.md#writing-an-architecture-adapter" in msg


def test_vit_without_blocks_is_refused():
    model = timm.create_model("vit_tiny_patch16_224", **{**TINY, "depth": 0})
    with pytest.raises(HetpruneError, match="VisionTransformer has no transformer blocks"):
        hetprune.sites(model)


def test_vit_with_parallel_blocks_is_refused_saying_why():
    from timm.models.vision_transformer import ParallelScalingBlock

    model = timm.create_model("vit_tiny_patch16_224", **TINY, block_fn=ParallelScalingBlock)
    with pytest.raises(HetpruneError, match=r"block 0 is a ParallelScalingBlock: attention and MLP run in parallel"):
        hetprune.sites(model)


def test_post_norm_vit_is_refused():
    """ResPostBlock has the pre-norm child names but normalises after each branch: surgery would be wrong."""
    from timm.models.vision_transformer import ResPostBlock

    model = timm.create_model("vit_tiny_patch16_224", **TINY, block_fn=ResPostBlock)
    with pytest.raises(HetpruneError, match=r"block 0 is a ResPostBlock: a post-norm block"):
        hetprune.sites(model)
