"""What a pruned block of a timm model is, so the model stays a whole timm model.

timm scripts its models. `TimmPreNorm` (the base of every timm adapter here)
replaces blocks with hetprune's TorchScript-able `HetBlock` and
`DroppedBlock`, which take the arguments timm's models pass to their blocks.
"""

from __future__ import annotations

from hetprune.plugin_api import DroppedBlock, HetBlock, PreNormAdapter


class TimmPreNorm(PreNormAdapter):
    """A timm pre-norm family: TorchScript-able pruned blocks."""

    def attention_removed(self, block, mode):
        return HetBlock(block, self.layout_of(block), mode)

    def dropped(self, block):
        return DroppedBlock()
