"""Per-layer widths after width pruning, for any family whose adapter supports it.

A recipe's ``widths`` says every shape that differs from the base model (see
the adapter's documentation for its form; for the timm ViT family:
``{"embed_dim": E, "blocks": [{"attn": {"heads", "head_dim"} | "removed",
"mlp": {"hidden"} | "merged"} | "dropped", ...]}``). These functions ask the
model's adapter; a family without width support is one clear error.
"""

from __future__ import annotations

from torch import nn

from .adapters import WidthInfo, adapter_for
from .errors import HetpruneError


def _width_adapter(model: nn.Module):
    adapter = adapter_for(model)
    if not adapter.supports.get("width"):
        raise HetpruneError(f"width pruning is not supported for the {adapter.name} family yet "
                            f"({type(model).__name__}); depth pruning and merging are")
    return adapter


def read_widths(model: nn.Module) -> dict:
    """The widths of every layer of a (width-)pruned model, as plain JSON data."""
    return _width_adapter(model).read_widths(model)


def apply_widths(model: nn.Module, widths: dict, compute: bool = False) -> nn.Module:
    """Give a fresh base model (depth surgery already replayed) the recorded widths, in place."""
    _width_adapter(model).apply_widths(model, widths, compute=compute)
    return model


def width_info(model: nn.Module) -> WidthInfo:
    """What a width pruner needs to know about ``model``."""
    return _width_adapter(model).width_info(model)
