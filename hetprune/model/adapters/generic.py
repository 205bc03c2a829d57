"""An adapter a user gets without writing a plugin: `generic` serves a
pre-norm transformer the user wrote. Say where its blocks are (a dotted path
to a ModuleList) and what a block's children are called (a
[`BlockLayout`][hetprune.model.block_modules.BlockLayout]); hetprune checks the rest (every block
has them, the attention says its geometry) and refuses the model otherwise.
"""

from __future__ import annotations

from torch import nn

from ...core.errors import HetpruneError
from ..block_modules import BlockLayout, DroppedBlock, HetBlock
from .base import PreNormAdapter


class GenericPreNorm(PreNormAdapter):
    """A user's pre-norm transformer: ``x + s1·attn(norm1(x))`` then ``x + s2·mlp(norm2(x))``.

    The attention module must return a tensor shaped like its input and say
    its geometry (``num_heads``, and a ``proj`` Linear reading ``heads x
    head_dim``, or a ``head_dim``), so its two matmuls are counted in MACs;
    the MLP has ``fc1``, the activation and ``fc2``.
    """

    description = "a user-written pre-norm transformer (hetprune.model.adapters.generic)"
    supports = {"depth": True, "merge": True, "width": False}

    def __init__(self, blocks: str, layout: BlockLayout, name: str = "generic"):
        if not isinstance(blocks, str) or not blocks:
            raise HetpruneError(f"generic adapter: blocks must be a dotted module path such as "
                                f"'encoder.layers', got {blocks!r}")
        self.path, self.layout, self.name = blocks, layout, name
        self.attention_types = ()

    def _container(self, model: nn.Module) -> nn.Module:
        try:
            container = model.get_submodule(self.path)
        except AttributeError:
            raise HetpruneError(f"generic adapter: {type(model).__name__} has no submodule {self.path!r} "
                                f"(its top-level children: {', '.join(n for n, _ in model.named_children())})") from None
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            raise HetpruneError(f"generic adapter: {self.path!r} is a {type(container).__name__}, not a "
                                "ModuleList or Sequential of blocks")
        return container

    def matches(self, model: nn.Module) -> bool:
        try:
            container = model.get_submodule(self.path)
        except AttributeError:
            return False
        return isinstance(container, (nn.ModuleList, nn.Sequential)) and len(container) > 0

    def block_slots(self, model):
        container = self._container(model)
        return [(container, str(i)) for i in range(len(container))]

    def check(self, model: nn.Module) -> None:
        L = self.layout
        types = set()
        for i, block in enumerate(self.blocks(model)):
            if isinstance(block, (HetBlock, DroppedBlock)):
                continue
            missing = [n for n in (L.norm1, L.attn, L.norm2, L.mlp) if not isinstance(getattr(block, n, None),
                                                                                     nn.Module)]
            if missing:
                raise HetpruneError(f"generic adapter: block {i} ({type(block).__name__}) has no child "
                                    f"{', '.join(missing)}; say its children's names with BlockLayout(...)")
            mlp = getattr(block, L.mlp)
            if not all(isinstance(getattr(mlp, n, None), nn.Module) for n in ("fc1", L.act, "fc2")):
                raise HetpruneError(f"generic adapter: block {i}'s MLP ({type(mlp).__name__}) needs children "
                                    f"fc1, {L.act} and fc2")
            attn = getattr(block, L.attn)
            try:
                self.attention_geometry(attn)
            except (AttributeError, TypeError, ZeroDivisionError):
                raise HetpruneError(f"generic adapter: block {i}'s attention ({type(attn).__name__}) must have "
                                    "num_heads and a proj Linear (or head_dim), so its matmuls can be "
                                    "counted") from None
            types.add(type(attn))
        # MAC counting finds attention modules by type: the types this model's blocks use
        self.attention_types = tuple(sorted(types | set(self.attention_types), key=lambda t: t.__qualname__))

    def attention_geometry(self, module):
        heads = int(module.num_heads)
        head_dim = getattr(module, "head_dim", None)
        return heads, int(head_dim) if head_dim is not None else int(module.proj.in_features) // heads

    def arch(self, model):
        facts = super().arch(model)
        facts["blocks"] = self.path
        return facts


def generic(blocks: str, layout: BlockLayout | None = None, name: str = "generic") -> GenericPreNorm:
    """An adapter for a user-written pre-norm transformer whose blocks are at ``blocks`` (a dotted path)."""
    return GenericPreNorm(blocks, layout or BlockLayout(), name)
