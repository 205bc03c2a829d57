"""The adapter contract (`Adapter`) and its implementation for pre-norm blocks.

Of the adapters whose `Adapter.matches` accepts a model, the most
specific serves it, whatever the order they were registered in
(`hetprune.model.adapters.adapter_for` says how specificity is judged).

Most ViT families are pre-norm: ``x + s1·attn(norm1(x))`` then
``x + s2·mlp(norm2(x))``. `PreNormAdapter` implements every operation
for them from a [`BlockLayout`][hetprune.model.block_modules.BlockLayout] (the child names), so a
new pre-norm family is a subclass that says which model and block types it
accepts, where its blocks are and what its children are called. A family of
another shape (Hugging Face's ViT layer, say) overrides the operations.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .. import block_modules
from ...core.errors import HetpruneError
from ..block_modules import (BlockLayout, DroppedBlock, EagerDroppedBlock, EagerHetBlock, HetBlock, LinearMlp,
                             MergedMlp, RemovedActivation)

DOCS = "docs/plugins.md#writing-an-architecture-adapter"


@dataclass
class WidthInfo:
    """What a width pruner needs to know about a model (from `Adapter.width_info`).

    ``attentions``: ``(attention module, its fused qkv linear, heads)``;
    ``ignored_layers``: layers whose outputs are never pruned (classifier
    heads); ``embed_input``: the layer that writes the residual width (frozen
    when the embedding is not pruned); ``unwrapped``: ``(parameter, channel
    dim)`` of bare parameters on the residual width (tokens, LayerScale);
    ``fix_attention(module, heads)``: make an attention's attributes agree with
    its pruned layers; ``sync(model)``: the same for the model's own width
    attributes; ``prepare(model)`` / ``restore(model)``: run just before and
    after the pruner's pass, to show it a form it prunes correctly (timm: a
    packed gated fc1 split in its two halves) and to put the model back.
    """

    attentions: list = field(default_factory=list)
    ignored_layers: list = field(default_factory=list)
    embed_input: nn.Module | None = None
    unwrapped: list = field(default_factory=list)
    fix_attention: Callable = lambda module, heads: None
    sync: Callable = lambda model: None
    prepare: Callable = lambda model: None
    restore: Callable = lambda model: None


class Adapter:
    """The adapter contract (see docs/plugins.md). Subclass `PreNormAdapter` where you can."""

    name = "adapter"
    description = ""
    #: what the family supports: depth (site removal), merge (linear MLP merge), width (width pruning)
    supports = {"depth": True, "merge": True, "width": False}
    #: ``ModelSpec.library`` values this adapter can build (``build``); timm is built by the core
    library: str | None = None
    #: declared precedence: of the adapters that match a model, one of higher priority always serves it
    priority = 0

    def specificity(self, model: nn.Module) -> tuple:
        """How specifically this adapter serves ``model``, compared as a tuple (larger wins; see
        `adapter_for`): its ``priority``, then how near the model's class is to the nearest of its
        ``model_types``, then how near the farthest block's class is to the nearest of its ``block_types``
        (0: the class itself, -1: its parent, ...; no types declared: farthest of all)."""
        model_types = tuple(getattr(self, "model_types", ()) or ())
        block_types = tuple(getattr(self, "block_types", ()) or ())
        blocks = [_original_class(b) for b in self.blocks(model)] if block_types else []
        return (self.priority, -_distance(type(model), model_types),
                -max((_distance(c, block_types) for c in blocks if c is not None), default=0))

    # -- recognising a model ------------------------------------------------------
    def matches(self, model: nn.Module) -> bool:
        raise NotImplementedError

    def check(self, model: nn.Module) -> None:
        """Raise [`HetpruneError`][hetprune.core.errors.HetpruneError] for a model of the family that hetprune cannot prune (e.g. post-norm)."""

    # -- blocks and sites -------------------------------------------------------------
    def block_slots(self, model: nn.Module) -> list[tuple[nn.Module, str]]:
        """``(parent, child name)`` of every block in the fixed global order of sites."""
        raise NotImplementedError

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return [getattr(parent, name) for parent, name in self.block_slots(model)]

    def set_block(self, model: nn.Module, index: int, new: nn.Module) -> None:
        parent, name = self.block_slots(model)[index]
        setattr(parent, name, new)

    def max_removals(self, model: nn.Module) -> dict[str, int]:
        """How many sites of each kind may go (all, unless removing them all would break the model)."""
        n = len(self.block_slots(model))
        return {"attn": n, "act": n}

    # -- surgery -------------------------------------------------------------------------
    def removed(self, model: nn.Module, block: int, kind: str) -> bool:
        raise NotImplementedError

    def attn_mode(self, model: nn.Module, block: int) -> str | None:
        raise NotImplementedError

    def remove_attention(self, model: nn.Module, block: int, mode: str) -> None:
        raise NotImplementedError

    def remove_activation(self, model: nn.Module, block: int) -> None:
        raise NotImplementedError

    def drop_block(self, model: nn.Module, block: int) -> None:
        old = self.blocks(model)[block]
        self.set_block(model, block, _replacing(self.dropped(old), old))

    def dropped(self, block: nn.Module) -> DroppedBlock:
        """What replaces ``block`` when it is dropped: by default one that takes any arguments (a family whose
        blocks take timm's arguments can give a TorchScript-able `DroppedBlock`)."""
        return EagerDroppedBlock()

    def linear_mlp(self, model: nn.Module, block: int) -> nn.Module | None:
        """Block ``block``'s MLP when removal made it linear (``fc1``, ``fc2``, no norm between), else None."""
        raise NotImplementedError

    def is_merged(self, model: nn.Module, block: int) -> bool:
        raise NotImplementedError

    def merge_mlp(self, model: nn.Module, block: int, fold_norm: bool, compute: bool = True) -> dict:
        """Replace the linear MLP by one layer; ``compute=False`` only gives the shapes (recipe replay)."""
        raise NotImplementedError

    def norm_folded(self, model: nn.Module, block: int) -> bool:
        """Whether merged block ``block``'s preceding norm had its affine folded into the merged layer."""
        raise NotImplementedError

    # -- where scorers look -------------------------------------------------------------
    def gate_point(self, model: nn.Module, block: int, kind: str,
                   attn_mode: str = "identity") -> tuple[nn.Module, Callable]:
        """``(module, removed)``: a forward hook on ``module`` may blend its output with
        ``removed(inputs, output)``, which is what the module yields once the site is removed
        (attention: zeros, or for ``ln-residual`` what makes the branch ``norm1(x)``; a plain
        activation: its input; a gate: ones)."""
        raise NotImplementedError

    def stream_points(self, model: nn.Module, block: int) -> tuple[nn.Module, nn.Module]:
        """``(before, after)``: the residual stream enters ``before`` (as its input) and, with the
        attention branch added, enters ``after`` (as its input)."""
        raise NotImplementedError

    def branch_weights(self, model: nn.Module, block: int, kind: str) -> list[torch.Tensor]:
        """The weight matrices a site's branch owns (the ``magnitude`` scorer)."""
        raise NotImplementedError

    def time_parts(self, model: nn.Module, block: int) -> dict[str, list[nn.Module]]:
        """The modules whose forward time is a block's ``attention`` and ``mlp`` parts (``bench --per-block``):
        each branch with its norm; a removed branch is absent."""
        return {}

    def drop_path_slots(self, model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
        """Per block (in `blocks` order), ``(owner, child name)`` of each residual branch's stochastic-depth
        module (a drop path, or the identity standing in for one): where a fine-tune's ``drop_path`` goes.
        Default: none (the adapter cannot set one)."""
        return []

    # -- cost and facts -------------------------------------------------------------------
    def is_attention(self, module: nn.Module) -> bool:
        """Whether ``module`` is an attention module whose matmuls `attention_macs` counts."""
        return False

    def attention_macs(self, module: nn.Module, inputs: tuple) -> int:
        """MACs of the two attention matmuls (q·kᵀ, attn·v) of attention ``module`` for ``inputs``."""
        raise NotImplementedError

    def arch(self, model: nn.Module) -> dict:
        """Shape facts a recipe must agree with (depth, widths)."""
        raise NotImplementedError

    def explicit_attention(self, model: nn.Module):
        """A context in which attention runs as explicit matmuls instead of a fused kernel (the same
        function): a fallback for exporters that cannot trace the fused one. Default: no change."""
        return contextlib.nullcontext()

    # -- width pruning (optional) -----------------------------------------------------------
    def read_widths(self, model: nn.Module) -> dict:
        raise HetpruneError(f"the {self.name} adapter has no width-pruning support yet")

    def apply_widths(self, model: nn.Module, widths: dict, compute: bool = False, merge_pending: bool = False) -> None:
        raise HetpruneError(f"the {self.name} adapter has no width-pruning support yet")

    def width_info(self, model: nn.Module):
        raise HetpruneError(f"the {self.name} adapter has no width-pruning support yet")

    def kept_channels(self, before: nn.Module, after: nn.Module) -> dict:
        """Which channels of ``before`` the width-pruned ``after`` kept (JSON data for the recipe)."""
        raise HetpruneError(f"the {self.name} adapter has no width-pruning support yet")

    def compose_kept(self, first: dict, then: dict) -> dict:
        """`kept_channels` of two width prunings in a row, relative to the model before the first."""
        raise HetpruneError(f"the {self.name} adapter has no width-pruning support yet")

    def build(self, name: str, kwargs: dict) -> nn.Module:
        raise HetpruneError(f"the {self.name} adapter cannot build models")


def _distance(cls: type, types: tuple) -> float:
    """How far up ``cls``'s MRO the nearest of ``types`` is (0: ``cls`` itself); infinite when none is."""
    mro = cls.__mro__
    found = [mro.index(t) for t in types if t in mro]
    return min(found) if found else float("inf")


def _replacing(new: nn.Module, old: nn.Module) -> nn.Module:
    """``new`` (a block with a site removed, or dropped) remembers the class of the block it replaces, so the
    adapter for that class stays the most specific one for the pruned model too."""
    new.replaced_type = _original_class(old)
    return new


def _original_class(block: nn.Module) -> type | None:
    """The family's class of a block (for a HetBlock or DroppedBlock: the block it replaced, None if unknown)."""
    if isinstance(block, (HetBlock, DroppedBlock)):
        return getattr(block, "replaced_type", None)
    return type(block)


def _linear_weights(module: nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in module.modules() if isinstance(m, nn.Linear)]


def attention_matmul_macs(batch: int, heads: int, q_tokens: int, k_tokens: int, head_dim: int) -> int:
    """q·kᵀ and attn·v: each ``batch x heads x q_tokens x k_tokens x head_dim`` MACs."""
    return 2 * batch * heads * q_tokens * k_tokens * head_dim


class PreNormAdapter(Adapter):
    """Every operation for pre-norm blocks, through a [`BlockLayout`][hetprune.model.block_modules.BlockLayout].

    Subclasses set ``model_types`` (the model classes), ``block_types`` (the
    block classes that are sites), ``attention_types`` and ``layout`` (or
    override `layout_of`), and `block_slots` where the blocks are
    not ``model.blocks``.
    """

    model_types: tuple = ()
    block_types: tuple = ()
    attention_types: tuple = ()
    #: block classes of the family hetprune refuses, with the reason
    refused_blocks: dict = {}
    layout = BlockLayout()

    def matches(self, model: nn.Module) -> bool:
        return isinstance(model, self.model_types)

    def check(self, model: nn.Module) -> None:
        blocks = self.blocks(model)
        if not blocks:
            raise HetpruneError(f"{type(model).__name__} has no transformer blocks: nothing to prune")
        for i, block in enumerate(blocks):
            if isinstance(block, (HetBlock, DroppedBlock)):
                continue
            for cls, why in self.refused_blocks.items():
                if isinstance(block, cls):
                    raise HetpruneError(f"{type(model).__name__}: block {i} is a {cls.__name__}: {why}")
            if not isinstance(block, self.block_types):
                raise HetpruneError(f"{type(model).__name__}: block {i} is a {type(block).__name__}, which the "
                                    f"{self.name} adapter does not know (it knows "
                                    f"{', '.join(t.__name__ for t in self.block_types)})")

    def block_slots(self, model: nn.Module) -> list[tuple[nn.Module, str]]:
        return [(model.blocks, str(i)) for i in range(len(model.blocks))]

    def layout_of(self, block: nn.Module) -> BlockLayout:
        return block.layout if isinstance(block, HetBlock) else self.layout

    def max_removals(self, model: nn.Module) -> dict[str, int]:
        n = len(self.block_slots(model))
        class_token = getattr(model, "num_prefix_tokens", 0) > 0 and getattr(model, "global_pool", "") == "token"
        # every attention site gone: the class token never sees the image and the output is constant
        return {"attn": n - 1 if class_token else n, "act": n}

    def _block(self, model: nn.Module, index: int) -> nn.Module:
        return self.blocks(model)[index]

    def drop_path_slots(self, model):
        from timm.layers import DropPath

        out = []
        for b in self.blocks(model):
            L = self.layout_of(b)
            names = dict.fromkeys(n for n in (L.drop_path1, L.drop_path2) if n)   # CaiT: one for both
            out.append([(b, n) for n in names if isinstance(getattr(b, n, None), (nn.Identity, DropPath))])
        return out

    def _mlp(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.layout_of(block).mlp)

    # -- surgery ---------------------------------------------------------------------------
    def removed(self, model, block, kind):
        b = self._block(model, block)
        if isinstance(b, DroppedBlock):
            return True
        if kind == "attn":
            return isinstance(b, HetBlock)
        mlp = self._mlp(b)
        return isinstance(mlp, MergedMlp) or isinstance(getattr(mlp, self._act_name(mlp), None), RemovedActivation)

    def _act_name(self, mlp: nn.Module) -> str:
        return "act" if isinstance(mlp, LinearMlp) else self.layout.act

    def attn_mode(self, model, block):
        b = self._block(model, block)
        return b.attn_mode if isinstance(b, HetBlock) else None

    def remove_attention(self, model, block, mode):
        b = self._block(model, block)
        self.set_block(model, block, _replacing(self.attention_removed(b, mode), b))

    def attention_removed(self, block: nn.Module, mode: str) -> HetBlock:
        """What replaces ``block`` when its attention is removed: by default an `EagerHetBlock` (any child
        names, any arguments); timm's families give the TorchScript-able `HetBlock`."""
        return EagerHetBlock(block, self.layout_of(block), mode)

    def remove_activation(self, model, block):
        b = self._block(model, block)
        name = self.layout_of(b).mlp
        mlp = getattr(b, name)
        if self.is_gated(mlp):
            setattr(b, name, self.ungate(mlp))
        else:
            setattr(mlp, self._act_name(mlp), RemovedActivation())

    # gated MLPs: act(g(x)) * u(x); removing the activation removes the gate, leaving u(x)
    def is_gated(self, mlp: nn.Module) -> bool:
        return False

    def ungate(self, mlp: nn.Module) -> LinearMlp:
        raise HetpruneError(f"the {self.name} adapter cannot remove the gate of a {type(mlp).__name__}")

    def linear_mlp(self, model, block):
        b = self._block(model, block)
        if isinstance(b, DroppedBlock):
            return None
        mlp = self._mlp(b)
        return mlp if block_modules.is_linear_mlp(mlp, self._act_name(mlp)) else None

    def is_merged(self, model, block):
        b = self._block(model, block)
        return not isinstance(b, DroppedBlock) and isinstance(self._mlp(b), MergedMlp)

    def merge_mlp(self, model, block, fold_norm, compute=True):
        b = self._block(model, block)
        L = self.layout_of(b)
        mlp = getattr(b, L.mlp)
        scale = getattr(b, L.mlp_scale, None) if L.mlp_scale else None
        gamma = scale.gamma if isinstance(getattr(scale, "gamma", None), torch.Tensor) else None
        norm = getattr(b, L.norm2)
        fold = fold_norm and block_modules.foldable_norm(norm)
        if compute:
            weight, bias = block_modules.merged_weights(mlp.fc1, mlp.fc2, gamma, norm if fold else None)
            merged = block_modules.merged_mlp(weight, bias, mlp.fc1)
        else:
            # shaped for the saved weights, on the base's device and in its dtype (float64 models reload too)
            merged = MergedMlp(mlp.fc1.in_features, mlp.fc2.out_features).to(device=mlp.fc1.weight.device,
                                                                               dtype=mlp.fc1.weight.dtype)
        if gamma is not None:  # a LayerScale module is folded in; a bare gamma parameter stays (it is cheap)
            setattr(b, L.mlp_scale, nn.Identity())
        if fold:
            setattr(b, L.norm2, block_modules.plain_norm(norm))
        setattr(b, L.mlp, merged)
        return {"layerscale": gamma is not None, "norm": fold}

    def norm_folded(self, model, block):
        b = self._block(model, block)
        norm = getattr(b, self.layout_of(b).norm2)
        return self.is_merged(model, block) and isinstance(norm, nn.LayerNorm) and not norm.elementwise_affine

    # -- scorers ---------------------------------------------------------------------------------
    def gate_point(self, model, block, kind, attn_mode="identity"):
        b = self._block(model, block)
        if kind == "attn" and attn_mode == "ln-residual":
            # the branch becomes norm1(x), the attention's own input; the scale after it is divided out
            scale = self._attn_scale(b)
            if scale is not None and bool((scale.detach().abs() < 1e-6).any()):
                raise HetpruneError(f"block {block}: a LayerScale entry is ~0, so gates cannot simulate "
                                    "ln-residual removal there; use attn-identity")
            return getattr(b, self.layout_of(b).attn), (
                lambda inputs, output: inputs[0] if scale is None else inputs[0] / scale)
        if kind == "attn":
            return getattr(b, self.layout_of(b).attn), lambda inputs, output: torch.zeros_like(output)
        mlp = self._mlp(b)
        if self.is_gated(mlp):
            return mlp.act, lambda inputs, output: torch.ones_like(output)
        return getattr(mlp, self._act_name(mlp)), lambda inputs, output: inputs[0]

    def _attn_scale(self, b: nn.Module) -> torch.Tensor | None:
        name = self.layout_of(b).attn_scale
        scale = getattr(b, name, None) if name else None
        if isinstance(scale, nn.Module):
            scale = getattr(scale, "gamma", None)
        return scale if isinstance(scale, torch.Tensor) else None

    def stream_points(self, model, block):
        b = self._block(model, block)
        return b, getattr(b, self.layout_of(b).norm2)

    def time_parts(self, model, block):
        b = self._block(model, block)
        if isinstance(b, DroppedBlock):
            return {}
        L = self.layout_of(b)
        attention = [getattr(b, L.norm1), getattr(b, L.attn)] if not isinstance(b, HetBlock) else (
            [getattr(b, L.norm1)] if b.attn_mode == "ln-residual" else [])
        return {"attention": attention, "mlp": [getattr(b, L.norm2), getattr(b, L.mlp)]}

    def branch_weights(self, model, block, kind):
        b = self._block(model, block)
        L = self.layout_of(b)
        return _linear_weights(getattr(b, L.attn if kind == "attn" else L.mlp))

    # -- cost and facts -----------------------------------------------------------------------
    def attention_geometry(self, module: nn.Module) -> tuple[int, int]:
        """``(heads, head_dim)`` of an attention module (the projection reads ``heads * head_dim``)."""
        heads = int(module.num_heads)
        return heads, int(module.proj.in_features) // heads

    def is_attention(self, module):
        return isinstance(module, self.attention_types)

    @contextlib.contextmanager
    def explicit_attention(self, model):
        """timm's attention modules pick ``F.scaled_dot_product_attention`` by their ``fused_attn`` flag."""
        fused = [m for m in model.modules() if self.is_attention(m) and getattr(m, "fused_attn", False)]
        for m in fused:
            m.fused_attn = False
        try:
            yield model
        finally:
            for m in fused:
                m.fused_attn = True

    def attention_macs(self, module, inputs):
        x = inputs[0]
        heads, head_dim = self.attention_geometry(module)
        tokens = x.shape[-2]
        return attention_matmul_macs(x.numel() // (tokens * x.shape[-1]), heads, tokens, tokens, head_dim)

    def arch(self, model):
        blocks = self.blocks(model)
        live = [b for b in blocks if not isinstance(b, (DroppedBlock, HetBlock))]
        attn = next((getattr(b, self.layout_of(b).attn) for b in live), None)
        mlp = next((m for b in blocks if not isinstance(b, DroppedBlock)
                    for m in [self._mlp(b)] if isinstance(getattr(m, "fc1", None), nn.Linear)), None)
        norm = next((getattr(b, self.layout_of(b).norm2) for b in blocks if not isinstance(b, DroppedBlock)), None)
        embed = getattr(model, "embed_dim", None)
        if not isinstance(embed, int) and norm is not None:
            embed = norm.normalized_shape[0]
        return {
            "depth": len(blocks),
            "embed_dim": int(embed) if embed is not None else None,
            "num_heads": int(getattr(attn, "num_heads", 0)) or None,
            "mlp_hidden": mlp.fc1.out_features if mlp is not None and not self.is_gated(mlp) else None,
        }
