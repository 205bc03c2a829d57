"""EVA / EVA02 (``eva02_*``) and timm's ``vit_*_rope_*`` (built on the same
``Eva`` model): blocks take ``rope=``; LayerScale is the bare parameters
``gamma_1``/``gamma_2`` (or ``None``); EVA02's MLP is gated (SwiGLU), whose
activation removal removes the gate. Post-norm EVA blocks are refused."""

from __future__ import annotations

from timm.models.eva import Eva, EvaAttention, EvaBlock, EvaBlockPostNorm

from hetprune import ModelSpec
from hetprune.plugin_api import BlockLayout

from . import mlp as gated
from .attention import functional_qkv_macs
from .blocks import TimmPreNorm

try:
    from timm.layers import AttentionRope
except ImportError:  # pragma: no cover - older timm
    AttentionRope = EvaAttention


class TimmEVA(TimmPreNorm):
    name = "timm-eva"
    description = "timm EVA/EVA02 and vit_*_rope_* (rope, gamma LayerScale, SwiGLU MLPs)"
    # a tiny model of the family, for the conformance kit (and the family tests)
    example_spec = ModelSpec("eva02_tiny_patch14_224", dict(
        img_size=16, in_chans=1, num_classes=10, patch_size=4, embed_dim=32, depth=3, num_heads=2))
    model_types = (Eva,)
    block_types = (EvaBlock,)
    attention_types = (EvaAttention, AttentionRope)
    refused_blocks = {EvaBlockPostNorm: "a post-norm block (norm after the residual branch); hetprune needs "
                                        "pre-norm blocks"}
    layout = BlockLayout(attn_scale="gamma_1", mlp_scale="gamma_2")

    def is_gated(self, mlp):
        return gated.is_gated(mlp)

    def ungate(self, mlp):
        return gated.ungate(mlp)

    def attention_macs(self, module, inputs):
        return super().attention_macs(module, inputs) + functional_qkv_macs(module, inputs[0])
