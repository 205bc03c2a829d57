"""Exact, in-place surgery on timm ViT blocks: the primitives every remover and
merger is built from, and what a recipe replays.

* Attention removal swaps the block for a :class:`HetBlock` that skips the
  attention branch: ``identity`` (default: norm1, attn and ls1 are gone) or
  ``ln-residual`` (the reference release: ``x + norm1(x)``).
* Activation removal swaps the MLP's activation for :class:`RemovedActivation`,
  so the MLP is ``fc2(fc1(x))``.
* Merging replaces such an MLP with :class:`MergedMlp`, one ``D x D`` linear
  ``(W2 W1, W2 b1 + b2)``, where that lowers MACs for the layer's actual widths;
  LayerScale ``ls2`` is folded in, and optionally norm2's affine too.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from .errors import HetpruneError
from .sites import Site, blocks_of, check_site

ATTN_MODES = ("identity", "ln-residual")


class HetBlock(nn.Module):
    """A pre-norm ViT block whose attention branch may be gone.

    Keeps timm's child names (``norm1``, ``attn``, ``ls1``, ``norm2``, ``mlp``,
    ``ls2``...) so state-dict keys of the kept parts do not change.
    """

    def __init__(self, block: nn.Module, attn_mode: str):
        super().__init__()
        if attn_mode not in ATTN_MODES:
            raise HetpruneError(f"attention removal mode must be one of {ATTN_MODES}, got {attn_mode!r}")
        self.attn_mode = attn_mode
        if attn_mode == "ln-residual":
            self.norm1 = block.norm1
        self.norm2 = block.norm2
        self.mlp = block.mlp
        self.ls2 = getattr(block, "ls2", nn.Identity())
        self.drop_path2 = getattr(block, "drop_path2", nn.Identity())

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        if self.attn_mode == "ln-residual":
            x = x + self.norm1(x)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))

    def extra_repr(self) -> str:
        return f"attention removed ({self.attn_mode})"


class DroppedBlock(nn.Module):
    """A whole block removed (classic depth pruning): the block is the identity."""

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        return x


class RemovedActivation(nn.Identity):
    """Marks an MLP whose activation was removed: the MLP is now linear."""


class MergedMlp(nn.Module):
    """``fc2(fc1(x))`` folded into one linear layer (``fc``)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def site_removed(model: nn.Module, site: Site) -> bool:
    block = blocks_of(model)[site.block]
    if isinstance(block, DroppedBlock):
        return True
    if site.kind == "attn":
        return isinstance(block, HetBlock)
    return isinstance(block.mlp, MergedMlp) or isinstance(getattr(block.mlp, "act", None), RemovedActivation)


def attn_mode_of(model: nn.Module, block: int) -> str | None:
    b = blocks_of(model)[block]
    return b.attn_mode if isinstance(b, HetBlock) else None


def remove_attention(model: nn.Module, block: int, mode: str = "identity") -> None:
    site = Site(block, "attn")
    check_site(model, site)
    if site_removed(model, site):
        raise HetpruneError(f"site {site} is already removed")
    blocks = blocks_of(model)
    blocks[block] = HetBlock(blocks[block], mode)


def drop_block(model: nn.Module, block: int) -> None:
    """Remove block ``block`` entirely (both of its sites and everything else in it)."""
    check_site(model, Site(block, "attn"))
    blocks = blocks_of(model)
    if isinstance(blocks[block], DroppedBlock):
        raise HetpruneError(f"block {block} is already dropped")
    blocks[block] = DroppedBlock()


def dropped_blocks(model: nn.Module) -> list[int]:
    return [i for i, b in enumerate(blocks_of(model)) if isinstance(b, DroppedBlock)]


def remove_activation(model: nn.Module, block: int) -> None:
    site = Site(block, "act")
    check_site(model, site)
    if site_removed(model, site):
        raise HetpruneError(f"site {site} is already removed")
    blocks_of(model)[block].mlp.act = RemovedActivation()


def merge_pays(mlp: nn.Module) -> bool:
    """True when one ``in x out`` linear costs fewer MACs than ``fc1`` + ``fc2``."""
    d_in, hidden, d_out = mlp.fc1.in_features, mlp.fc1.out_features, mlp.fc2.out_features
    return d_in * d_out < hidden * (d_in + d_out)


def mergeable(model: nn.Module, block: int) -> bool:
    b = blocks_of(model)[block]
    if isinstance(b, DroppedBlock):
        return False
    mlp = b.mlp
    return (
        isinstance(getattr(mlp, "act", None), RemovedActivation)
        and isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity)
        and merge_pays(mlp)
    )


@torch.no_grad()
def merge_mlp(model: nn.Module, block: int, fold_norm: bool = False) -> dict:
    """Merge block ``block``'s linear MLP into one layer; returns what was folded.

    Computed in float64 and cast back, so the merged layer is as exact as the
    dtype allows. LayerScale ``ls2`` is always folded in (it is linear too);
    ``fold_norm`` also folds norm2's affine, leaving a plain normalisation.
    """
    check_site(model, Site(block, "act"))
    b = blocks_of(model)[block]
    mlp = b.mlp
    if isinstance(mlp, MergedMlp):
        raise HetpruneError(f"block {block}'s MLP is already merged")
    if not isinstance(getattr(mlp, "act", None), RemovedActivation):
        raise HetpruneError(f"block {block}'s MLP still has its activation: remove site act{block} before merging")
    if not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
        raise HetpruneError(f"block {block}'s MLP has a norm between fc1 and fc2; it is not linear and cannot be merged")
    fc1, fc2 = mlp.fc1, mlp.fc2
    dtype, device = fc1.weight.dtype, fc1.weight.device
    w1, w2 = fc1.weight.double(), fc2.weight.double()
    b1 = fc1.bias.double() if fc1.bias is not None else torch.zeros(w1.shape[0], dtype=torch.float64, device=device)
    b2 = fc2.bias.double() if fc2.bias is not None else torch.zeros(w2.shape[0], dtype=torch.float64, device=device)
    weight, bias = w2 @ w1, w2 @ b1 + b2
    folded = {"layerscale": False, "norm": False}
    ls2 = getattr(b, "ls2", None)
    if ls2 is not None and hasattr(ls2, "gamma"):
        g = ls2.gamma.double()
        weight, bias = g[:, None] * weight, g * bias
        b.ls2 = nn.Identity()
        folded["layerscale"] = True
    norm = b.norm2
    if fold_norm and isinstance(norm, nn.LayerNorm) and norm.elementwise_affine:
        gamma = norm.weight.double()
        beta = norm.bias.double() if norm.bias is not None else torch.zeros_like(gamma)
        bias = weight @ beta + bias
        weight = weight * gamma[None, :]
        b.norm2 = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, elementwise_affine=False).to(device)
        folded["norm"] = True
    merged = MergedMlp(weight.shape[1], weight.shape[0]).to(device=device, dtype=dtype)
    merged.fc.weight.copy_(weight.to(dtype))
    merged.fc.bias.copy_(bias.to(dtype))
    b.mlp = merged
    return folded


def prepare_merge(model: nn.Module, block: int, fold_norm: bool) -> None:
    """Give ``block`` the merged structure without computing weights (recipe replay)."""
    b = blocks_of(model)[block]
    mlp = b.mlp
    d_in, d_out = mlp.fc1.in_features, mlp.fc2.out_features
    if hasattr(getattr(b, "ls2", None), "gamma"):
        b.ls2 = nn.Identity()
    if fold_norm and isinstance(b.norm2, nn.LayerNorm) and b.norm2.elementwise_affine:
        norm = b.norm2
        b.norm2 = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, elementwise_affine=False)
    b.mlp = MergedMlp(d_in, d_out)


def merge_all(model: nn.Module, fold_norm: bool = False, blocks: Iterable[int] | None = None) -> dict[int, dict]:
    """Merge every mergeable MLP (or those in ``blocks``); returns ``{block: folded}``."""
    todo = range(len(blocks_of(model))) if blocks is None else blocks
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
    """Largest absolute difference between two models' outputs on ``inputs``."""
    return (reference(inputs) - candidate(inputs)).abs().max().item()


def check_exact(reference, candidate, inputs: torch.Tensor, tol: float) -> float:
    """Raise when a merge or fold changed the function by more than ``tol``."""
    err = max_abs_error(reference, candidate, inputs)
    if not err <= tol:
        raise HetpruneError(f"merge changed the model's outputs: max abs error {err:.3g} > tolerance {tol:.3g}")
    return err
