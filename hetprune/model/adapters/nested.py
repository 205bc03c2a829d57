"""A model an adapter knows, inside a larger module: a ViT backbone under the user's own
detection or segmentation head. `Nested` gives every operation of the inner adapter on the
submodule at ``path``; `find_nested` finds the outermost such submodule."""

from __future__ import annotations

from torch import nn

from .base import Adapter


# the Adapter operations that take the model as their first argument
_MODEL_METHODS = (
    "check", "block_slots", "blocks", "set_block", "max_removals", "removed", "attn_mode", "remove_attention",
    "remove_activation", "drop_block", "linear_mlp", "is_merged", "merge_mlp", "norm_folded", "gate_point",
    "stream_points", "branch_weights", "time_parts", "arch", "explicit_attention",
)


class Nested(Adapter):
    """``inner``'s operations on the submodule at ``path`` (a backbone inside the user's model)."""

    supports = {"depth": True, "merge": True, "width": False}

    def __init__(self, inner: Adapter, path: str):
        self.inner, self.path = inner, path
        self.name = f"{inner.name}@{path}"
        self.description = f"{inner.description}, as the submodule {path!r}"
        self.supports = {**inner.supports, "width": False}

    def matches(self, model: nn.Module) -> bool:
        try:
            return self.inner.matches(model.get_submodule(self.path))
        except AttributeError:
            return False

    def __getattribute__(self, name: str):
        if name in _MODEL_METHODS:
            inner, path = object.__getattribute__(self, "inner"), object.__getattribute__(self, "path")
            method = getattr(inner, name)
            return lambda model, *args, **kwargs: method(model.get_submodule(path), *args, **kwargs)
        return object.__getattribute__(self, name)

    def is_attention(self, module):
        return self.inner.is_attention(module)

    def attention_macs(self, module, inputs):
        return self.inner.attention_macs(module, inputs)


def find_nested(model: nn.Module, candidates: list[Adapter]) -> Adapter | None:
    """A `Nested` adapter for the outermost submodule of ``model`` that one of ``candidates`` matches."""
    for path, module in model.named_modules():
        if not path:
            continue
        for adapter in candidates:
            if adapter.matches(module):
                return Nested(adapter, path)
    return None
