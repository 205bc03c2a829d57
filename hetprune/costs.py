"""Counting cost: parameters and MACs (multiply-accumulates, not FLOPs; one MAC
is two FLOPs) per image, for dense and pruned models alike.

Counted: every Linear and Conv2d, and the two attention matmuls (q·kᵀ and
attn·v) of each attention module, as the model's adapter computes them from
the module's input (heads, head dim, tokens; per window for Swin, one query
for CaiT's class attention). Not counted: norms, activations, softmax,
additions (they are a small share and do not map to MACs).
"""

from __future__ import annotations

import torch
from torch import nn

from .adapters import adapter_for

CONVENTION = "MACs per image (1 MAC = 2 FLOPs); Linear, Conv2d and attention matmuls q·kᵀ, attn·v"


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def count_macs(model: nn.Module, example: torch.Tensor) -> int:
    """MACs of one forward pass, per image of ``example`` (a batch of inputs)."""
    total = 0

    def linear_hook(module, inputs, output):
        nonlocal total
        total += output.numel() // module.out_features * module.in_features * module.out_features

    def conv_hook(module, inputs, output):
        nonlocal total
        k = module.kernel_size[0] * module.kernel_size[1]
        total += output.numel() * (module.in_channels // module.groups) * k

    adapter = adapter_for(model)

    def attn_hook(module, inputs, output):
        nonlocal total
        total += adapter.attention_macs(module, inputs) or 0

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
        elif isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        if adapter.is_attention(m):
            handles.append(m.register_forward_hook(attn_hook))
    hooked_forward(model, example, handles)
    return total // example.shape[0]


def hooked_forward(model: nn.Module, x: torch.Tensor, handles: list) -> None:
    """One forward pass of ``model`` on ``x`` in eval mode, for the hooks behind ``handles`` to observe; the
    hooks are removed and the model's train/eval mode restored afterwards, also on error."""
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


def cost_summary(model: nn.Module, example: torch.Tensor) -> dict:
    return {"params": count_params(model), "macs": count_macs(model, example), "macs_convention": CONVENTION}


def human(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"
