"""Issue 2, point 6: the surgery primitives, each checked against its hand-written formula."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

import hetprune
from hetprune import HetpruneError, Site
from hetprune.model import surgery
from hetprune.model.macs import count_macs, count_params
from hetprune.model.sites import blocks_of
from conftest import TINY_KWARGS, tiny_example


def tokens(n: int = 3, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    return torch.randn(n, 17, TINY_KWARGS["embed_dim"], generator=gen).to(dtype)


def randomise_affines(model: nn.Module) -> nn.Module:
    """Non-trivial LayerNorm affines and LayerScale gammas, so folding them is really tested."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm) and m.elementwise_affine:
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=gen))
            if hasattr(m, "gamma"):
                m.gamma.copy_(0.5 + torch.rand(m.gamma.shape, generator=gen))
    return model


@pytest.fixture
def model(tiny_model):
    return randomise_affines(tiny_model)


# -- attention removal ---------------------------------------------------------------------------

def test_attention_removal_identity_mode_is_the_mlp_branch_alone(model):
    old = copy.deepcopy(blocks_of(model)[1])
    surgery.remove_attention(model, 1)  # identity is the default mode
    new = blocks_of(model)[1]
    assert isinstance(new, surgery.HetBlock) and new.attn_mode == "identity"
    assert not hasattr(new, "attn") and not hasattr(new, "norm1")  # their weights are gone, not just unused
    x = tokens()
    with torch.no_grad():
        want = x + old.ls2(old.mlp(old.norm2(x)))
        assert torch.equal(new(x), want)
        assert torch.equal(new(x, attn_mask=None), want)  # accepts timm's Block keyword arguments


def test_attention_removal_ln_residual_mode_adds_norm1_of_the_input(model):
    old = copy.deepcopy(blocks_of(model)[2])
    surgery.remove_attention(model, 2, mode="ln-residual")
    new = blocks_of(model)[2]
    assert new.attn_mode == "ln-residual" and not hasattr(new, "attn")
    x = tokens()
    with torch.no_grad():
        y = x + old.norm1(x)
        want = y + old.ls2(old.mlp(old.norm2(y)))
        assert torch.equal(new(x), want)
    assert surgery.attn_mode_of(model, 2) == "ln-residual" and surgery.attn_mode_of(model, 0) is None


def test_attention_removal_saves_exactly_the_attention_parameters(model):
    before = count_params(model)
    block = blocks_of(model)[0]
    owned = sum(p.numel() for m in (block.norm1, block.attn, block.ls1) for p in m.parameters())
    surgery.remove_attention(model, 0)
    assert count_params(model) == before - owned
    # the kept parts keep their state-dict keys
    assert "blocks.0.mlp.fc1.weight" in model.state_dict() and "blocks.0.attn.qkv.weight" not in model.state_dict()


def test_attention_removal_errors(model):
    with pytest.raises(HetpruneError, match="attention removal mode must be one of"):
        surgery.remove_attention(model, 0, mode="zero")
    assert not surgery.site_removed(model, Site(0, "attn"))  # nothing half-done
    surgery.remove_attention(model, 0)
    with pytest.raises(HetpruneError, match="site attn0 is already removed"):
        surgery.remove_attention(model, 0)
    with pytest.raises(HetpruneError, match=r"block index 4 .* blocks 0\.\.3"):
        surgery.remove_attention(model, 4)


# -- activation removal --------------------------------------------------------------------------

def test_activation_removal_makes_the_mlp_fc2_fc1(model):
    surgery.remove_activation(model, 3)
    mlp = blocks_of(model)[3].mlp
    assert isinstance(mlp.act, surgery.RemovedActivation)
    x = tokens()
    with torch.no_grad():
        assert torch.equal(mlp(x), mlp.fc2(mlp.fc1(x)))
    assert surgery.site_removed(model, Site(3, "act")) and not surgery.site_removed(model, Site(3, "attn"))
    with pytest.raises(HetpruneError, match="site act3 is already removed"):
        surgery.remove_activation(model, 3)


def test_activation_removal_inside_an_attention_removed_block(model):
    surgery.remove_attention(model, 1)
    surgery.remove_activation(model, 1)
    block = blocks_of(model)[1]
    x = tokens()
    with torch.no_grad():
        assert torch.equal(block(x), x + block.ls2(block.mlp.fc2(block.mlp.fc1(block.norm2(x)))))
    assert hetprune.sites(model, present_only=True).count(Site(1, "attn")) == 0


# -- merging -------------------------------------------------------------------------------------

def test_merged_mlp_is_layerscale_times_fc2_fc1(model):
    surgery.remove_activation(model, 0)
    block = blocks_of(model)[0]
    ref = copy.deepcopy(block)
    folded = surgery.merge_mlp(model, 0)
    assert folded == {"layerscale": True, "norm": False}
    assert isinstance(block.mlp, surgery.MergedMlp) and isinstance(block.ls2, nn.Identity)
    w1, b1, w2, b2 = (t.double() for t in (ref.mlp.fc1.weight, ref.mlp.fc1.bias, ref.mlp.fc2.weight, ref.mlp.fc2.bias))
    g = ref.ls2.gamma.double()
    assert torch.allclose(block.mlp.fc.weight.double(), g[:, None] * (w2 @ w1), atol=1e-6, rtol=0)
    assert torch.allclose(block.mlp.fc.bias.double(), g * (w2 @ b1 + b2), atol=1e-6, rtol=0)
    x = tokens()
    with torch.no_grad():
        assert (block(x) - ref(x)).abs().max().item() <= 1e-5


def test_fold_norm_leaves_a_plain_normalisation(model):
    surgery.remove_activation(model, 2)
    block = blocks_of(model)[2]
    ref = copy.deepcopy(block)
    assert surgery.merge_mlp(model, 2, fold_norm=True) == {"layerscale": True, "norm": True}
    assert isinstance(block.norm2, nn.LayerNorm) and not block.norm2.elementwise_affine
    assert block.norm2.eps == ref.norm2.eps
    x = tokens()
    with torch.no_grad():
        assert (block(x) - ref(x)).abs().max().item() <= 1e-5
        # by hand: W' = g W2 W1 diag(gamma), b' = g W2 W1 beta + g (W2 b1 + b2)
        n = torch.nn.functional.layer_norm(x, ref.norm2.normalized_shape, eps=ref.norm2.eps)
        assert (block.mlp(n) - ref.ls2(ref.mlp(ref.norm2(x)))).abs().max().item() <= 1e-5


@pytest.mark.parametrize("fold_norm", [False, True])
@pytest.mark.parametrize("attn_mode", ["identity", "ln-residual"])
def test_whole_model_merge_error_fp32_and_fp64(tiny_spec, attn_mode, fold_norm):
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        torch.manual_seed(0)
        model = randomise_affines(hetprune.model.spec.build(tiny_spec)).to(dtype)
        surgery.remove_attention(model, 1, attn_mode)
        for b in range(4):
            surgery.remove_activation(model, b)
        reference = copy.deepcopy(model)
        assert sorted(surgery.merge_all(model, fold_norm=fold_norm)) == [0, 1, 2, 3]
        assert all(p.dtype == dtype for p in model.parameters())
        x = tiny_example(8).to(dtype)
        err = surgery.check_exact(reference, model, x, tol=tol)
        assert 0 <= err <= tol
        if dtype == torch.float32:
            assert err > 0  # the merge really changed the arithmetic (so the check is not vacuous)


def test_merge_only_where_it_lowers_macs():
    kwargs = dict(TINY_KWARGS)
    x = tiny_example(2)
    for ratio, pays in ((0.5, False), (0.25, False), (0.75, True), (4.0, True)):
        torch.manual_seed(0)
        model = timm.create_model("vit_tiny_patch16_224", **kwargs, mlp_ratio=ratio).eval()
        hidden = blocks_of(model)[0].mlp.fc1.out_features
        assert hidden == int(kwargs["embed_dim"] * ratio)
        surgery.remove_activation(model, 0)
        assert surgery.merge_pays(blocks_of(model)[0].mlp) is pays
        assert surgery.mergeable(model, 0) is pays
        before = count_macs(model, x)
        merged = surgery.merge_all(model)
        assert sorted(merged) == ([0] if pays else [])
        assert isinstance(blocks_of(model)[0].mlp, surgery.MergedMlp) is pays
        if pays:
            assert count_macs(model, x) < before
        else:
            assert count_macs(model, x) == before
            assert isinstance(blocks_of(model)[0].mlp.act, surgery.RemovedActivation)


def test_merge_errors_and_what_is_not_mergeable(model):
    assert not surgery.mergeable(model, 0)
    with pytest.raises(HetpruneError, match="still has its activation: remove site act0"):
        surgery.merge_mlp(model, 0)
    assert surgery.merge_all(model) == {}  # nothing linear, nothing merged
    surgery.remove_activation(model, 0)
    surgery.merge_mlp(model, 0)
    assert not surgery.mergeable(model, 0)
    with pytest.raises(HetpruneError, match="already merged"):
        surgery.merge_mlp(model, 0)
    assert surgery.site_removed(model, Site(0, "act"))


def test_mlp_with_a_norm_between_fc1_and_fc2_is_not_merged():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", **TINY_KWARGS, scale_mlp_norm=True).eval()
    surgery.remove_activation(model, 0)
    assert not surgery.mergeable(model, 0)
    with pytest.raises(HetpruneError, match="norm between fc1 and fc2"):
        surgery.merge_mlp(model, 0)


def test_prepare_merge_gives_the_structure_merge_mlp_gives(tiny_spec):
    """Recipe replay shapes merged layers without weights; the state dicts must line up key for key."""
    shapes = []
    for prepare in (False, True):
        torch.manual_seed(0)
        model = hetprune.model.spec.build(tiny_spec)
        surgery.remove_activation(model, 1)
        if prepare:
            surgery.prepare_merge(model, 1, fold_norm=True)
        else:
            surgery.merge_mlp(model, 1, fold_norm=True)
        shapes.append({k: tuple(v.shape) for k, v in model.state_dict().items()})
    assert shapes[0] == shapes[1]


def test_check_exact_raises_beyond_tolerance(model):
    x = tiny_example(2)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.head.bias.add_(1e-3)
    assert surgery.check_exact(model, model, x, tol=0.0) == 0.0
    with pytest.raises(HetpruneError, match="merge changed the model's outputs: max abs error"):
        surgery.check_exact(model, other, x, tol=1e-5)


# -- dropping whole blocks -----------------------------------------------------------------------

def test_drop_block_is_skipping_the_block(model):
    x = tiny_example(3)
    with torch.no_grad():
        reference = copy.deepcopy(model)
        surgery.drop_block(model, 2)
        # by hand: the same forward with block 2 left out
        kept = nn.Sequential(*[b for i, b in enumerate(reference.blocks) if i != 2])
        reference.blocks = kept
        assert torch.equal(model(x), reference(x))
    assert surgery.dropped_blocks(model) == [2]
    assert Site(2, "attn") not in hetprune.sites(model) and Site(2, "act") not in hetprune.sites(model)
    assert not any("blocks.2." in k for k in model.state_dict())
    assert not surgery.mergeable(model, 2)


def test_drop_block_errors(model):
    surgery.drop_block(model, 0)
    with pytest.raises(HetpruneError, match="block 0 is already dropped"):
        surgery.drop_block(model, 0)
    with pytest.raises(HetpruneError, match="site attn0 is already removed"):
        surgery.remove_attention(model, 0)
    with pytest.raises(HetpruneError, match="site act0 is already removed"):
        surgery.remove_activation(model, 0)
    with pytest.raises(HetpruneError, match="out of range"):
        surgery.drop_block(model, 9)
