"""Issue 2, point 8: parameters and MACs, attention matmuls included, cross-checked
against ``torch.utils.flop_counter.FlopCounterMode``.

Convention: MACs per image, 1 MAC = 2 FLOPs; Linear, Conv2d and the two
attention matmuls (q·kᵀ and attn·v). FlopCounterMode counts exactly the same
operations (convolution, addmm/mm, bmm) and ignores the same ones (norms,
softmax, GELU, additions), so FLOPs / 2 must equal our MACs *exactly* —
provided the attention matmuls reach it as matmuls. timm's Attention calls
``F.scaled_dot_product_attention``; on CPU that dispatches to the fused
``aten._scaled_dot_product_flash_attention_for_cpu``, which FlopCounterMode
(torch 2.x) has no formula for and silently counts as 0. So the comparison is
made with the math SDPA backend (or timm's non-fused path), where q·kᵀ and
attn·v are plain ``bmm`` calls; a separate test pins down that the fused CPU
kernel is the only difference.
"""

from __future__ import annotations

import pytest
import timm
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hetprune.model import surgery
from hetprune.model.macs import CONVENTION, cost_summary, count_macs, count_params, human
from hetprune.model.sites import blocks_of
from conftest import TINY_KWARGS, tiny_example

D, H, HIDDEN, DEPTH, CLASSES = 32, 2, 128, 4, 10
PATCHES = (16 // 4) ** 2


def make(**changes):
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", **{**TINY_KWARGS, **changes}).eval()


def prune(model):
    """attn1 removed, act0 + act2 removed and merged, block 3 dropped."""
    surgery.remove_attention(model, 1)
    surgery.remove_activation(model, 0)
    surgery.remove_activation(model, 2)
    surgery.merge_all(model)
    surgery.drop_block(model, 3)
    return model


def analytic_macs(tokens: int, attn_removed=(), merged=(), dropped=()) -> int:
    """MACs per image by hand for the tiny ViT (D=32, 2 heads, hidden 128, 4 blocks, 16 patches)."""
    total = PATCHES * (1 * 4 * 4) * D  # patch embedding: one 4x4x1 -> D conv per patch
    for b in range(DEPTH):
        if b in dropped:
            continue
        if b not in attn_removed:
            total += tokens * D * 3 * D  # qkv
            total += 2 * tokens * tokens * D  # q·kᵀ and attn·v over all heads (H * head_dim = D)
            total += tokens * D * D  # proj
        total += tokens * D * D if b in merged else 2 * tokens * D * HIDDEN
    return total + D * CLASSES  # head, on the pooled token


def flop_counter_macs(model, x) -> float:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return counter.get_total_flops() / 2 / x.shape[0]


def test_macs_by_hand_dense_and_pruned():
    x = tiny_example(2)
    assert count_macs(make(), x) == analytic_macs(PATCHES + 1) == 918_080
    assert count_macs(prune(make()), x) == analytic_macs(PATCHES + 1, attn_removed=[1], merged=[0, 2], dropped=[3])
    # no class token: attention matmuls over 16 tokens, not 17
    assert count_macs(make(class_token=False, global_pool="avg"), x) == analytic_macs(PATCHES)


def test_attention_matmuls_are_counted():
    """q·kᵀ and attn·v are not Linear layers; leaving them out would undercount attention removal."""
    model, x = make(), tiny_example(2)
    linear_and_conv_only = analytic_macs(PATCHES + 1) - DEPTH * 2 * (PATCHES + 1) ** 2 * D
    assert count_macs(model, x) - linear_and_conv_only == DEPTH * 2 * 17 * 17 * D
    removed = make()
    surgery.remove_attention(removed, 0)
    assert count_macs(model, x) - count_macs(removed, x) == 17 * D * 3 * D + 2 * 17 * 17 * D + 17 * D * D


CASES = {
    "dense": lambda: make(),
    "pruned": lambda: prune(make()),
    "ln-residual": lambda: (lambda m: (surgery.remove_attention(m, 2, "ln-residual"), m)[1])(make()),
    "no-class-token": lambda: make(class_token=False, global_pool="avg"),
    "distilled": lambda: timm.create_model("deit_tiny_distilled_patch16_224", **TINY_KWARGS).eval(),
    "unmerged-linear-mlp": lambda: (lambda m: (surgery.remove_activation(m, 1), m)[1])(make()),
}


@pytest.mark.parametrize("key", sorted(CASES))
def test_macs_equal_flop_counter_exactly_with_math_attention(key):
    model, x = CASES[key](), tiny_example(3)
    with sdpa_kernel(SDPBackend.MATH):
        assert flop_counter_macs(model, x) == count_macs(model, x)


def test_macs_equal_flop_counter_exactly_with_timm_unfused_attention():
    model, x = prune(make()), tiny_example(2)
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    assert flop_counter_macs(model, x) == count_macs(model, x)


def test_fused_cpu_attention_is_the_only_thing_flop_counter_misses():
    """With the default fused SDPA on CPU, FlopCounterMode sees every Linear and Conv2d but no attention
    matmul (it has no formula for the CPU flash kernel). The gap must be exactly our attention term; should
    a future torch count the kernel, the two agree outright."""
    model, x = prune(make()), tiny_example(2)
    attention = sum(2 * 17 * 17 * D for b in blocks_of(model) if hasattr(b, "attn"))
    assert attention == 3 * 2 * 17 * 17 * D - 2 * 17 * 17 * D  # blocks 0 and 2 keep attention
    counted = flop_counter_macs(model, x)
    assert counted in (count_macs(model, x), count_macs(model, x) - attention)


def test_macs_are_per_image_and_leave_the_model_as_it_was():
    model = make()
    model.train()
    one, many = count_macs(model, tiny_example(1)), count_macs(model, tiny_example(5))
    assert one == many
    assert model.training  # restored
    hooks = sum(len(m._forward_hooks) for m in model.modules())
    assert hooks == 0  # removed


def test_params_dense_and_pruned():
    model = make()
    by_hand = (
        D * 16 + D  # patch conv
        + D + (PATCHES + 1) * D  # class token, position embedding
        + DEPTH * (2 * D + (3 * D * D + 3 * D) + (D * D + D) + D  # norm1, qkv, proj, ls1
                   + 2 * D + (D * HIDDEN + HIDDEN) + (HIDDEN * D + D) + D)  # norm2, fc1, fc2, ls2
        + 2 * D + D * CLASSES + CLASSES  # final norm, head
    )
    assert count_params(model) == by_hand
    pruned = prune(make())
    attn1 = 2 * D + 3 * D * D + 3 * D + D * D + D + D  # norm1, qkv, proj, ls1
    merge = (D * HIDDEN + HIDDEN + HIDDEN * D + D + D) - (D * D + D)  # fc1, fc2, ls2 -> one D x D layer
    block = attn1 + 2 * D + D * HIDDEN + HIDDEN + HIDDEN * D + D + D
    assert count_params(model) - count_params(pruned) == attn1 + 2 * merge + block


def test_cost_summary_and_human_units():
    model, x = make(), tiny_example(2)
    summary = cost_summary(model, x)
    assert summary == {"params": count_params(model), "macs": count_macs(model, x), "macs_convention": CONVENTION}
    assert "1 MAC = 2 FLOPs" in CONVENTION and "attention" in CONVENTION
    assert [human(n) for n in (17_563_828_224, 918_080, 5_400, 12)] == ["17.6G", "918K", "5.4K", "12"]
