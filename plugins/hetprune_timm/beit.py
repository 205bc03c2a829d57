"""BEiT (``beit_*``): blocks take ``shared_rel_pos_bias=``; LayerScale is the
bare parameters ``gamma_1``/``gamma_2`` (``None`` without LayerScale)."""

from __future__ import annotations

from timm.models.beit import Attention, Beit, Block

from hetprune import ModelSpec
from hetprune.plugin_api import BlockLayout

from .attention import functional_qkv_macs
from .blocks import TimmPreNorm


class TimmBEiT(TimmPreNorm):
    name = "timm-beit"
    description = "timm BEiT (relative position bias, gamma LayerScale)"
    # a tiny model of the family, for the conformance kit (and the family tests)
    example_spec = ModelSpec("beit_base_patch16_224", dict(
        img_size=16, in_chans=1, num_classes=10, patch_size=4, embed_dim=32, depth=3, num_heads=2,
        init_values=0.5))
    model_types = (Beit,)
    block_types = (Block,)
    attention_types = (Attention,)
    layout = BlockLayout(attn_scale="gamma_1", mlp_scale="gamma_2")
    attention_walked = (Block,)   # set_input_size calls blk.attn.set_window_size

    def attention_macs(self, module, inputs):
        return super().attention_macs(module, inputs) + functional_qkv_macs(module, inputs[0])
