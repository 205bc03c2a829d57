"""Budgets: how much to remove, as a site count or as a cost target, and the
feasible (n_attn, n_act) splits each one allows.

A cost target is turned into splits with each kind's mean per-site MAC saving
(merging included; exact for uniform ViTs, the mean over stages for Swin): the
splits that meet the target and would miss it with one removal fewer of either
kind.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from . import surgery
from .costs import count_macs
from .errors import HetpruneError
from .adapters import adapter_for
from .sites import depth


@dataclass(frozen=True)
class Budget:
    sites: int | None = None
    target_macs: float | None = None      # a fraction of dense (<= 1) or absolute MACs (> 1)
    target_speedup: float | None = None   # turned into a MAC fraction 1/S

    def __post_init__(self):
        given = [v for v in (self.sites, self.target_macs, self.target_speedup) if v is not None]
        if len(given) != 1:
            raise HetpruneError("give exactly one budget: --budget K, --target-macs F or --target-speedup S")
        if self.sites is not None and (isinstance(self.sites, bool) or not isinstance(self.sites, int)):
            raise HetpruneError(f"--budget must be a whole number of sites, got {self.sites!r}")
        for name in ("target_macs", "target_speedup"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise HetpruneError(f"--{name.replace('_', '-')} must be a finite number, got {value!r}")
        if self.sites is not None and self.sites < 0:
            raise HetpruneError(f"--budget must be a count of sites >= 0, got {self.sites}")
        if self.target_macs is not None and self.target_macs <= 0:
            raise HetpruneError(f"--target-macs must be > 0 (a fraction of dense, or absolute MACs like 2.6G), "
                                f"got {self.target_macs}")
        if self.target_speedup is not None and self.target_speedup < 1:
            raise HetpruneError(f"--target-speedup must be >= 1, got {self.target_speedup}")

    def describe(self) -> str:
        if self.sites is not None:
            return f"{self.sites} sites"
        if self.target_macs is not None:
            return f"MACs <= {self.target_macs:g}" + (" of dense" if self.target_macs <= 1 else "")
        return f"speedup >= {self.target_speedup:g}x (by MACs)"

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def mac_limit(self, dense_macs: int) -> float | None:
        if self.target_macs is not None:
            return self.target_macs * dense_macs if self.target_macs <= 1 else self.target_macs
        if self.target_speedup is not None:
            return dense_macs / self.target_speedup
        return None


def parse_macs(text: str) -> float:
    """``"0.6"`` -> 0.6 (fraction); ``"2.6G"`` -> 2.6e9; ``"900M"`` -> 9e8."""
    units = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    t = text.strip().upper()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise HetpruneError(f"cannot read MACs {text!r}: write a fraction like 0.6 or an amount like 2.6G")
    return value


def max_per_kind(model: nn.Module) -> dict[str, int]:
    """How many sites of each kind may go (the adapter's rule: all, except one attention
    site must stay in a class-token ViT, otherwise the class token never sees the image)."""
    return adapter_for(model).max_removals(model)


@torch.no_grad()
def site_savings(model: nn.Module, example: torch.Tensor, merge: bool = True) -> dict[str, int]:
    """Mean MACs saved per image by removing one site of each kind (every block of the kind removed
    at once, the saving divided by the depth)."""
    dense = count_macs(model, example)
    n = depth(model)
    attn = copy.deepcopy(model)
    act = copy.deepcopy(model)
    for b in range(n):
        surgery.remove_attention(attn, b)
        surgery.remove_activation(act, b)
    if merge:
        surgery.merge_all(act)
    return {"attn": (dense - count_macs(attn, example)) // n, "act": (dense - count_macs(act, example)) // n}


def feasible_pairs(model: nn.Module, budget: Budget, example: torch.Tensor | None = None,
                   merge: bool = True) -> list[tuple[int, int]]:
    """All (n_attn, n_act) the budget allows, for this model."""
    limits = max_per_kind(model)
    if budget.sites is not None:
        k = budget.sites
        pairs = [(a, k - a) for a in range(0, k + 1) if a <= limits["attn"] and k - a <= limits["act"]]
        if not pairs:
            raise HetpruneError(f"--budget {k} is more than this model can lose: at most {limits['attn']} attention "
                                f"and {limits['act']} activation sites ({limits['attn'] + limits['act']} in all)")
        return pairs
    if example is None:
        raise HetpruneError("a cost budget needs an example input to count MACs")
    dense = count_macs(model, example)
    save = site_savings(model, example, merge=merge)
    limit = budget.mac_limit(dense)
    pairs = []
    for a in range(limits["attn"] + 1):
        for m in range(limits["act"] + 1):
            cost = dense - a * save["attn"] - m * save["act"]
            if cost > limit:
                continue
            fewer_a = a > 0 and dense - (a - 1) * save["attn"] - m * save["act"] <= limit
            fewer_m = m > 0 and dense - a * save["attn"] - (m - 1) * save["act"] <= limit
            if not fewer_a and not fewer_m:
                pairs.append((a, m))
    if not pairs:
        best = dense - limits["attn"] * save["attn"] - limits["act"] * save["act"]
        raise HetpruneError(f"no depth pruning meets {budget.describe()}: removing every allowed site leaves "
                            f"{best / dense:.1%} of dense MACs; add width pruning (hetdpt-plus) or relax the target")
    return pairs
