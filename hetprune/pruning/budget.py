"""Budgets: how much to remove, as a site count or as a cost target, and the
feasible (n_attn, n_act) splits each one allows.

A cost target is counted by a cost model (``hetprune.pruning.cost_choice``): MACs for
``--target-macs``, measured time for ``--target-latency``, and either for
``--target-speedup`` (``--cost-model``). It is turned into splits with each
kind's mean per-site saving (merging included; every block of a kind removed
at once, divided by the depth) and, where removing both sites of a block
saves less than the two alone (time: a block's fixed overhead), the worst
case of how the sites may fall on blocks. The splits kept are those that meet
the target and would miss it with one removal fewer of either kind.

Mean savings assume identical blocks (not so for Swin stages or width-pruned
models), so the pipeline checks the pruned model's own cost after selection
(`reached_cost`) and removes more sites, the kind that saves more first
(`kinds_by_saving`), until the target is met or no site left saves any.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..model import surgery
from ..model.macs import count_macs
from ..core.errors import BudgetUnreachable, HetpruneError, on_command_line, option
from ..model.adapters import adapter_for
from ..model.sites import Site, depth


class _Source(str):
    """Text that is Python source already: its repr is itself (no quotes)."""

    def __repr__(self) -> str:
        return str(self)


@dataclass(frozen=True)
class Budget:
    sites: int | None = None
    target_macs: float | None = None      # a fraction of dense (<= 1) or absolute MACs (> 1)
    target_speedup: float | None = None   # dense cost / S, in the budget's cost model
    target_latency: float | None = None   # seconds per forward pass (at the latency model's batch size)
    cost_model: str | None = None         # what a speedup or latency target counts (None: MACs, or latency)

    # the smallest absolute MAC count a target can mean: any value between 1 and this is a mistake
    MIN_ABSOLUTE_MACS = 1000

    def __post_init__(self):
        given = [v for v in (self.sites, self.target_macs, self.target_speedup, self.target_latency)
                 if v is not None]
        if len(given) != 1:
            raise HetpruneError(f"give exactly one budget: {option('budget', 'K')}, {option('target-macs', 'F')}, "
                                f"{option('target-speedup', 'S')} or {option('target-latency', 'T')}")
        if self.sites is not None and (isinstance(self.sites, bool) or not isinstance(self.sites, int)):
            raise HetpruneError(f"{option('budget')} must be a whole number of sites, got {self.sites!r}")
        for name in ("target_macs", "target_speedup", "target_latency"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise HetpruneError(f"{option(name.replace('_', '-'))} must be a finite number, got {value!r}")
        if self.sites is not None and self.sites < 0:
            raise HetpruneError(f"{option('budget')} must be a count of sites >= 0, got {self.sites}")
        if self.target_macs is not None and self.target_macs <= 0:
            raise HetpruneError(f"{option('target-macs')} must be > 0 (a fraction of dense, or absolute MACs like "
                                f"2.6G), got {self.target_macs}")
        if self.target_macs is not None and 1 < self.target_macs < self.MIN_ABSOLUTE_MACS:
            raise HetpruneError(
                f"{option('target-macs', f'{self.target_macs:g}')} can be read two ways and is neither: as a share "
                f"of the dense model's MACs it must be at most 1 (e.g. 0.6), and as an absolute count of MACs per "
                f"image it would be {self.target_macs:g} MACs, which no model comes near (give at least "
                f"{self.MIN_ABSOLUTE_MACS}, e.g. 2.6e9{' or 2.6G' if on_command_line() else ''})")
        if self.target_speedup is not None and self.target_speedup < 1:
            raise HetpruneError(f"{option('target-speedup')} must be >= 1, got {self.target_speedup}")
        if self.target_latency is not None and self.target_latency <= 0:
            raise HetpruneError(f"{option('target-latency')} must be > 0 seconds, got {self.target_latency}")
        if self.cost_model is not None:
            if not isinstance(self.cost_model, str) or not self.cost_model:
                raise HetpruneError(f"a budget's cost model must be a name, got {self.cost_model!r}")
            if self.sites is not None or self.target_macs is not None:
                raise HetpruneError(f"{option('target-macs')} counts MACs and {option('budget')} counts sites; "
                                    f"{option('cost-model', self.cost_model)} applies to {option('target-speedup')} "
                                    f"and {option('target-latency')}")
            if self.target_latency is not None and self.cost_model == "macs":
                raise HetpruneError(f"{option('target-latency')} is a time: it needs a time cost model "
                                    f"({option('cost-model', 'latency')}), not macs")

    @property
    def counts_cost(self) -> bool:
        return self.sites is None

    @property
    def model_name(self) -> str | None:
        """The cost model this budget is counted in (None for a site count)."""
        if self.sites is not None:
            return None
        if self.target_macs is not None:
            return "macs"
        return self.cost_model or ("latency" if self.target_latency is not None else "macs")

    def describe(self) -> str:
        if self.sites is not None:
            return f"{self.sites} sites"
        if self.target_macs is not None:
            return f"MACs <= {self.target_macs:g}" + (" of dense" if self.target_macs <= 1 else "")
        if self.target_latency is not None:
            return f"latency <= {self.target_latency * 1e3:g} ms (by {self.model_name})"
        return f"speedup >= {self.target_speedup:g}x (by {'MACs' if self.model_name == 'macs' else self.model_name})"

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def as_argument(self):
        """The budget as a Python call passes it, for a results file's ``Command:`` line: the site count
        itself (``budgets=[2]``), else ``Budget(target_macs=0.5)``."""
        if self.sites is not None:
            return self.sites
        return _Source("Budget(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")")


    def limit(self, dense_cost: float) -> float | None:
        """The most a pruned model may cost, in the budget's cost model (None for a site count)."""
        if self.target_macs is not None:
            return self.target_macs * dense_cost if self.target_macs <= 1 else self.target_macs
        if self.target_speedup is not None:
            return dense_cost / self.target_speedup
        return self.target_latency

    def mac_limit(self, dense_macs: int) -> float | None:
        """The MAC limit of a budget counted in MACs (None for a site count)."""
        if self.model_name not in (None, "macs"):
            raise HetpruneError(f"{self.describe()} is a budget in {self.model_name}, not in MACs")
        return self.limit(dense_macs)


_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def parse_latency(text: str) -> float:
    """``"12ms"`` -> 0.012 s; ``"0.5s"``, ``"800us"`` likewise. A unit is required."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|ms|us|µs)\s*", str(text))
    value = math.nan
    if m:
        try:
            value = float(m.group(1)) * _TIME_UNITS[m.group(2)]
        except ValueError:
            pass
    if not math.isfinite(value):
        raise HetpruneError(f"cannot read latency {text!r}: write a time with its unit, like 12ms, 0.5s or 800us")
    return value


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
    """How many more sites of each kind may go (the adapter's rule: all, except one attention
    site must stay in a class-token ViT, otherwise the class token never sees the image), less
    those already removed (a model pruned before, e.g. by an earlier round of hetdpt-plus)."""
    limits = adapter_for(model).max_removals(model)
    gone = {kind: sum(surgery.site_removed(model, Site(b, kind)) for b in range(depth(model))) for kind in limits}
    return {kind: max(0, n - gone[kind]) for kind, n in limits.items()}


CostFn = Callable[[nn.Module, torch.Tensor], float]
PrepareFn = Callable[[list, torch.Tensor], None]


@torch.no_grad()
def kind_savings(model: nn.Module, example: torch.Tensor, merge: bool = True,
                 cost: CostFn | None = None, prepare: PrepareFn | None = None) -> dict[str, float]:
    """Mean cost saved by removing one attention site (``attn``), one activation site (``act``) and both
    sites of one block (``both``), each measured with every such site still present removed at once;
    plus ``dense``, the model's cost (a model pruned before counts only the sites it still has).

    ``prepare`` (a cost model's optional ``prepare(models, example)``) is given the model and its variants
    before any is costed, so a measured cost times them together (a latency table in one session)."""
    cost = cost or count_macs
    present = {kind: [b for b in range(depth(model)) if not surgery.site_removed(model, Site(b, kind))]
               for kind in ("attn", "act")}
    present["both"] = [b for b in present["attn"] if b in present["act"]]
    removers = {"attn": (surgery.remove_attention,), "act": (surgery.remove_activation,),
                "both": (surgery.remove_attention, surgery.remove_activation)}
    variants = {}
    for kind, blocks in present.items():
        if not blocks:
            continue
        variant = copy.deepcopy(model)
        for b in blocks:
            for remove in removers[kind]:
                remove(variant, b)
        if merge and kind != "attn":
            surgery.merge_all(variant, blocks=blocks)
        variants[kind] = variant
    if prepare is not None:
        prepare([model, *variants.values()], example)
    dense = cost(model, example)
    out = {kind: (dense - cost(variants[kind], example)) / len(blocks) if kind in variants else 0.0
           for kind, blocks in present.items()}
    if not present["both"]:   # no block has both sites left: removing both never shares a block
        out["both"] = out["attn"] + out["act"]
    return {**out, "dense": dense}


def site_savings(model: nn.Module, example: torch.Tensor, merge: bool = True) -> dict[str, int]:
    """Mean MACs saved per image by removing one site of each kind (every block of the kind removed
    at once, the saving divided by the depth)."""
    save = kind_savings(model, example, merge=merge)
    return {"attn": int(save["attn"]), "act": int(save["act"])}


def pair_cost(save: dict[str, float], n_blocks: int) -> Callable[[int, int], float]:
    """The most ``(n_attn, n_act)`` removals may cost, from `kind_savings`: where both sites of one
    block save less than the two apart, as many blocks as possible are assumed to lose both."""
    interaction = save["attn"] + save["act"] - save["both"]
    if abs(interaction) <= 1e-9 * abs(save["dense"]):
        interaction = 0.0   # MACs: exactly additive

    def cost(a: int, m: int) -> float:
        shared = min(a, m) if interaction > 0 else max(0, a + m - n_blocks)
        return save["dense"] - a * save["attn"] - m * save["act"] + shared * interaction
    return cost


def feasible_pairs(model: nn.Module, budget: Budget, example: torch.Tensor | None = None,
                   merge: bool = True, cost: CostFn | None = None,
                   prepare: PrepareFn | None = None) -> list[tuple[int, int]]:
    """All (n_attn, n_act) the budget allows, for this model (``cost``: the budget's cost model's ``cost``;
    default MACs; ``prepare``: see `kind_savings`)."""
    limits = max_per_kind(model)
    if budget.sites is not None:
        k = budget.sites
        pairs = [(a, k - a) for a in range(0, k + 1) if a <= limits["attn"] and k - a <= limits["act"]]
        if not pairs:
            raise HetpruneError(f"{option('budget', str(k))} is more than this model can lose: at most {limits['attn']} attention "
                                f"and {limits['act']} activation sites ({limits['attn'] + limits['act']} in all)")
        return pairs
    if example is None:
        raise HetpruneError("a cost budget needs an example input to count costs")
    save = kind_savings(model, example, merge=merge, cost=cost, prepare=prepare)
    dense = save["dense"]
    limit = budget.limit(dense)
    cost_of = pair_cost(save, depth(model))
    pairs = []
    for a in range(limits["attn"] + 1):
        for m in range(limits["act"] + 1):
            if cost_of(a, m) > limit:
                continue
            fewer_a = a > 0 and cost_of(a - 1, m) <= limit
            fewer_m = m > 0 and cost_of(a, m - 1) <= limit
            if not fewer_a and not fewer_m:
                pairs.append((a, m))
    if not pairs:
        best = cost_of(limits["attn"], limits["act"])
        raise BudgetUnreachable(f"no depth pruning meets {budget.describe()}: removing every allowed site leaves "
                            f"{best / dense:.1%} of the dense model's cost; add width pruning (hetdpt-plus) or "
                            "relax the target")
    return pairs


def reached_cost(model: nn.Module, example: torch.Tensor, merge: bool = True, cost: CostFn | None = None,
                 prepare: PrepareFn | None = None) -> float:
    """The cost of a pruned model as it will be saved (its linear MLPs merged where ``merge``, as the run's
    mergers will merge them), counted on a copy: the model itself is left as it is."""
    cost = cost or count_macs
    if merge:
        model = copy.deepcopy(model)
        surgery.merge_all(model)
    if prepare is not None:
        prepare([model], example)
    return cost(model, example)


def kinds_by_saving(model: nn.Module, example: torch.Tensor, merge: bool = True, cost: CostFn | None = None,
                    prepare: PrepareFn | None = None) -> list[str]:
    """The kinds of which one more site may go and saves cost on this model, the larger mean saving first:
    what to remove next when the chosen sites saved less than the budget's plan assumed."""
    room = max_per_kind(model)
    save = kind_savings(model, example, merge=merge, cost=cost, prepare=prepare)
    worth = [k for k in ("attn", "act") if room[k] > 0 and save[k] > 1e-9 * abs(save["dense"])]
    return sorted(worth, key=lambda k: (-save[k], k))
