"""Swin Transformer v1 (``swin_*``): no ``model.blocks``; the blocks live in
``model.layers[i].blocks`` and are numbered across stages (stage 0's first
block is block 0). Attention is over windows: its MACs are counted per window
(the attention module sees ``windows x tokens per window``). The residual
stream is ``(B, H, W, C)``; norms and MLPs act on the last dimension, so a
block without attention is ``x + mlp(norm2(x))`` in that layout too.

Swin v2 (``swinv2_*``) is post-norm and a different model class: no adapter
matches it, and the error says which families are supported.
"""

from __future__ import annotations

from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock, WindowAttention

from hetprune import ModelSpec
from hetprune.plugin_api import BlockLayout

from .blocks import TimmPreNorm


class TimmSwin(TimmPreNorm):
    name = "timm-swin"
    description = "timm Swin Transformer v1 (blocks across stages, window attention)"
    # a tiny model of the family, for the conformance kit (and the family tests)
    example_spec = ModelSpec("swin_tiny_patch4_window7_224", dict(
        img_size=16, in_chans=1, num_classes=10, patch_size=2, window_size=4, embed_dim=16, depths=(2, 2),
        num_heads=(1, 2)))
    model_types = (SwinTransformer,)
    block_types = (SwinTransformerBlock,)
    attention_types = (WindowAttention,)
    layout = BlockLayout(attn_scale=None, mlp_scale=None)

    def block_slots(self, model):
        return [(stage.blocks, str(j)) for stage in model.layers for j in range(len(stage.blocks))]

    def arch(self, model):
        facts = super().arch(model)
        facts["stage_depths"] = [len(stage.blocks) for stage in model.layers]
        return facts
