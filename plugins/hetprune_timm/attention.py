"""What timm's BEiT and EVA attention modules compute outside their layers.

With separate q/v biases (``q_bias``), both apply the fused qkv weight with
``F.linear(x, qkv.weight, cat(q_bias, k_bias, v_bias))`` instead of calling
``qkv``: a forward hook on the ``qkv`` Linear never fires, so its MACs are
counted here, with the attention matmuls.
"""

from __future__ import annotations

from torch import nn


def functional_qkv_macs(module: nn.Module, x) -> int:
    qkv = getattr(module, "qkv", None)
    if qkv is None or getattr(module, "q_bias", None) is None or getattr(module, "qkv_bias_separate", False):
        return 0
    return x.numel() // x.shape[-1] * qkv.in_features * qkv.out_features
