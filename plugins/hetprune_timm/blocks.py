"""What a pruned block of a timm model is, so the model stays a whole timm model.

timm scripts its models, traces them with FX for features, and walks their
blocks to change the input size. `TimmPreNorm` (the base of every timm
adapter here) replaces blocks with hetprune's TorchScript-able `HetBlock` and
`DroppedBlock`, which take the arguments timm's models pass to their blocks.
A dropped block is the identity and would leave no node in an FX graph, so it
is a leaf of timm's FX tracing (its output is a feature level like any
block's). Where a family's ``set_input_size`` reaches every block's attention
(BEiT: ``blk.attn.set_window_size``; the relpos ViTs: ``blk.attn.rel_pos``),
the pruned block carries a `RemovedAttention`, which holds nothing that
depends on the resolution.
"""

from __future__ import annotations

from timm.layers import register_notrace_module
from torch import nn

from hetprune.plugin_api import PreNormAdapter, surgery

register_notrace_module(surgery.DroppedBlock)   # timm's FX tracer keeps modules of these types (and subtypes) as nodes


class RemovedAttention(nn.Module):
    """Stands where a removed attention was, for timm's input-size walks that reach it; never called."""

    rel_pos = None   # the relpos ViTs resize a relative position table here when there is one

    def set_window_size(self, window_size) -> None:
        """BEiT resizes its relative position bias here; a removed attention has none."""


class TimmPreNorm(PreNormAdapter):
    """A timm pre-norm family: TorchScript-able pruned blocks, and a `RemovedAttention` in those whose model
    walks its blocks' attention to change the input size (``attention_walked``: those blocks' types)."""

    attention_walked: tuple = ()

    def attention_removed(self, block, mode):
        return self._walkable(block, surgery.HetBlock(block, self.layout_of(block), mode))

    def dropped(self, block):
        return self._walkable(block, surgery.DroppedBlock())

    def _walkable(self, old: nn.Module, new: nn.Module) -> nn.Module:
        family_type = getattr(old, "replaced_type", None) or type(old)   # a HetBlock replaced a family block
        if issubclass(family_type, self.attention_walked):
            new.attn = RemovedAttention()
        return new
