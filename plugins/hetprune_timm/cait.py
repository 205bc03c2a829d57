"""CaiT (``cait_*``): self-attention blocks ``model.blocks`` are the sites;
the class-attention blocks ``model.blocks_token_only`` (forward ``(x, x_cls)``)
are not. LayerScale is the bare parameters ``gamma_1``/``gamma_2``; one
``drop_path`` serves both branches.

The class token enters only in the class-attention blocks, so every
self-attention site may go.
"""

from __future__ import annotations

from timm.models.cait import Cait, ClassAttn, LayerScaleBlock, TalkingHeadAttn

from hetprune import ModelSpec
from hetprune.plugin_api import BlockLayout, adapters

from .blocks import TimmPreNorm


class TimmCaiT(TimmPreNorm):
    name = "timm-cait"
    description = "timm CaiT (self-attention blocks; class-attention blocks are kept)"
    # a tiny model of the family, for the conformance kit (and the family tests)
    example_spec = ModelSpec("cait_xxs24_224", dict(
        img_size=16, in_chans=1, num_classes=10, patch_size=4, embed_dim=32, depth=3, num_heads=2,
        depth_token_only=1, init_values=0.5))
    model_types = (Cait,)
    block_types = (LayerScaleBlock,)
    attention_types = (TalkingHeadAttn, ClassAttn)
    layout = BlockLayout(attn_scale="gamma_1", mlp_scale="gamma_2", drop_path2="drop_path", drop_path1="drop_path")

    def max_removals(self, model):
        n = len(model.blocks)
        return {"attn": n, "act": n}

    def attention_macs(self, module, inputs):
        if isinstance(module, ClassAttn):  # one query (the class token) against every token
            x = inputs[0]
            heads = int(module.num_heads)
            return adapters.attention_matmul_macs(x.shape[0], heads, 1, x.shape[1], module.q.out_features // heads)
        return super().attention_macs(module, inputs)
