"""Sites: the removable things of a ViT, two per block.

``(i, "attn")`` is the attention sub-block of block ``i`` (its norm, MHSA and
residual branch); ``(i, "act")`` is the activation inside block ``i``'s MLP
(for a gated MLP: its gate). Blocks are numbered in the adapter's global order
(for Swin: across stages).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .adapters import adapter_for
from ..core.errors import HetpruneError

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


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of ``model``, in the global order of its sites."""
    return adapter_for(model).blocks(model)


def depth(model: nn.Module) -> int:
    return len(adapter_for(model).block_slots(model))


def sites(model: nn.Module, kind: str | None = None, present_only: bool = True) -> list[Site]:
    """Every removable site of ``model`` (still present ones unless ``present_only=False``)."""
    adapter = adapter_for(model)
    kinds = KINDS if kind is None else (kind,)
    found = []
    for i in range(len(adapter.block_slots(model))):
        for k in kinds:
            if present_only and adapter.removed(model, i, k):
                continue
            found.append(Site(i, k))
    return found


def check_site(model: nn.Module, site: Site) -> None:
    n = depth(model)
    if not 0 <= site.block < n:
        raise HetpruneError(f"block index {site.block} of site {site} is out of range: the model has blocks 0..{n - 1}")
