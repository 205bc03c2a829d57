"""Sites: the removable things of a ViT, two per block.

``(i, "attn")`` is the attention sub-block of block ``i`` (its norm, MHSA and
residual branch); ``(i, "act")`` is the activation inside block ``i``'s MLP.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .errors import HetpruneError

KINDS = ("attn", "act")


@dataclass(frozen=True, order=True)
class Site:
    block: int
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise HetpruneError(f"site kind must be one of {KINDS}, got {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.kind}{self.block}"

    @classmethod
    def parse(cls, text: str) -> "Site":
        """``"attn3"`` -> ``Site(3, "attn")``."""
        for kind in KINDS:
            if text.startswith(kind) and text[len(kind):].isdigit():
                return cls(int(text[len(kind):]), kind)
        raise HetpruneError(f"cannot read site {text!r}: write attn<N> or act<N>, e.g. attn3")


def blocks_of(model: nn.Module) -> nn.Sequential:
    """The transformer blocks of a timm VisionTransformer-family model."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)) or len(blocks) == 0:
        raise HetpruneError(
            f"{type(model).__name__} is not a ViT hetprune can read: it has no 'blocks' "
            "sequence of transformer blocks (expected a timm VisionTransformer-family model)"
        )
    for i, block in enumerate(blocks):
        kind = type(block).__name__
        if kind == "DroppedBlock":  # hetprune.surgery's dropped block: nothing left to check
            continue
        if "ResPost" in kind or "PostNorm" in kind:
            # same child names as a pre-norm block, but norm after the branch: the surgery would be wrong
            raise HetpruneError(
                f"{type(model).__name__}: block {i} ({kind}) is a post-norm block; hetprune needs pre-norm "
                "blocks (x + f(norm(x))) with norm1, attn, norm2 and mlp(fc1, act, fc2)"
            )
        needed = ("norm2", "mlp") if kind == "HetBlock" else ("norm1", "attn", "norm2", "mlp")
        missing = [n for n in needed if not hasattr(block, n)]
        mlp = getattr(block, "mlp", None)
        if mlp is not None and type(mlp).__name__ != "MergedMlp" and not all(hasattr(mlp, n) for n in ("fc1", "act", "fc2")):
            missing.append("mlp.fc1/act/fc2 (a plain two-layer MLP; gated MLPs are not supported)")
        if missing:
            raise HetpruneError(
                f"{type(model).__name__}: block {i} ({type(block).__name__}) lacks {', '.join(missing)}; "
                "hetprune needs pre-norm blocks with norm1, attn, norm2 and mlp(fc1, act, fc2)"
            )
    return blocks


def depth(model: nn.Module) -> int:
    return len(blocks_of(model))


def sites(model: nn.Module, kind: str | None = None, present_only: bool = True) -> list[Site]:
    """Every removable site of ``model`` (still present ones unless ``present_only=False``)."""
    from .surgery import site_removed  # surgery imports this module

    blocks = blocks_of(model)
    kinds = KINDS if kind is None else (kind,)
    found = []
    for i in range(len(blocks)):
        for k in kinds:
            site = Site(i, k)
            if present_only and site_removed(model, site):
                continue
            found.append(site)
    return found


def check_site(model: nn.Module, site: Site) -> None:
    n = depth(model)
    if not 0 <= site.block < n:
        raise HetpruneError(f"block index {site.block} of site {site} is out of range: the model has blocks 0..{n - 1}")
