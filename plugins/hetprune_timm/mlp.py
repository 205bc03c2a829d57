"""timm's gated MLPs, and what removing their gate leaves.

``GluMlp`` (and ``SwiGLUPacked``) computes ``fc2(norm(u * act(g)))`` with
``u`` and ``g`` the two halves of one packed ``fc1``; ``SwiGLU`` keeps them in
``fc1_x`` and ``fc1_g``. Removing the activation alone would leave ``u * g``,
still quadratic; hetprune's activation removal removes the *gate*:
``act(g) -> 1``, so the MLP becomes ``fc2(norm(u))``, linear (and mergeable
when ``norm`` is the identity).
"""

from __future__ import annotations

import torch
from timm.layers import GluMlp, SwiGLU
from torch import nn

from hetprune import HetpruneError
from hetprune.plugin_api import surgery

GATED = (GluMlp, SwiGLU)


def is_gated(mlp: nn.Module) -> bool:
    return isinstance(mlp, GATED)


def _rows(layer: nn.Linear, rows: slice) -> nn.Linear:
    out = nn.Linear(layer.in_features, rows.stop - rows.start, bias=layer.bias is not None)
    out = out.to(device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(layer.weight[rows])
        if layer.bias is not None:
            out.bias.copy_(layer.bias[rows])
    return out


def ungate(mlp: nn.Module) -> surgery.LinearMlp:
    """``mlp`` without its gate: ``fc2(norm(u(x)))``."""
    if isinstance(mlp, SwiGLU):
        return surgery.LinearMlp(mlp.fc1_x, mlp.fc2, mlp.norm)
    if getattr(mlp, "chunk_dim", -1) != -1:
        raise HetpruneError(f"a GluMlp chunked along dim {mlp.chunk_dim} (a conv MLP) has no linear form here")
    hidden = mlp.fc1.out_features // 2
    value = slice(0, hidden) if mlp.gate_last else slice(hidden, 2 * hidden)
    return surgery.LinearMlp(_rows(mlp.fc1, value), mlp.fc2, mlp.norm)
