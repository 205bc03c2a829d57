"""A pruned model is still a whole timm model (issue 70).

What timm's own model tests (tests/test_models.py of pytorch-image-models) check of its models, run on tiny
models of every timm family hetprune supports, dense and pruned: attention removed (identity, and ln-residual
on two families), an MLP merged (activation removed, then fc2·fc1 merged), a whole block dropped, and width
pruned (the timm-vit family, the only one with width support). The rule: where the dense model passes a check,
every pruned variant passes it. Dense is a case of its own, so a check dense fails is seen, not assumed.

The Hugging Face ViT (``hf-vit``) is left out: it is not a timm model (no ``feature_info``,
``forward_intermediates``, ``set_input_size``; transformers' models are not TorchScript-able), so timm's tooling
does not apply to it, dense or pruned.
"""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
from timm.models._features import FeatureGetterNet
from timm.models._features_fx import FeatureGraphNet

import hetprune
from hetprune.model import surgery
from hetprune.model.adapters import adapter_for
from hetprune.model.macs import count_macs
from hetprune.model.spec import ModelSpec
from families import DIGITS, example, make, make_from

# the timm families of docs/adapters.md (with the call signatures their blocks take: rope, shared_rel_pos...)
TIMM_FAMILIES = ["vit", "dinov2-reg-swiglu", "vit-gap", "deit", "deit-distilled", "deit3", "relpos", "eva02-swiglu",
                 "vit-rope", "beit", "cait", "swin"]
DEIT = ModelSpec("deit_tiny_patch16_224", {**DIGITS, **dict(patch_size=4, embed_dim=32, depth=3, num_heads=2)})
WIDTH = {"vit", "dinov2-reg-swiglu", "vit-gap", "deit", "deit-distilled", "deit3"}   # relpos: widths refused
LN_RESIDUAL = {"vit", "cait"}   # a LayerScale module; bare gamma parameters and CaiT's one drop_path
BLOCK = 1   # the block each depth variant prunes (Swin: stage 0's last block)


def variants(family: str) -> list[str]:
    out = ["dense", "attn", "merged", "dropped"]
    return out + ["ln-residual"] * (family in LN_RESIDUAL) + ["width"] * (family in WIDTH)


CASES = [(f, v) for f in TIMM_FAMILIES for v in variants(f)]
IDS = [f"{f}-{v}" for f, v in CASES]


def dense_model(family: str):
    return make_from(DEIT) if family == "deit" else make(family)


def prune(model, variant: str):
    """``model`` pruned in place as ``variant`` says (the same surgery on any model of the family)."""
    if variant in ("attn", "ln-residual"):
        surgery.remove_attention(model, BLOCK, "identity" if variant == "attn" else "ln-residual")
    elif variant == "merged":
        surgery.remove_activation(model, BLOCK)
        surgery.merge_mlp(model, BLOCK)
        assert adapter_for(model).is_merged(model, BLOCK)
    elif variant == "dropped":
        surgery.drop_block(model, BLOCK)
    elif variant == "width":
        x = example(2)
        embed = model.embed_dim
        hetprune.get_registry().build("width_pruner", "isomorphic", round_to=4).prune(model, 0.5 * count_macs(model, x), x)
        assert model.patch_embed.proj.out_channels < embed   # the residual width itself is narrower
    return model


@functools.lru_cache(maxsize=None)
def _built(family: str, variant: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prune(dense_model(family), variant).eval()


def built(family: str, variant: str):
    """A fresh copy (checks change models: classifier, grad checkpointing, input size)."""
    return copy.deepcopy(_built(family, variant))


def feature_levels(model) -> tuple[int, ...]:
    return tuple(range(len(model.feature_info)))


@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_forward_and_backward_reach_every_parameter(family, variant):
    """timm's test_model_backward: a training step gives every parameter a gradient."""
    model = built(family, variant).train()
    out = model(example(2))
    out = torch.cat(out) if isinstance(out, tuple) else out   # a distilled DeiT trains with two heads
    out.mean().backward()
    assert torch.isfinite(out).all()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_forward_features_then_forward_head_is_forward(family, variant):
    model, x = built(family, variant), example(2)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_head(model.forward_features(x)), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_forward_intermediates_agree_with_feature_info(family, variant):
    """timm's test_model_forward_intermediates: one intermediate per feature_info level, with its channels;
    the final output equals forward_features, with and without grad checkpointing."""
    model, x = built(family, variant), example(2)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(x, output_fmt="NCHW")
        assert [t.shape[1] for t in intermediates] == [info["num_chs"] for info in model.feature_info]
        torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        model.set_grad_checkpointing()
        torch.testing.assert_close(model.forward_intermediates(x, output_fmt="NCHW")[0], final)


@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_features_only_getter_and_fx_give_what_feature_info_says(family, variant):
    """features_only as timm builds it: the getter (forward_intermediates) and FX (the feature_info modules'
    outputs, traced); FX gives exactly what those modules output in eager mode."""
    model, x = built(family, variant), example(2)
    levels = feature_levels(model)
    channels = [model.feature_info[i]["num_chs"] for i in levels]
    with torch.no_grad():
        getter = FeatureGetterNet(copy.deepcopy(model), out_indices=levels)
        assert [t.shape[1] for t in getter(x)] == channels
        outputs = FeatureGraphNet(copy.deepcopy(model), out_indices=levels)(x)
        eager = {}
        for i in levels:
            name = model.feature_info[i]["module"]
            model.get_submodule(name).register_forward_hook(lambda m, i, o, _n=name: eager.__setitem__(_n, o))
        model(x)
    assert [t.shape[-1] for t in outputs] == channels   # tokens (ViTs) or NHWC (Swin): channels last
    for i, out in zip(levels, outputs):
        assert torch.equal(out, eager[model.feature_info[i]["module"]])


def test_cait_has_no_set_input_size_dense_or_pruned():
    """timm's Cait has none (so the next test leaves CaiT out)."""
    assert not any(hasattr(built("cait", v), "set_input_size") for v in variants("cait"))


@pytest.mark.parametrize("family,variant", [c for c in CASES if c[0] != "cait"],
                         ids=[i for c, i in zip(CASES, IDS) if c[0] != "cait"])
def test_set_input_size_works_where_dense_has_it(family, variant):
    """A removed attention or a dropped block holds nothing that depends on the resolution: resizing the pruned
    model computes what pruning the resized dense model does."""
    model = built(family, variant)
    big = torch.randn(2, 1, 24, 24, generator=torch.Generator().manual_seed(3))
    model.set_input_size(img_size=(24, 24))
    with torch.no_grad():
        out = model(big)
        assert out.shape == (2, 10)
        if variant not in ("dense", "width"):   # width: which channels go depends on the weights resized
            resized = dense_model(family)
            resized.set_input_size(img_size=(24, 24))
            torch.testing.assert_close(out, prune(resized, variant).eval()(big))



@pytest.mark.parametrize("family", ["beit", "relpos"])
def test_a_block_dropped_after_its_attention_went_still_resizes(family):
    """The stand-in BEiT's and relpos's input-size walk needs is given by the family of the block replaced,
    also when what is replaced is already a stand-in."""
    model = dense_model(family)
    surgery.remove_attention(model, BLOCK)
    surgery.drop_block(model, BLOCK)
    model.set_input_size(img_size=(24, 24))
    assert model(torch.randn(2, 1, 24, 24)).shape == (2, 10)

@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_torchscript_computes_what_eager_does(family, variant):
    model, x = built(family, variant), example(2)
    scripted = torch.jit.script(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x))


@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_torch_export_computes_what_eager_does(family, variant):
    model, x = built(family, variant), example(2)
    exported = torch.export.export(model, (x,)).module()
    with torch.no_grad():
        torch.testing.assert_close(exported(x), model(x))


@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_grad_checkpointing_keeps_the_output(family, variant):
    """timm's test_model_forward: grad checkpointing changes no output, in eval and in a training step."""
    model, x = built(family, variant), example(2)
    with torch.no_grad():
        before = model(x)
        model.set_grad_checkpointing()
        torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-5)
    model.train()
    out = model(x)
    (torch.cat(out) if isinstance(out, tuple) else out).mean().backward()


@pytest.mark.parametrize("family,variant", CASES, ids=IDS)
def test_reset_classifier_fits_the_pruned_width(family, variant):
    """timm's test_model_default_cfgs: a new head takes the model's features; with none, the pooled features
    are num_features wide (after width pruning too)."""
    model, x = built(family, variant), example(2)
    model.reset_classifier(5)
    with torch.no_grad():
        out = model(x)
        assert (torch.cat(out) if isinstance(out, tuple) else out).shape[-1] == 5
        model.reset_classifier(0)
        assert model(x).shape == (2, model.num_features)
        assert model.forward_head(model.forward_features(x), pre_logits=True).shape[-1] == model.num_features


# -- the limit: stand-ins for families outside timm take any arguments ---------------------------------------------
@pytest.mark.parametrize("kind", ["attn", "dropped"])
def test_a_stand_in_that_takes_any_arguments_refuses_torchscript_with_a_clear_error(kind):
    """A user's own transformer (the generic adapter; here a timm ViT served by it) gets blocks that take any
    arguments, as its blocks may be called: TorchScript cannot compile those, and says so; torch.export can."""
    from hetprune import BlockLayout, HetpruneError
    from hetprune.model.adapters import generic, serving

    model, x = make("vit"), example(2)
    torch.jit.script(model)   # the dense model scripts
    with serving(generic("blocks", BlockLayout())):
        if kind == "attn":
            surgery.remove_attention(model, BLOCK)
        else:
            surgery.drop_block(model, BLOCK)
    stand_in = model.blocks[BLOCK]
    assert type(stand_in).__name__ == {"attn": "EagerHetBlock", "dropped": "EagerDroppedBlock"}[kind]
    with pytest.raises(HetpruneError, match=f"torch.jit.script cannot compile a {type(stand_in).__name__}"):
        torch.jit.script(model)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.export(model, (x,)).module()(x), model(x))
