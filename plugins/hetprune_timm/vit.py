"""The timm ``VisionTransformer`` family: ViT, DeiT (also distilled), DeiT3,
DINOv2 (also with registers and SwiGLU MLPs), CLIP, FlexiViT, NaFlexViT,
global-pool models, and ``vit_relpos_*``.

Blocks are ``model.blocks``: ``norm1, attn, ls1, drop_path1, norm2, mlp, ls2,
drop_path2`` (LayerScale as ``ls1``/``ls2`` modules). Post-norm and parallel
blocks are refused. The only family with width-pruning support so far.
"""

from __future__ import annotations

from timm.models.vision_transformer import (Attention, Block, ParallelScalingBlock, ParallelThingsBlock,
                                            ResPostBlock, VisionTransformer)
from timm.models.vision_transformer_relpos import (RelPosAttention, RelPosBlock, ResPostRelPosBlock,
                                                   VisionTransformerRelPos)

from hetprune import ModelSpec

from . import mlp as gated
from . import vit_widths
from .blocks import TimmPreNorm

try:  # timm >= 1.0.16
    from timm.models.naflexvit import NaFlexVit
except ImportError:  # pragma: no cover - older timm
    NaFlexVit = VisionTransformer

POST_NORM = "a post-norm block (norm after the residual branch); hetprune needs pre-norm blocks"
PARALLEL = "attention and MLP run in parallel; hetprune's sites assume them in sequence"


class TimmViT(TimmPreNorm):
    name = "timm-vit"
    description = "timm VisionTransformer family (ViT, DeiT, DeiT3, DINOv2, CLIP, FlexiViT, NaFlexViT, relpos)"
    # a tiny model of the family, for the conformance kit (and the family tests)
    example_spec = ModelSpec("vit_tiny_patch16_224", dict(
        img_size=16, in_chans=1, num_classes=10, patch_size=4, embed_dim=32, depth=3, num_heads=2,
        init_values=0.1))
    supports = {"depth": True, "merge": True, "width": True}
    model_types = (VisionTransformer, VisionTransformerRelPos, NaFlexVit)
    block_types = (Block, RelPosBlock)
    attention_types = (Attention, RelPosAttention)
    refused_blocks = {ResPostBlock: POST_NORM, ResPostRelPosBlock: POST_NORM, ParallelScalingBlock: PARALLEL,
                      ParallelThingsBlock: PARALLEL}
    attention_walked = (RelPosBlock,)   # set_input_size reads blk.attn.rel_pos

    def is_gated(self, mlp):
        return gated.is_gated(mlp)

    def ungate(self, mlp):
        return gated.ungate(mlp)

    def read_widths(self, model):
        return vit_widths.read_widths(model)

    def apply_widths(self, model, widths, compute=False, merge_pending=False):
        vit_widths.apply_widths(model, widths, compute=compute, merge_pending=merge_pending)

    def width_info(self, model):
        return vit_widths.width_info(model)

    def kept_channels(self, before, after):
        return vit_widths.kept_channels(before, after)

    def compose_kept(self, first, then):
        return vit_widths.compose_kept(first, then)
