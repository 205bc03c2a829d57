"""Site gates: every candidate site computes m·f(x) + (1−m)·x.

Each site's gate sits on the gate point its model's adapter names: the
attention module (``m·attn(x)``, so the branch is scaled) or the activation
(``m·act(h) + (1−m)·h``; for a gated MLP ``m·act(g) + (1−m)·1``), blending the
module's output with what it yields once the site is removed. ``m`` is a hard 0/1 mask in the forward pass; with
the straight-through estimator a scalar score behind each gate receives the
gradient ∂L/∂m = ⟨f(x) − x, ∂L/∂y⟩, the first-order Taylor estimate of what
removing the site does to the loss.

The gate bank is a submodule of the model (``model.hetprune_gates``), so its
scores and mask are in the state dict and a resumed run keeps them.
"""

from __future__ import annotations

import torch
from torch import nn

from hetprune import Site
from hetprune.plugin_api import adapters

GATE_ATTR = "hetprune_gates"


class GateBank(nn.Module):
    def __init__(self, candidates: list[Site], init: float = 0.0):
        super().__init__()
        self.sites = list(candidates)
        self.scores = nn.Parameter(torch.full((len(self.sites),), float(init)))
        self.register_buffer("mask", torch.ones(len(self.sites)))
        self.index = {s: i for i, s in enumerate(self.sites)}

    def gate(self, site: Site) -> torch.Tensor:
        i = self.index[site]
        score = self.scores[i]
        # forward value: the hard mask; backward: d(gate)/d(score) = 1 (straight-through)
        return self.mask[i] + score - score.detach()

    def active(self, kind: str | None = None) -> list[Site]:
        return [s for s in self.sites if self.mask[self.index[s]] > 0 and (kind is None or s.kind == kind)]

    def switch_off(self, site: Site) -> None:
        self.mask[self.index[site]] = 0.0

    def score_of(self, site: Site) -> float:
        return float(self.scores[self.index[site]].detach())


def install(model: nn.Module, candidates: list[Site], init: float = 0.0,
            attn_mode: str = "identity") -> tuple[GateBank, list]:
    """Add a gate bank and forward hooks to ``model``; returns the bank and hook handles.

    ``attn_mode`` is the configured attention removal (``identity`` or
    ``ln-residual``): a gate simulates exactly the removal the remover will do.
    """
    ref = next(model.parameters())
    bank = GateBank(candidates, init).to(device=ref.device, dtype=ref.dtype)
    setattr(model, GATE_ATTR, bank)
    adapter = adapters.adapter_for(model)
    handles = []
    for site in candidates:
        module, removed = adapter.gate_point(model, site.block, site.kind, attn_mode)

        def hook(module, inputs, output, _site=site, _removed=removed):
            m = bank.gate(_site)
            return m * output + (1 - m) * _removed(inputs, output)

        handles.append(module.register_forward_hook(hook))
    return bank, handles


def uninstall(model: nn.Module, handles: list) -> None:
    for h in handles:
        h.remove()
    if hasattr(model, GATE_ATTR):
        delattr(model, GATE_ATTR)
