"""Per-layer widths after width pruning, for any family whose adapter supports it.

A recipe's ``widths`` says every shape that differs from the base model (see
the adapter's documentation for its form; for the timm ViT family:
``{"embed_dim": E, "blocks": [{"attn": {"heads", "head_dim"} | "removed",
"mlp": {"hidden"} | "merged"} | "dropped", ...]}``, ``hidden`` being fc2's
inputs: the width of each half of a gated MLP). These functions ask the
model's adapter; a family without width support is one clear error.
"""

from __future__ import annotations

from torch import nn

from .adapters import WidthInfo, adapter_for
from ..core.errors import HetpruneError


def _width_adapter(model: nn.Module):
    adapter = adapter_for(model)
    if not adapter.supports.get("width"):
        raise HetpruneError(f"width pruning is not supported for the {adapter.name} family yet "
                            f"({type(model).__name__}); depth pruning and merging are")
    return adapter


KEPT_ATTR = "_hetprune_kept_channels"   # set on a model by track_kept (plain data, not in the state dict)


def read_widths(model: nn.Module) -> dict:
    """The widths of every layer of a (width-)pruned model, as plain JSON data, with the channels
    it kept of its base model when `track_kept` followed its width pruning."""
    widths = _width_adapter(model).read_widths(model)
    kept = getattr(model, KEPT_ATTR, None)
    return {**widths, "kept": kept} if kept is not None else widths


def track_kept(before: nn.Module, after: nn.Module) -> None:
    """Record on ``after`` which channels of the base model it kept (``after`` is ``before`` width-pruned).

    Composes with what ``before`` already kept, so several width prunings in a
    row (with depth pruning between them) still point into the base model.
    """
    adapter = _width_adapter(after)
    kept = adapter.kept_channels(before, after)
    earlier = getattr(before, KEPT_ATTR, None)
    setattr(after, KEPT_ATTR, adapter.compose_kept(earlier, kept) if earlier is not None else kept)


def apply_widths(model: nn.Module, widths: dict, compute: bool = False, merge_pending: bool = False) -> nn.Module:
    """Give a fresh base model (depth surgery already replayed) the recorded widths, in place
    (``merge_pending``: the MLPs to merge are still linear, and merged afterwards)."""
    _width_adapter(model).apply_widths(model, widths, compute=compute, merge_pending=merge_pending)
    if widths.get("kept") is not None:  # a reloaded model still knows which base channels it holds
        setattr(model, KEPT_ATTR, widths["kept"])
    return model


def width_info(model: nn.Module) -> WidthInfo:
    """What a width pruner needs to know about ``model``."""
    return _width_adapter(model).width_info(model)
