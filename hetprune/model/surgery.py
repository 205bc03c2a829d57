"""Exact, in-place surgery: the primitives every remover and merger is built
from, and what a recipe replays. Each asks the model's adapter
([`hetprune.model.adapters`][hetprune.model.adapters]), so it works for every supported family.

* Attention removal swaps the block for a `HetBlock` that skips the
  attention branch: ``identity`` (default: norm1, attn and its scale are gone)
  or ``ln-residual`` (the reference release: ``x + norm1(x)``).
* Activation removal makes the MLP linear: a plain MLP's activation becomes a
  `RemovedActivation` (``fc2(fc1(x))``); a gated MLP
  ``fc2(act(g(x)) * u(x))`` loses its gate and becomes ``fc2(u(x))``
  (`LinearMlp`).
* Merging replaces such an MLP with `MergedMlp`, one ``D x D`` linear
  ``(W2 W1, W2 b1 + b2)``, where that lowers MACs for the layer's actual widths;
  a LayerScale module is folded in, and optionally norm2's affine too.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from ..core import tensors
from ..core.devices import full_fp32
from .adapters import adapter_for
from ..core.errors import HetpruneError
from .block_modules import ATTN_MODES, merge_pays
from .block_modules import (BlockLayout, DroppedBlock, HetBlock, LinearMlp, MergedMlp,  # noqa: F401  (public names)
                            RemovedActivation)
from .sites import Site, check_site, depth


def site_removed(model: nn.Module, site: Site) -> bool:
    return adapter_for(model).removed(model, site.block, site.kind)


def attn_mode_of(model: nn.Module, block: int) -> str | None:
    return adapter_for(model).attn_mode(model, block)


def _removable(model: nn.Module, site: Site) -> None:
    check_site(model, site)
    if site_removed(model, site):
        raise HetpruneError(f"site {site} is already removed")


def remove_attention(model: nn.Module, block: int, mode: str = "identity") -> None:
    if mode not in ATTN_MODES:
        raise HetpruneError(f"attention removal mode must be one of {ATTN_MODES}, got {mode!r}")
    _removable(model, Site(block, "attn"))
    adapter_for(model).remove_attention(model, block, mode)


def remove_activation(model: nn.Module, block: int) -> None:
    _removable(model, Site(block, "act"))
    adapter_for(model).remove_activation(model, block)


def drop_block(model: nn.Module, block: int) -> None:
    """Remove block ``block`` entirely (both of its sites and everything else in it)."""
    check_site(model, Site(block, "attn"))
    if block in dropped_blocks(model):
        raise HetpruneError(f"block {block} is already dropped")
    adapter_for(model).drop_block(model, block)


def dropped_blocks(model: nn.Module) -> list[int]:
    return [i for i, b in enumerate(adapter_for(model).blocks(model)) if isinstance(b, DroppedBlock)]


def mergeable(model: nn.Module, block: int) -> bool:
    mlp = adapter_for(model).linear_mlp(model, block)
    return mlp is not None and merge_pays(mlp)


def _check_mergeable(model: nn.Module, block: int) -> None:
    check_site(model, Site(block, "act"))
    adapter = adapter_for(model)
    if block in dropped_blocks(model):
        raise HetpruneError(f"block {block} is dropped: it has no MLP to merge")
    if adapter.is_merged(model, block):
        raise HetpruneError(f"block {block}'s MLP is already merged")
    if not adapter.removed(model, block, "act"):
        raise HetpruneError(f"block {block}'s MLP still has its activation: remove site act{block} before merging")
    if adapter.linear_mlp(model, block) is None:
        raise HetpruneError(f"block {block}'s MLP has a norm between fc1 and fc2; it is not linear and cannot be "
                            "merged")


@torch.no_grad()
def merge_mlp(model: nn.Module, block: int, fold_norm: bool = False) -> dict:
    """Merge block ``block``'s linear MLP into one layer; returns what was folded.

    Computed in float64 and cast back, so the merged layer is as exact as the
    dtype allows. A LayerScale module on the MLP branch is always folded in
    (it is linear too); ``fold_norm`` also folds norm2's affine, leaving a
    plain normalisation.
    """
    _check_mergeable(model, block)
    return adapter_for(model).merge_mlp(model, block, fold_norm, compute=True)


def prepare_merge(model: nn.Module, block: int, fold_norm: bool) -> dict:
    """Give ``block`` the merged structure without computing weights (recipe replay)."""
    _check_mergeable(model, block)
    return adapter_for(model).merge_mlp(model, block, fold_norm, compute=False)


def merge_all(model: nn.Module, fold_norm: bool = False, blocks: Iterable[int] | None = None) -> dict[int, dict]:
    """Merge every mergeable MLP (or those in ``blocks``); returns ``{block: folded}``."""
    todo = range(depth(model)) if blocks is None else blocks
    done = {}
    for i in todo:
        if mergeable(model, i):
            done[i] = merge_mlp(model, i, fold_norm=fold_norm)
    return done


@torch.no_grad()
def max_abs_error(
    reference: Callable[[torch.Tensor], torch.Tensor],
    candidate: Callable[[torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
) -> float:
    """Largest absolute difference between two models' outputs on ``inputs`` (over every output tensor), with
    fp32 matmuls in full fp32 (TF32 rounding is not what a merge's exactness is about)."""
    with full_fp32():
        return tensors.max_abs_diff(reference(inputs), candidate(inputs))


def check_exact(reference, candidate, inputs: torch.Tensor, tol: float) -> float:
    """Raise when a merge or fold changed the function by more than ``tol``."""
    err = max_abs_error(reference, candidate, inputs)
    if not err <= tol:
        raise HetpruneError(f"merge changed the model's outputs: max abs error {err:.3g} > tolerance {tol:.3g}")
    return err


def functional_reference(model: nn.Module, removed: Iterable[Site], attn_mode: str = "identity"):
    """A context manager that makes ``model`` compute as if ``removed`` were gone, without surgery.

    Each site's gate point (the attention module, the activation) is hooked to
    yield what the adapter says it yields once removed (zeros; the input; ones
    for a gate). Tests compare real removal against this reference.
    """
    from contextlib import contextmanager

    @contextmanager
    def hooked():
        adapter = adapter_for(model)
        handles = []
        for site in removed:
            module, value = adapter.gate_point(model, site.block, site.kind, attn_mode)
            handles.append(module.register_forward_hook(lambda m, i, o, _v=value: _v(i, o)))
        try:
            yield model
        finally:
            for h in handles:
                h.remove()

    return hooked()
